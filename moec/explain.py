"""`moec explain`: the plan printed as text, JSON, Graphviz dot or Mermaid, drawn as SVG or PNG
(moec/picture.py), and the support matrix. Renders only; every value comes from the plan or the
rules.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

from moec import picture
from moec.codegen.write import write_bytes
from moec.counts import whole_numbers
from moec.errors import MoecError, problem, shown_path
from moec.picture import WRITTEN_BY, is_marked_picture
from moec.plan import device_for, plan_loaded
from moec.plan.export import plan_data
from moec.spec import load_spec

DEFAULT_TOKENS = (1, 64, 4096)


MAX_TOKENS = 2**31 - 1
"""Largest token count of a cost row (the spec's integer bound)."""
MAX_ROWS = 64
"""Most token counts one --tokens lists."""


def parse_tokens(text: str | None) -> list[int]:
    """Token counts of `--tokens 1,64,4096`: whole numbers from 1 to MAX_TOKENS."""
    if text is None:
        return list(DEFAULT_TOKENS)
    tokens = whole_numbers(text) or []
    if not tokens or len(tokens) > MAX_ROWS or any(not 1 <= t <= MAX_TOKENS for t in tokens):
        raise MoecError(
            [
                problem(
                    "--tokens",
                    f"expects token counts: up to {MAX_ROWS} whole numbers from 1 to "
                    f"{MAX_TOKENS}, separated by commas",
                    "e.g. --tokens 1,64,4096",
                    value=text,
                )
            ],
            "moec explain",
            kind="usage",
        )
    twice = next((t for t in tokens if tokens.count(t) > 1), None)
    if twice is not None:  # a cost row twice (moec tune refuses the same)
        raise MoecError(
            [problem("--tokens", f"names {twice} twice", "each token count once", value=text)],
            "moec explain",
            kind="usage",
        )
    return tokens


def explain(
    path: str,
    overrides,
    tokens: str | None,
    fmt: str,
    ceilings: dict[str, float],
    load: str | None = None,
) -> str | bytes:
    """The plan of the spec at `path` in `fmt`: text for every format but png (bytes); with
    `load` (a load file), each rank's expected rows under it."""
    loaded = load_spec(path, overrides)
    spec = loaded.spec
    plan = plan_loaded(loaded)
    device = device_for(
        spec.target.device, spec.target.arch, ceilings, spec.parallel.nic_bandwidth_gbs
    )
    counts = parse_tokens(tokens)
    data = plan_data(plan, spec, device, counts)
    data["placement"] = placement_data(plan, device, counts, load)
    if fmt == "json":
        return json.dumps(data, indent=2) + "\n"
    if fmt == "dot":
        return _dot(data)
    if fmt in ("svg", "png"):
        dot = _dot(data, picture.heading(data), picture.stage_shares(data))
        return picture.render(data, fmt, dot)
    if fmt == "mermaid":
        return _mermaid(data)
    return _text(data)


def placement_data(plan, device, tokens: list[int], load_file: str | None) -> dict[str, Any]:
    """Each rank's experts (logical ids) and, under a recorded load, each rank's expected
    rows, the imbalance (max / mean), and the floor of the slowest rank beside the even
    split's (its grouped rows scaled by the imbalance, moec.plan.cost)."""
    from moec import eplb
    from moec.plan import cost

    layer = plan.layer
    ranks = [list(rank) for rank in layer.placement]
    data: dict[str, Any] = {"ranks": ranks, "replica_choice": layer.replica_choice, "load": None}
    if load_file is None:
        return data
    load = eplb.read_load(Path(load_file))
    if len(load) != layer.routed_experts:
        raise MoecError(
            [problem("--load", f"holds {len(load)} experts, the layer {layer.routed_experts}",
                     "a load file of this layer", value=load_file)],
            "moec explain",
            kind="usage",
        )  # fmt: skip
    redundant = layer.physical_experts - layer.routed_experts
    split = eplb.baseline(layer.routed_experts, redundant, layer.ep)
    rows = eplb.expected_rows(ranks, load, layer.replica_choice, layer.nodes)
    even_rows = eplb.expected_rows(split, load, layer.replica_choice, layer.nodes)
    placed, even = eplb.imbalance(rows), eplb.imbalance(even_rows)
    total = sum(load) or 1.0
    data["load"] = {
        "file": load_file,
        "rank_share": [r / total for r in rows],
        "imbalance": placed,
        "even_imbalance": even,
        "floors": [
            {
                "tokens": t,
                "slowest_ms": cost(plan.at(t), device, t, placed).floor_ms,
                "even_ms": cost(plan.at(t), device, t, even).floor_ms,
                "uniform_ms": cost(plan.at(t), device, t).floor_ms,
            }
            for t in tokens
        ],
    }
    return data


def _placement_text(data: dict[str, Any]) -> list[str]:
    placement, dims = data["placement"], data["choices"]["dims"]
    ranks = placement["ranks"]
    physical = sum(len(r) for r in ranks)
    load = placement["load"]
    if len(ranks) == 1 and ranks[0] == list(range(dims["routed_experts"])) and not load:
        return []
    lines = ["", f"placement: {physical} physical experts on {len(ranks)} rank(s), replica "
             f"choice {placement['replica_choice']}"]  # fmt: skip
    for index, rank in enumerate(ranks):
        share = f"{load['rank_share'][index]:7.1%} of the rows, " if load else ""
        lines.append(f"  rank {index}: {share}experts {', '.join(map(str, rank))}")
    if load:
        lines.append(
            f"under the load of {shown_path(load['file'])}: imbalance (max / mean rows per rank) "
            f"{load['imbalance']:.3f} placed, {load['even_imbalance']:.3f} for the even split"
        )
        lines.append(f"    {'T':>8}{'slowest ms':>14}{'even ms':>14}{'uniform ms':>14}")
        for row in load["floors"]:
            lines.append(
                f"    {row['tokens']:>8}{row['slowest_ms']:>14.4f}{row['even_ms']:>14.4f}"
                f"{row['uniform_ms']:>14.4f}"
            )
    return lines


PLAN_FIRST_LINE = rb"moec \S+ plan for [A-Za-z_][A-Za-z0-9_]* \(spec sha256 [0-9a-f]{16}\)"
"""The first line of a text plan, whole (a user's file that starts "moec 1 plan for ..." is not
one)."""


def is_explain_output(head: bytes) -> bool:
    """Whether a file starting with `head` is an output of `moec explain`, which `-o` may
    replace: the text and json plans and the support matrix by their first line, the pictures
    by their WRITTEN_BY mark where explain puts it (picture.is_marked_picture)."""
    first = head.split(b"\n", 1)[0]
    if re.fullmatch(PLAN_FIRST_LINE, first) or head.startswith(b'{\n  "moec_version"'):
        return True
    if first.startswith(b"Support matrix, generated from moec's rules"):  # --matrix
        return True
    return is_marked_picture(head)


def write(output: str | bytes, out: str | None) -> None:
    """Print `output`, or write it to the file `out` (replacing only an earlier output of
    explain, unchanged since, never through a link); binary output (png) needs a file."""
    if out is not None:
        data = output if isinstance(output, bytes) else output.encode()
        write_bytes(Path(out), data, is_explain_output, recorded=True)
    elif isinstance(output, bytes):
        raise MoecError(
            [problem("--out", "is required for --format png (binary output)", "-o plan.png")],
            "moec explain",
            kind="usage",
        )
    else:
        sys.stdout.write(output)


# --- text ---------------------------------------------------------------------------------


_BYTES = ((1e15, "PB", 2), (1e12, "TB", 2), (1e9, "GB", 2), (1e6, "MB", 2), (1e3, "kB", 1))
_FLOPS = (
    (1e18, "EF", 2),
    (1e15, "PF", 2),
    (1e12, "TF", 2),
    (1e9, "GF", 2),
    (1e6, "MF", 2),
    (1e3, "kF", 1),
)


def _scaled(value: float, steps, plain: str) -> str:
    """value in the largest unit of `steps` it reaches, else `plain` (a format of the count)."""
    for factor, unit, digits in steps:
        if value >= factor:
            return f"{value / factor:.{digits}f} {unit}"
    return plain.format(value)


def _mb(value: float) -> str:
    return _scaled(value, _BYTES, "{:.0f} B")


def _flops(value: float) -> str:
    return _scaled(value, _FLOPS, "{:.0f} F")


def _rate(value: float) -> str:
    """A bandwidth or a rate as the cost line shows it: whole units, or 3 digits below 1 (a
    ceiling of 0.001 given on the command line is not 0)."""
    return f"{value:.0f}" if value >= 1 or value == 0 else f"{value:.3g}"


def _text(data: dict[str, Any]) -> str:
    spec, target, chosen = data["spec"], data["target"], data["choices"]
    dims = chosen["dims"]
    lines = [
        f"moec {data['moec_version']} plan for {spec['name']} (spec sha256 {spec['hash'][:16]})",
        f"target: {target['device']} {target['arch'] or ''} {target['dtype']}, "
        f"max_num_tokens {target['max_num_tokens']}".replace("  ", " "),
        f"shapes: T tokens, H = {dims['hidden']}, I = {dims['intermediate']} per rank, "
        f"E = {dims['routed_experts']} experts ({dims['local_experts']} on this rank), "
        f"K = {dims['top_k']}, shared: {dims['n_shared']} x {dims['intermediate'] * dims['tp']}",
        f"needs: {', '.join(chosen['requires']) or 'torch only'}"
        + (f" (missing here: {', '.join(chosen['missing'])})" if chosen["missing"] else ""),
        "",
        "stages",
    ]
    lines += _stage_lines(data["stages"])
    above = data["above"]
    if above:
        lines += [
            "",
            f"stages above T = {above['up_to']} ({above['gemm_backend']} GEMMs), where they differ",
            *_stage_lines(above["stages"]),
        ]
    lines += ["", "decisions"]
    for decision in data["decisions"]:
        lines.append(f"  {decision['what']} = {decision['choice']}: {decision['reason']}")
    if above:
        lines += ["", f"decisions above T = {above['up_to']}, where they differ"]
        for decision in above["decisions"]:
            lines.append(f"  {decision['what']} = {decision['choice']}: {decision['reason']}")
    lines += _cost_text(data)
    if "placement" in data:
        lines += _placement_text(data)
    return "\n".join(lines) + "\n"


def _stage_lines(stages: list[dict[str, Any]]) -> list[str]:
    lines = []
    for index, stage in enumerate(stages, start=1):
        flags = []
        if stage["fused"]:
            flags.append("fused " + " + ".join(stage["fused"]))
        flags.append("syncs host" if stage["syncs_host"] else "no host sync")
        flags.append("graph-safe" if stage["graph_safe"] else "not graph-safe")
        lines.append(
            f"  {index:2d}. {stage['name']} [{stage['kind']}, {stage['backend']}] ({', '.join(flags)})"
        )
        for item in stage["inputs"]:
            lines.append(
                f"        in   {item['as']:<13} {item['type']['label']}  <- {item['from']}"
            )
        for item in stage["outputs"]:
            lines.append(f"        out  {item['tensor']:<13} {item['type']['label']}")
        for item in stage["weights"]:
            lines.append(f"        w    {item['tensor']:<13} {item['type']['label']}")
        for item in stage["scratch"]:
            lines.append(
                f"        tmp  {item['tensor']:<13} {item['type']['label']}  (within the stage)"
            )
        for item in stage["workspace"]:
            kept = "kept zeroed"
            if stage["kind"] == "place":
                kept = "the load counter" if item["tensor"] == "expert_counts" else "a table"
            lines.append(f"        buf  {item['tensor']:<13} {item['type']['label']}  ({kept})")
        if stage["note"]:
            lines.append(f"        note {stage['note']}")
    return lines


def _cost_text(data: dict[str, Any]) -> list[str]:
    device, dims = data["device"], data["choices"]["dims"]
    ranks = dims["tp"] * dims["ep"]
    lines = [
        "",
        f"cost on {device['name']} ({_rate(device['bandwidth_gbs'])} GB/s, "
        f"{_rate(device['bf16_tflops'])} TFLOP/s bf16, {_rate(device['fp8_tflops'])} TFLOP/s fp8, "
        f"{_rate(device['fp32_tflops'])} TFLOP/s fp32; "
        f"{'measured' if device['measured'] else 'datasheet leads, or the ceilings given'})",
        "floor = max(bytes / bandwidth, FLOPs / rate of the stage's operands); experts hit under "
        "uniform routing",
    ]
    if ranks > 1:
        lines.append(
            f"{ranks} ranks on {dims['nodes']} node(s): NVLink {device['link_gbs']:.1f} GB/s, "
            f"network {device['nic_gbs']:.1f} GB/s one-way per GPU; sent = bytes this rank sends "
            "(NVLink + network), in the floor as sent / link bandwidth"
        )
    for row in data["cost"]:
        lines.append("")
        lines.append(
            f"  T = {row['tokens']}: {_mb(row['bytes'])}, {_flops(row['flops'])}, floor "
            f"{row['floor_ms']:.4f} ms, peak {_mb(row['peak_bytes'])}, "
            f"{row['experts_hit']:.1f} experts hit"
        )
        if row["beyond_max_num_tokens"]:
            lines.append(
                f"    (more than target.max_num_tokens = {data['target']['max_num_tokens']}: a "
                f"forward of this package refuses {row['tokens']} tokens; --set "
                f"target.max_num_tokens={row['tokens']} builds one sized for them, where its "
                "workspace fits the GPU's memory)"
            )
        sent_head = f" {'NVLink':>11} {'network':>11}" if ranks > 1 else ""
        lines.append(f"    {'stage':<28} {'bytes':>11} {'FLOPs':>11}{sent_head} {'floor ms':>11}")
        for stage in row["stages"]:  # a space before each column: a wide figure never joins two
            sent = (
                f" {_mb(stage['link_bytes']):>11} {_mb(stage['nic_bytes']):>11}"
                if ranks > 1
                else ""
            )
            lines.append(
                f"    {stage['stage']:<28} {_mb(stage['bytes']):>11} {_flops(stage['flops']):>11}"
                f"{sent} {stage['floor_ms']:>11.4f}"
            )
    return lines


# --- graphs -------------------------------------------------------------------------------


def _edges(data: dict[str, Any]):
    for stage in data["stages"]:
        for item in stage["inputs"]:
            yield item["from"], stage["name"], f"{item['tensor']}: {item['type']['label']}"


def _above_graph(data: dict[str, Any], suffix: str):
    """Of a GEMM split: (node, stage) of each stage the plan above it runs differently, and
    the edges into and out of them ((source, target, label)); those stages' nodes are their
    names + `suffix`, the shared stages' their names."""
    differ = {s["name"] for s in data["above"]["stages"]}

    def node(name: str) -> str:
        return name + suffix if name in differ else name

    nodes = [(node(s["name"]), s) for s in data["above"]["stages"]]
    edges = [
        (node(item["from"]), node(stage["name"]), f"{item['tensor']}: {item['type']['label']}")
        for stage in data["above"]["stages"]
        for item in stage["inputs"]
    ]
    edges += [  # the stages both plans share read from the ones above where those differ
        (node(item["from"]), stage["name"], f"{item['tensor']}: {item['type']['label']}")
        for stage in data["stages"]
        if stage["name"] not in differ
        for item in stage["inputs"]
        if item["from"] in differ
    ]
    return nodes, edges


def _dot(data: dict[str, Any], title: tuple[str, ...] = (), shares: dict | None = None) -> str:
    """DOT text of the stage graph; with a title and each stage's share of the stage floors
    (the picture formats), those too."""
    lines = [
        f"digraph {json.dumps(data['spec']['name'])} {{",
        f"  comment={json.dumps(WRITTEN_BY)};",
        "  rankdir=TB;",
        "  node [shape=box];",
    ]
    if title:
        heading = "\n".join(title)  # a real newline: DOT's line break once json.dumps escapes it
        lines.append(f"  labelloc=t; label={json.dumps(heading)};")
    above = data["above"]
    running = picture.stages_at(data)  # the shares are of these: the stages at the picture's T

    def box_label(stage: dict[str, Any]) -> str:
        # A real newline: json.dumps writes it as the two characters \n, DOT's line break.
        text = f"{stage['name']}\n{stage['kind']} / {stage['backend']}"
        if shares and stage["name"] in shares and stage in running:
            text += f"\n{shares[stage['name']]:.1%} of the stage floors"
        return text

    for stage in data["stages"]:
        text = box_label(stage)
        lines.append(f"  {json.dumps(stage['name'])} [label={json.dumps(text)}];")
    for source, target, label in _edges(data):
        lines.append(f"  {json.dumps(source)} -> {json.dumps(target)} [label={json.dumps(label)}];")
    if above:
        nodes, edges = _above_graph(data, f" (T > {above['up_to']})")
        heading = f"T > {above['up_to']}: {above['gemm_backend']} GEMMs"
        lines += ["  subgraph cluster_above {", f"    label={json.dumps(heading)}; style=dashed;"]
        for name, stage in nodes:
            lines.append(f"    {json.dumps(name)} [label={json.dumps(box_label(stage))}];")
        lines.append("  }")
        for source, target, label in edges:
            lines.append(
                f"  {json.dumps(source)} -> {json.dumps(target)} "
                f"[label={json.dumps(label)}, style=dashed];"
            )
    lines.append("}")
    return "\n".join(lines) + "\n"


def _mermaid(data: dict[str, Any]) -> str:
    lines = ["flowchart TD", f"  %% {WRITTEN_BY}"]
    for stage in data["stages"]:
        lines.append(
            f'  {stage["name"]}["{stage["name"]}<br/>{stage["kind"]} / {stage["backend"]}"]'
        )
    for source, target, label in _edges(data):
        safe = label.replace('"', "'").replace("|", "/")
        lines.append(f'  {source} -->|"{safe}"| {target}')
    above = data["above"]
    if above:
        nodes, edges = _above_graph(data, "_above")  # mermaid ids: no spaces
        lines.append(f'  subgraph above["T > {above["up_to"]}: {above["gemm_backend"]} GEMMs"]')
        for name, stage in nodes:
            lines.append(f'    {name}["{stage["name"]}<br/>{stage["kind"]} / {stage["backend"]}"]')
        lines.append("  end")
        for source, target, label in edges:
            safe = label.replace('"', "'").replace("|", "/")
            lines.append(f'  {source} -.->|"{safe}"| {target}')
    return "\n".join(lines) + "\n"


# --- support matrix -----------------------------------------------------------------------


def matrix_text() -> str:
    from moec.plan.matrix import TARGETS, support_matrix

    rows = support_matrix()
    lines = [
        "Support matrix, generated from moec's rules and renderers (local dispatch, layout auto, "
        "DeepSeek-V3 dims), on a machine with every optional package installed.",
        'Each cell: ok (it builds), or the rules that reject it ("renderer": a stage of its plan '
        "has no renderer).",
        "",
        "| gemm backend | scheme | activation | " + " | ".join(TARGETS) + " |",
        "|---|---|---|" + "---|" * len(TARGETS),
    ]
    for row in rows["kernels"]:
        cells = [", ".join(row["targets"][t]) or "ok" for t in TARGETS]
        lines.append(
            f"| {row['gemm_backend']} | {row['scheme']} | {row['activation']} | "
            + " | ".join(cells)
            + " |"
        )
    lines += [
        "",
        "Dispatch and layout (fp8_block, gemm backend auto, ep_size 8 for expert parallel dispatch):",
        "",
        "| dispatch | layout | " + " | ".join(TARGETS) + " |",
        "|---|---|" + "---|" * len(TARGETS),
    ]
    for row in rows["dispatch"]:
        cells = [", ".join(row["targets"][t]) or "ok" for t in TARGETS]
        lines.append(f"| {row['dispatch']} | {row['layout']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
