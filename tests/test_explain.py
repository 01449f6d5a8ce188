"""`moec explain`: text, JSON (structure pinned), Graphviz dot and Mermaid (well-formed), the
ceilings on the command line, `--set`, errors, and the support matrix (`--matrix`).

Runs in-process through `moec.cli.main`. What is importable is pinned (triton only), so the
output does not depend on whether this machine has deep_gemm.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from moec.cli import main
from moec.errors import MoecError
from moec.plan import Environment, make_plan
from moec.plan import export as export_module
from moec.spec import parse_spec

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
V3_FP8 = str(EXAMPLES / "deepseek-v3-fp8.toml")
PLAIN = Environment(frozenset({"triton"}))
FULL = Environment(frozenset({"triton", "deep_gemm", "deep_ep"}))


@pytest.fixture(autouse=True)
def pinned_environment(monkeypatch):
    monkeypatch.setattr(Environment, "detect", classmethod(lambda cls: PLAIN))


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def explain_json(capsys, *argv: str) -> dict:
    code, out, err = run(capsys, "explain", *argv, "--format", "json")
    assert code == 0, err
    return json.loads(out)


# --- text ---------------------------------------------------------------------------------


def test_text_shows_stages_types_decisions_and_cost(capsys):
    data = explain_json(capsys, V3_FP8, "--tokens", "1,64,4096")
    code, text, _ = run(capsys, "explain", V3_FP8, "--tokens", "1,64,4096")
    assert code == 0
    lines = text.splitlines()
    assert lines[0].startswith("moec ") and "deepseek_v3_fp8" in lines[0]
    assert "target: cuda sm90 bfloat16, max_num_tokens 16384" in text

    # stages in order, each with kind and backend, host sync and graph safety
    listed = re.findall(r"^\s+\d+\. (\S+) \[(\S+), (\S+)\] \((.*)\)$", text, re.M)
    assert [(n, k, b) for n, k, b, _ in listed] == [
        (s["name"], s["kind"], s["backend"]) for s in data["stages"]
    ]
    assert [n for n, *_ in listed][:3] == ["input", "select", "dispatch"]  # the router fused in
    for (_, _, _, flags), stage in zip(listed, data["stages"], strict=True):
        assert ("syncs host" if stage["syncs_host"] else "no host sync") in flags
        assert ("graph-safe" if stage["graph_safe"] else "not graph-safe") in flags
        if stage["fused"]:
            assert "fused " + " + ".join(stage["fused"]) in flags

    # the type of every input and output edge
    for stage in data["stages"]:
        for item in stage["inputs"]:
            assert re.search(
                rf"in\s+{re.escape(item['as'])}\s+{re.escape(item['type']['label'])}\s+<- "
                rf"{re.escape(item['from'])}$",
                text,
                re.M,
            ), item
        for item in stage["outputs"]:
            assert re.search(
                rf"out\s+{re.escape(item['tensor'])}\s+{re.escape(item['type']['label'])}$",
                text,
                re.M,
            )
    assert "out  a             e4m3[T, H] + scale(1x128 fp32 K-major)" in text  # copy-free
    assert "e4m3[M, I] contiguous-grouped + scale(1x128 fp32 K-major)" in text

    # every decision with its reason
    for decision in data["decisions"]:
        assert f"  {decision['what']} = {decision['choice']}: {decision['reason']}" in lines
    assert "CUDA graph = yes" in text

    # per token count: totals, peak memory, and a table of bytes, FLOPs, floor per stage
    assert "cost on H200 (4274 GB/s, 688 TFLOP/s bf16, 1414 TFLOP/s fp8" in text
    for row in data["cost"]:
        header = next(line for line in lines if line.startswith(f"  T = {row['tokens']}:"))
        assert f"floor {row['floor_ms']:.4f} ms" in header
        assert "peak " in header and "experts hit" in header
        for stage in row["stages"]:
            assert re.search(
                rf"^\s+{re.escape(stage['stage'])}\s+\S+ \S*B\s+\S+( \S+)?\s+"
                rf"{stage['floor_ms']:.4f}$",
                text,
                re.M,
            ), stage
    assert text.count("stage        ") == 3
    assert "T = 1: 408.03 MB" in text  # 9 experts of 44 MB (the shared one fused) + 11 MB router
    assert "9.0 experts hit" in text  # 8 routed + the fused shared expert


def test_text_default_tokens(capsys):
    code, text, _ = run(capsys, "explain", V3_FP8)
    assert code == 0
    assert [int(t) for t in re.findall(r"^  T = (\d+):", text, re.M)] == [1, 64, 4096]


def test_tokens_past_max_num_tokens_are_marked(capsys):
    """A cost row the package's forward would refuse says so, and how to build one that runs."""
    code, text, _ = run(capsys, "explain", V3_FP8, "--tokens", "16384,16385")
    assert code == 0
    assert text.count("more than target.max_num_tokens = 16384") == 1
    assert "refuses 16385 tokens; --set target.max_num_tokens=16385 builds one sized" in text
    rows = explain_json(capsys, V3_FP8, "--tokens", "16384,16385")["cost"]
    assert [row["beyond_max_num_tokens"] for row in rows] == [False, True]
    code, text, _ = run(
        capsys, "explain", V3_FP8, "--tokens", "16385", "--set", "target.max_num_tokens=16385"
    )
    assert code == 0 and "more than target.max_num_tokens" not in text


def test_text_of_every_example(capsys):
    for path in sorted(EXAMPLES.glob("*.toml")):
        code, text, err = run(capsys, "explain", str(path), "--tokens", "1")
        assert code == 0, (path, err)
        assert "decisions" in text and "T = 1:" in text


# --- json ---------------------------------------------------------------------------------

TOP_KEYS = {
    "placement",
    "moec_version",
    "spec",
    "target",
    "device",
    "choices",
    "stages",
    "decisions",
    "cost",
    "above",
}
STAGE_KEYS = {
    "name",
    "kind",
    "backend",
    "inputs",
    "outputs",
    "weights",
    "scratch",
    "workspace",
    "choices",
    "fused",
    "syncs_host",
    "graph_safe",
    "note",
}
TYPE_KEYS = {"dtype", "shape", "layout", "label"}
SCALE_KEYS = {"granularity", "dtype", "major", "tma_aligned", "pow2_scales"}
COST_KEYS = {
    "tokens",
    "bytes",
    "flops",
    "floor_ms",
    "peak_bytes",
    "experts_hit",
    "beyond_max_num_tokens",
    "stages",
}
COST_STAGE_KEYS = {"stage", "bytes", "flops", "compute", "floor_ms", "link_bytes", "nic_bytes"}


def _check_type(value):
    assert set(value) in (TYPE_KEYS, TYPE_KEYS | {"scale"}, TYPE_KEYS | {"record"})
    assert isinstance(value["dtype"], str) and isinstance(value["layout"], str)
    assert isinstance(value["shape"], list) and all(isinstance(d, str) for d in value["shape"])
    if "scale" in value:
        assert set(value["scale"]) == SCALE_KEYS
        assert value["scale"]["dtype"] in ("float32", "ue8m0", "ue8m0x4")
        assert value["scale"]["major"] in ("K", "MN")


@pytest.mark.parametrize(
    "name", ["deepseek-v3-fp8.toml", "deepseek-v3-ep2-all2all.toml", "tiny-cpu-bf16.toml"]
)
def test_json_structure_is_pinned(capsys, name):
    data = explain_json(capsys, str(EXAMPLES / name), "--tokens", "1,64")
    assert set(data) == TOP_KEYS
    assert set(data["spec"]) == {"name", "hash"}
    assert re.fullmatch(r"[0-9a-f]{64}", data["spec"]["hash"])
    assert set(data["target"]) == {"device", "arch", "dtype", "max_num_tokens", "gpu"}
    assert set(data["device"]) == {
        "name",
        "bandwidth_gbs",
        "bf16_tflops",
        "fp8_tflops",
        "fp32_tflops",
        "memory_gib",
        "measured",
        "link_gbs",
        "nic_gbs",
    }
    facts = data["choices"]
    for key in ("gemm_backend", "layout", "dispatch_backend", "requires", "missing", "dims"):
        assert key in facts
    assert facts["hash"] == data["spec"]["hash"]

    assert data["stages"][0]["name"] == "input" and data["stages"][-1]["name"] == "output"
    names = {s["name"] for s in data["stages"]}
    for stage in data["stages"]:
        assert set(stage) == STAGE_KEYS
        assert isinstance(stage["choices"], dict) and isinstance(stage["fused"], list)
        assert isinstance(stage["syncs_host"], bool) and isinstance(stage["graph_safe"], bool)
        for item in stage["inputs"]:
            assert set(item) == {"tensor", "from", "as", "type"}
            assert item["from"] in names
            _check_type(item["type"])
        for item in stage["outputs"] + stage["weights"] + stage["scratch"] + stage["workspace"]:
            assert set(item) == {"tensor", "type"}
            _check_type(item["type"])

    assert data["decisions"]
    for decision in data["decisions"]:
        assert set(decision) == {"what", "choice", "reason"}
        assert all(isinstance(v, str) and v for v in decision.values())

    assert [row["tokens"] for row in data["cost"]] == [1, 64]
    for row in data["cost"]:
        assert set(row) == COST_KEYS
        assert [s["stage"] for s in row["stages"]] == [
            s["name"] for s in data["stages"] if s["kind"] not in ("input", "output")
        ]
        for stage in row["stages"]:
            assert set(stage) == COST_STAGE_KEYS
        assert row["bytes"] == pytest.approx(sum(s["bytes"] for s in row["stages"]))
        assert row["flops"] == pytest.approx(sum(s["flops"] for s in row["stages"]))


def test_json_keys_are_documented_in_export_docstring():
    doc = export_module.__doc__
    for key in TOP_KEYS | STAGE_KEYS | COST_KEYS | COST_STAGE_KEYS:
        assert re.search(rf"\b{key}\b", doc), key


def test_json_matches_the_plan(capsys):
    data = explain_json(capsys, V3_FP8, "--tokens", "1")
    plan = make_plan(parse_spec((EXAMPLES / "deepseek-v3-fp8.toml").read_text()).spec, PLAIN)
    assert [s["name"] for s in data["stages"]] == [s.name for s in plan.order()]
    assert [(d["what"], d["choice"], d["reason"]) for d in data["decisions"]] == [
        (d.what, d.choice, d.reason) for d in plan.decisions
    ]


# --- ceilings, --set, errors --------------------------------------------------------------


def test_ceilings_on_the_command_line(capsys):
    base = explain_json(capsys, V3_FP8, "--tokens", "4096")
    changed = explain_json(
        capsys,
        V3_FP8,
        "--tokens",
        "4096",
        "--bandwidth",
        "2137",
        "--bf16-tflops",
        "344",
        "--fp8-tflops",
        "707",
    )
    assert base["device"]["measured"] is True
    assert changed["device"] == {
        **base["device"],
        "bandwidth_gbs": 2137.0,
        "bf16_tflops": 344.0,
        "fp8_tflops": 707.0,
        "measured": False,
    }
    # halving every ceiling but fp32 doubles the floor of every stage that does not use fp32
    for before, after in zip(base["cost"][0]["stages"], changed["cost"][0]["stages"], strict=True):
        if before["compute"] != "fp32":
            assert after["floor_ms"] == pytest.approx(2 * before["floor_ms"])
        assert after["bytes"] == before["bytes"]
    code, text, _ = run(capsys, "explain", V3_FP8, "--bandwidth", "2137")
    assert "cost on H200 (2137 GB/s" in text and "the ceilings given" in text
    code, text, _ = run(capsys, "explain", V3_FP8, "--bandwidth", "1e-3")
    assert code == 0 and "cost on H200 (0.001 GB/s" in text  # not 0


def test_set_overrides_a_spec_key(capsys):
    data = explain_json(capsys, V3_FP8, "--set", "quant.scheme=bf16", "--tokens", "1")
    whats = {d["what"] for d in data["decisions"]}
    assert "fuse activation + quantize" not in whats
    gemm = next(s for s in data["stages"] if s["name"] == "gemm_gate_up")
    assert gemm["choices"]["format"] == "bf16"
    data = explain_json(capsys, V3_FP8, "--set", "target.max_num_tokens=256", "--tokens", "1")
    assert next(d for d in data["decisions"] if d["what"] == "layout")["choice"] == "masked"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["explain"], "SPEC: is required unless --matrix is given"),
        (["explain", V3_FP8, "--tokens", "1,x"], '--tokens = "1,x": expects token counts'),
        (["explain", V3_FP8, "--tokens", "-1"], "expects token counts"),
        (["explain", V3_FP8, "--set", "quant.scheme=fp9"], "quant.scheme"),
        (["explain", str(EXAMPLES / "missing.toml")], "cannot read the spec"),
    ],
)
def test_errors_exit_2_with_a_message(capsys, argv, message):
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert out == ""
    assert message in err
    assert "Traceback" not in err


def test_unknown_format_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["explain", V3_FP8, "--format", "yaml"])
    assert exit_info.value.code == 2


# --- dot and mermaid ----------------------------------------------------------------------

DOT_STRING = r'"(?:[^"\\]|\\.)*"'
DOT_NODE = re.compile(rf"^  ({DOT_STRING}) \[label=({DOT_STRING})\];$")
DOT_EDGE = re.compile(rf"^  ({DOT_STRING}) -> ({DOT_STRING}) \[label=({DOT_STRING})\];$")


def parse_dot(text: str) -> tuple[list[str], list[tuple[str, str, str]]]:
    """A structural parse of the subset of DOT that explain writes; fails on anything else."""
    lines = text.splitlines()
    assert re.fullmatch(rf"digraph {DOT_STRING} \{{", lines[0]), lines[0]
    assert lines[-1] == "}"
    nodes, edges = [], []
    for line in lines[1:-1]:
        if line in ("  rankdir=TB;", "  node [shape=box];", '  comment="written by moec explain";'):
            continue
        if match := DOT_NODE.match(line):
            nodes.append(json.loads(match.group(1)))
            continue
        match = DOT_EDGE.match(line)
        assert match, f"not a DOT statement: {line!r}"
        edges.append(tuple(json.loads(group) for group in match.groups()))
    assert text.count("{") == text.count("}") == 1
    return nodes, edges


@pytest.mark.parametrize(
    ("name", "env"),
    [("deepseek-v3-fp8.toml", PLAIN), ("deepseek-v3-fp8.toml", FULL), ("mxfp8-sm100.toml", FULL)],
)
def test_dot_is_well_formed(capsys, monkeypatch, name, env):
    """Every stage a node, every typed edge an arrow (deep_gemm masked: with its converters)."""
    monkeypatch.setattr(Environment, "detect", classmethod(lambda cls: env))
    sets = ["--set", "experts.layout=masked"] if env is FULL else []
    if env is FULL and name == "deepseek-v3-fp8.toml":  # auto would split at T=1024
        sets += ["--set", "experts.gemm_backend=deep_gemm"]
    data = explain_json(capsys, str(EXAMPLES / name), *sets)
    code, text, _ = run(capsys, "explain", str(EXAMPLES / name), "--format", "dot", *sets)
    assert code == 0
    nodes, edges = parse_dot(text)
    assert len(nodes) == len(set(nodes))
    assert nodes == [s["name"] for s in data["stages"]]
    expected_edges = [
        (item["from"], stage["name"], f"{item['tensor']}: {item['type']['label']}")
        for stage in data["stages"]
        for item in stage["inputs"]
    ]
    assert edges == expected_edges
    for source, target, _ in edges:
        assert source in nodes and target in nodes
    # node labels break lines with DOT's \n escape (not a literal backslash)
    assert '[label="select\\nselect / triton"]' in text
    assert "\\\\n" not in text
    if env is FULL and name == "deepseek-v3-fp8.toml":
        assert any("fp32 MN-major TMA-aligned" in label for *_, label in edges)
    if shutil.which("dot"):
        done = subprocess.run(["dot", "-Tsvg"], input=text, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr


MERMAID_ID = r"[A-Za-z_][A-Za-z0-9_]*"
MERMAID_NODE = re.compile(rf'^  ({MERMAID_ID})\["([^"]*)"\]$')
MERMAID_EDGE = re.compile(rf'^  ({MERMAID_ID}) -->\|"([^"|]*)"\| ({MERMAID_ID})$')


def test_mermaid_is_well_formed(capsys, monkeypatch):
    monkeypatch.setattr(Environment, "detect", classmethod(lambda cls: FULL))
    sets = ["--set", "experts.layout=masked", "--set", "experts.gemm_backend=deep_gemm"]
    data = explain_json(capsys, V3_FP8, *sets)
    code, text, _ = run(capsys, "explain", V3_FP8, "--format", "mermaid", *sets)
    assert code == 0
    lines = text.splitlines()
    assert lines[:2] == ["flowchart TD", "  %% written by moec explain"]
    nodes, edges = [], []
    for line in lines[2:]:
        if match := MERMAID_NODE.match(line):
            nodes.append(match.group(1))
            assert match.group(2).startswith(match.group(1) + "<br/>")
            continue
        match = MERMAID_EDGE.match(line)
        assert match, f"not a Mermaid statement: {line!r}"
        edges.append((match.group(1), match.group(3), match.group(2)))
    assert nodes == [s["name"] for s in data["stages"]]
    assert "end" not in nodes  # a Mermaid keyword
    for source, target, _ in edges:
        assert source in nodes and target in nodes
    assert len(edges) == sum(len(s["inputs"]) for s in data["stages"])
    assert ("dispatch", "convert_a_for_gemm_gate_up") in [(s, t) for s, t, _ in edges]
    labels = [label for *_, label in edges]
    assert "a: e4m3[E, max_m, H] masked-grouped + scale(1x128 fp32 K-major)" in labels


# --- support matrix -----------------------------------------------------------------------


def parse_matrix(text: str) -> tuple[list[list[str]], list[list[str]]]:
    tables, current = [], None
    for line in text.splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            if current is None:
                current = []
                tables.append(current)
            current.append(cells)
        else:
            current = None
    assert len(tables) == 2
    for table in tables:
        assert all(re.fullmatch(r"-+", c) for c in table[1])
        assert len({len(row) for row in table}) == 1
    return tables[0], tables[1]


def test_matrix_is_the_rules(capsys):
    from moec.plan.matrix import TARGETS, support_matrix

    code, text, _ = run(capsys, "explain", "--matrix")
    assert code == 0
    kernels, dispatch = parse_matrix(text)
    assert kernels[0] == ["gemm backend", "scheme", "activation", *TARGETS]
    assert dispatch[0] == ["dispatch", "layout", *TARGETS]
    rows = support_matrix()
    assert len(kernels) - 2 == len(rows["kernels"]) == 3 * 5 * 4
    assert len(dispatch) - 2 == len(rows["dispatch"]) == 4 * 3
    for line, row in zip(kernels[2:], rows["kernels"], strict=True):
        assert line[:3] == [row["gemm_backend"], row["scheme"], row["activation"]]
        assert line[3:] == [", ".join(row["targets"][t]) or "ok" for t in TARGETS]
    for line, row in zip(dispatch[2:], rows["dispatch"], strict=True):
        assert line[:2] == [row["dispatch"], row["layout"]]
        assert line[2:] == [", ".join(row["targets"][t]) or "ok" for t in TARGETS]


def _spec_text(target: str, quant: str, experts: str, extra: str = "") -> str:
    where = 'device = "cpu"' if target == "cpu" else f'device = "cuda"\narch = "{target}"'
    return f"""
name = "cell"
[model]
hidden_size = 7168
moe_intermediate_size = 2048
n_routed_experts = 256
num_experts_per_tok = 8
n_shared_experts = 1
[router]
scoring_func = "sigmoid"
topk_method = "noaux_tc"
n_group = 8
topk_group = 4
[quant]
{quant}
[experts]
{experts}
[target]
{where}
max_num_tokens = 128
{extra}
"""


def _rules_rejecting(text: str) -> list[str]:
    """What rejects a spec written by hand: its rules, else its plan's renderer check (on a
    machine with every optional package)."""
    try:
        loaded = parse_spec(text)
        make_plan(loaded.spec, FULL)
    except MoecError as error:
        return sorted({p.rule for p in error.problems})
    return []


@pytest.mark.parametrize(
    ("target", "quant", "experts", "extra", "cell"),
    [
        ("sm90", 'scheme = "fp8_block"', 'gemm_backend = "deep_gemm"', "", ("kernels", 0)),
        ("sm100", 'scheme = "fp8_block"', 'gemm_backend = "deep_gemm"', "", ("kernels", 0)),
        ("sm100", 'scheme = "mxfp8"', 'gemm_backend = "deep_gemm"', "", ("kernels", 0)),
        ("sm80", 'scheme = "fp8_block"', 'gemm_backend = "triton"', "", ("kernels", 0)),
        ("cpu", 'scheme = "mxfp4"', 'gemm_backend = "torch"', "", ("kernels", 0)),
        (
            "sm90",
            'scheme = "bf16"',
            'gemm_backend = "deep_gemm"',
            '[activation]\nkind = "situ"\nbeta = 1.0\nlinear_beta = 1.0',
            ("kernels", 3),
        ),
        (
            "sm90",
            'scheme = "fp8_block"',
            'layout = "contiguous"',
            '[parallel]\ndispatch = "deepep_low_latency"\nep_size = 8\nmax_tokens_per_rank = 128',
            ("dispatch", None),
        ),
        (
            "sm90",
            'scheme = "fp8_block"',
            'layout = "masked"',
            '[parallel]\ndispatch = "deepep_normal"\nep_size = 8',
            ("dispatch", None),
        ),
    ],
)
def test_matrix_cells_agree_with_specs_written_by_hand(capsys, target, quant, experts, extra, cell):
    from moec.plan.matrix import TARGETS

    if "mxfp4" in quant:
        quant += '\ncheckpoint = "quantized"'
    rejected = _rules_rejecting(_spec_text(target, quant, experts, extra))
    _, text, _ = run(capsys, "explain", "--matrix")
    kernels, dispatch = parse_matrix(text)
    column = 3 + TARGETS.index(target)
    if cell[0] == "kernels":
        backend = re.search(r'gemm_backend = "(\w+)"', experts).group(1)
        scheme = re.search(r'scheme = "(\w+)"', quant).group(1)
        activation = ("silu", "silu_clamped", "oai_swiglu", "situ")[cell[1]]
        (row,) = [r for r in kernels[2:] if r[:3] == [backend, scheme, activation]]
    else:
        kind = re.search(r'dispatch = "(\w+)"', extra).group(1)
        layout = re.search(r'layout = "(\w+)"', experts).group(1)
        (row,) = [r for r in dispatch[2:] if r[:2] == [kind, layout]]
        column -= 1
    assert row[column] == (", ".join(rejected) or "ok")


def test_every_supported_combination_plans():
    """Each `ok` cell of the matrix is a spec the planner turns into a consistent plan."""
    from moec.plan.matrix import ACTIVATIONS, _base, support_matrix
    from moec.spec.models import Spec
    from moec.spec.normalize import normalize

    count = 0
    for row in support_matrix()["kernels"]:
        for target, rejected in row["targets"].items():
            if rejected:
                continue
            data = _base(target)
            data["quant"] = {"scheme": row["scheme"]}
            if row["scheme"] == "mxfp4":
                data["quant"]["checkpoint"] = "quantized"
            data["activation"] = ACTIVATIONS[row["activation"]]
            data["experts"] = {"gemm_backend": row["gemm_backend"]}
            plan = make_plan(normalize(Spec.model_validate(data)), FULL)
            assert plan.backends.gemm == row["gemm_backend"]
            for stage in plan.order():
                for _, edge in plan.inputs(stage.name):
                    wanted = stage.accepts.get(edge.input)
                    assert wanted is None or wanted == edge.type
            count += 1
    assert count > 150


def test_explain_shows_both_sides_of_a_gemm_split(capsys, monkeypatch):
    """deep_gemm installed, gemm_backend auto: the plan up to the split, then the stages and
    decisions that differ above it; the cost past the split is the cost of the plan above."""
    monkeypatch.setattr(Environment, "detect", classmethod(lambda cls: FULL))
    data = explain_json(capsys, V3_FP8, "--tokens", "1024,4096")
    above = data["above"]
    assert above["up_to"] == 1024 and above["gemm_backend"] == "deep_gemm"
    assert {s["name"] for s in above["stages"]} == {
        "dispatch",
        "gemm_gate_up",
        "activation",
        "gemm_down",
    }
    assert {d["what"] for d in above["decisions"]} >= {"gemm_backend", "contiguous row padding"}
    code, text, _ = run(capsys, "explain", V3_FP8, "--tokens", "1024,4096")
    assert code == 0
    assert "gemm_backend = triton up to T=1024, deep_gemm above: auto, per token bucket" in text
    assert "stages above T = 1024 (deep_gemm GEMMs), where they differ" in text
    assert "decisions above T = 1024, where they differ" in text
    assert "gemm_gate_up [gemm, deep_gemm]" in text and "gemm_gate_up [gemm, triton]" in text


def test_dot_and_mermaid_draw_both_sides_of_a_gemm_split(capsys, monkeypatch):
    """The stages that differ above the split are a dashed cluster of their own nodes, fed by
    the shared stages and feeding the shared combine."""
    monkeypatch.setattr(Environment, "detect", classmethod(lambda cls: FULL))
    code, text, _ = run(capsys, "explain", V3_FP8, "--format", "dot")
    assert code == 0
    assert "subgraph cluster_above {" in text and 'label="T > 1024: deep_gemm GEMMs"' in text
    assert '"gemm_gate_up (T > 1024)" [label="gemm_gate_up\\ngemm / deep_gemm"];' in text
    assert '"select" -> "dispatch (T > 1024)"' in text
    assert '"gemm_down (T > 1024)" -> "combine"' in text
    assert '"gemm_down" -> "combine"' in text  # the side up to the split, as before
    if shutil.which("dot"):
        done = subprocess.run(["dot", "-Tsvg"], input=text, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
    code, text, _ = run(capsys, "explain", V3_FP8, "--format", "mermaid")
    assert code == 0
    lines = text.splitlines()
    assert '  subgraph above["T > 1024: deep_gemm GEMMs"]' in lines
    assert '    gemm_down_above["gemm_down<br/>gemm / deep_gemm"]' in lines
    defined = {m.group(1) for line in lines if (m := re.match(rf"^ *({MERMAID_ID})\[", line))}
    arrows = [re.match(rf"^  ({MERMAID_ID}) -\.?->?\|", line) for line in lines]
    assert all(a.group(1) in defined for a in arrows if a)
    assert any(
        line.startswith("  gemm_down_above -.->") and line.endswith(" combine") for line in lines
    )


# --- explain -o: replaces only its own earlier output ---------------------------------------


@pytest.mark.parametrize("fmt", ["text", "json", "dot", "mermaid", "svg"])
def test_out_replaces_its_own_output_and_nothing_else(capsys, tmp_path, fmt):
    spec = tmp_path / "spec.toml"
    spec.write_text((EXAMPLES / "tiny-cpu.toml").read_text())
    out = tmp_path / f"plan.{fmt}"
    for _ in range(2):  # written, then replaced
        assert run(capsys, "explain", str(spec), "--format", fmt, "-o", str(out))[0] == 0
    user = tmp_path / f"mine.{fmt}"
    user.write_text("a user's file\n")
    link = tmp_path / f"link.{fmt}"
    link.symlink_to(out)
    for target, says in [
        (spec, "exists and was not written by moec"),
        (user, "exists and was not written by moec"),
        (link, "is a symbolic link"),
        (tmp_path, "is a folder"),
    ]:
        before = target.read_bytes() if target.is_file() else None
        code, _, err = run(capsys, "explain", str(spec), "--format", fmt, "-o", str(target))
        assert code == 2 and says in err and str(target) in err and "Traceback" not in err
        if before is not None:
            assert target.read_bytes() == before
    assert user.read_text() == "a user's file\n"


def test_a_png_is_marked_as_explains(tmp_path):
    """The png (from Graphviz) carries a tEXt chunk that explain -o recognizes."""
    import struct
    import zlib

    from moec.explain import is_explain_output
    from moec.picture import _marked_png

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    header = struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0)
    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IEND", b"")
    marked = _marked_png(png)
    assert not is_explain_output(png) and is_explain_output(marked)
    body = marked[33 + 4 : 33 + 4 + 4 + 32]  # the new chunk's type and data
    assert marked[33 + 4 + 4 + 32 : 33 + 4 + 4 + 32 + 4] == struct.pack(">I", zlib.crc32(body))


def test_flops_always_carry_a_unit(capsys):
    """Below 1 MF the cost table printed a bare count (991232): now kF, or F."""
    code, text, _ = run(capsys, "explain", str(EXAMPLES / "tiny-cpu.toml"), "--tokens", "1")
    row = next(line for line in text.splitlines() if line.startswith("  T = 1:"))
    assert re.search(r", \d+\.\d kF, floor", row), row
    select = next(line for line in text.splitlines() if line.strip().startswith("select "))
    assert " 0 F " in select


@pytest.mark.parametrize("fmt", ["dot", "mermaid", "svg"])
def test_a_page_quoting_the_mark_is_the_users(tmp_path, capsys, fmt):
    """explain -o recognizes its pictures by the mark where it puts it, not by the phrase
    anywhere: a user's notes quoting "written by moec explain" are left as they are, while
    explain's own earlier picture is replaced."""
    spec = str(EXAMPLES / "tiny-cpu.toml")
    notes = tmp_path / f"notes.{fmt}"
    text = "# My notes\n\nThe diagram below was written by moec explain; my text follows.\n"
    notes.write_text(text)
    assert main(["explain", spec, "--format", fmt, "-o", str(notes)]) == 2
    assert "was not written by moec" in capsys.readouterr().err
    assert notes.read_text() == text
    ours = tmp_path / f"plan.{fmt}"
    assert main(["explain", spec, "--format", fmt, "-o", str(ours)]) == 0
    assert main(["explain", spec, "--format", fmt, "-o", str(ours), "--tokens", "4"]) == 0
