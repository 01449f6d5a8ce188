"""`moec build`: the generated package's files, determinism, atomic writes, golden files, inert
spec strings, generated-code hygiene and build time."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import EXAMPLES

import moec
from moec.cli import main
from moec.codegen import build, render_package
from moec.spec import load_spec, parse_spec

GOLDEN = Path(__file__).resolve().parent / "golden"
COPY = b"# A verbatim copy of moec/runtime/"
GOLDEN_EXAMPLES = ("tiny-cpu.toml", "tiny-cpu-triton.toml")


def test_build_writes_the_package(tmp_path, capsys):
    assert main(["build", str(EXAMPLES / "tiny-cpu.toml"), "-o", str(tmp_path)]) == 0
    package = tmp_path / "tiny_cpu"
    names = sorted(p.name for p in package.iterdir())
    generated = [
        "__init__.py",
        "check.py",
        "gated_activation.py",
        "layer.py",
        "stages.py",
        "weights.py",
    ]
    copied = [
        "checkpoint.py",  # the runtime modules the torch renderers and weights use
        "expert_weights.py",
        "grouping.py",
        "progress.py",
        "quant.py",
        "reference.py",  # and those of the self-check (python -m tiny_cpu.check)
        "self_check.py",
        "output.py",
        "torch_matmul.py",
        "torch_select.py",
        "weight_formats.py",
    ]
    # .moec-build: the marker that lets the next build replace this folder (and only it)
    marker = [".moec-build"]
    assert names == sorted([*generated, *copied, *marker, "plan.json", "spec.json", "spec.toml"])
    spec_hash = load_spec(EXAMPLES / "tiny-cpu.toml").content_hash
    for name in generated + copied:
        header = (package / name).read_text().splitlines()[0]
        assert f"moec {moec.__version__}" in header and spec_hash in header
    for name in copied:  # verbatim copies of moec/runtime/, after the header
        source = (Path(moec.__file__).parent / "runtime" / name).read_text()
        assert (package / name).read_text().endswith(source)
    assert "written" in capsys.readouterr().out


def test_kernels_only_when_the_plan_uses_triton(tmp_path):
    build(EXAMPLES / "tiny-cpu-triton.toml", tmp_path)
    build(EXAMPLES / "tiny-cpu.toml", tmp_path)
    triton = {p.name for p in (tmp_path / "tiny_cpu_triton").glob("triton_*.py")}
    assert {"triton_gemm.py", "triton_act.py", "triton_permute.py", "triton_route.py"} <= triton
    assert (tmp_path / "tiny_cpu_triton" / "tiles.py").exists()
    assert not list((tmp_path / "tiny_cpu").glob("triton_*.py"))
    assert not (tmp_path / "tiny_cpu" / "tiles.py").exists()
    assert "import triton" not in (tmp_path / "tiny_cpu" / "gated_activation.py").read_text()


def test_rebuild_is_byte_identical(tmp_path):
    first = render_package(load_spec(EXAMPLES / "tiny-cpu.toml"))
    second = render_package(load_spec(EXAMPLES / "tiny-cpu.toml"))
    assert first == second
    result = build(EXAMPLES / "tiny-cpu.toml", tmp_path)
    assert result.written
    again = build(EXAMPLES / "tiny-cpu.toml", tmp_path)
    assert not again.written  # same bytes: nothing rewritten


def test_spec_formatting_does_not_change_the_code(tmp_path):
    text = (EXAMPLES / "tiny-cpu.toml").read_text()
    reordered = (
        "\n".join(line for line in text.splitlines() if not line.startswith("#"))
        + "\n# a comment\n"
    )
    a = render_package(load_spec(EXAMPLES / "tiny-cpu.toml"))
    b = render_package(parse_spec(reordered, "other.toml"))
    assert {k: v for k, v in a.items() if k != "spec.toml"} == {
        k: v for k, v in b.items() if k != "spec.toml"
    }


def test_interrupted_build_leaves_the_previous_package_whole(tmp_path, monkeypatch):
    build(EXAMPLES / "tiny-cpu.toml", tmp_path)
    package = tmp_path / "tiny_cpu"
    before = {p.name: p.read_bytes() for p in package.iterdir()}
    calls = []

    def failing_write(self, data):
        calls.append(self.name)
        if len(calls) == 3:
            raise KeyboardInterrupt  # interrupted in the middle of writing the new files
        return original(self, data)

    original = Path.write_bytes
    monkeypatch.setattr(Path, "write_bytes", failing_write)
    with pytest.raises(KeyboardInterrupt):
        build(EXAMPLES / "tiny-cpu.toml", tmp_path, ["router.routed_scaling_factor=3.0"])
    monkeypatch.undo()
    assert {p.name: p.read_bytes() for p in package.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["tiny_cpu"]  # no staging folder left


def test_golden_files(tmp_path):
    """The rendered code of two examples, committed: a template change shows up in review
    (the verbatim copies of moec/runtime/ are not kept twice). Regenerate with
    MOEC_UPDATE_GOLDEN=1 after checking the difference is intended."""
    for example in GOLDEN_EXAMPLES:
        files = {
            name: data
            for name, data in render_package(load_spec(EXAMPLES / example)).items()
            if b"# A verbatim copy of moec/runtime/" not in data
        }
        folder = GOLDEN / example.removesuffix(".toml")
        if os.environ.get("MOEC_UPDATE_GOLDEN"):
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
            for name, data in files.items():
                if name.endswith(".py"):
                    (folder / name).write_bytes(data)
        for name, data in files.items():
            if name.endswith(".py"):
                assert (folder / name).read_bytes() == data, (
                    f"{example}: {name} differs from tests/golden"
                )


SPECS_FOR_HYGIENE = [
    ("tiny-cpu.toml", []),
    ("tiny-cpu-triton.toml", []),
    ("tiny-cpu-bf16.toml", []),
    (
        "tiny-cpu.toml",
        [
            "experts.layout=contiguous",
            "quant.scheme=mxfp4",
            "quant.checkpoint=quantized",
            "quant.shared_scheme=mxfp4",
            "experts.shared_experts=fused",
        ],
    ),
    (
        "tiny-cpu.toml",
        [
            "quant.scheme=fp8_per_tensor",
            "quant.activation_scheme=static",
            "quant.checkpoint=quantized",
            "activation.kind=situ",
            "activation.beta=1.0",
            "activation.linear_beta=1.0",
        ],
    ),
    ("tiny-cpu.toml", ["parallel.dispatch=all2all", "parallel.ep_size=2"]),
    ("tiny-cpu.toml", ["parallel.tp_size=2", "model.moe_intermediate_size=256"]),
    ("deepseek-v3-fp8.toml", []),
    ("deepseek-v3-bf16.toml", ["experts.gemm_backend=torch"]),
    ("deepseek-v3-fp8.toml", ["experts.shared_experts=overlapped"]),
]


@pytest.mark.parametrize(
    "overrides",
    [[], ["parallel.tp_size=2"], ["parallel.dispatch=all2all", "parallel.ep_size=2"]],
)
def test_overlapped_shared_experts_fork_first_and_join_before_their_reader(overrides):
    """The shared experts are issued first, inside the side stream's block, and the current
    stream joins it on the line before the stage that reads their output."""
    spec = load_spec(
        EXAMPLES / "deepseek-v3-fp8.toml", ["experts.shared_experts=overlapped", *overrides]
    )
    files = render_package(spec)
    assert "streams.py" in files
    layer = files["layer.py"].decode()
    assert "self.side_stream = streams.SideStream()" in layer
    lines = [line.strip() for line in layer[layer.index("def forward") :].splitlines()]
    fork = lines.index("with self.side_stream.beside(x):")
    calls = [i for i, line in enumerate(lines) if " = stages." in line]
    assert lines[calls[0]] == "shared = stages.shared_expert(" and calls[0] == fork + 2
    assert lines[fork + 1] == "# shared: bf16[T, H]"  # the shape comment above each call
    join = lines.index("self.side_stream.join(shared)")
    after = " ".join(line for line in lines[join + 1 :] if not line.startswith("#"))
    reader = after[: after.index(")") + 1]  # the first statement after the join
    assert " = stages." in reader and "shared" in reader.split("(", 1)[1]
    assert join > calls[1]  # the routed chain was issued in between


@pytest.mark.parametrize("example, overrides", SPECS_FOR_HYGIENE)
def test_generated_code_parses_and_passes_ruff(tmp_path, example, overrides):
    files = render_package(load_spec(EXAMPLES / example, overrides))
    for name, data in files.items():
        if name.endswith(".py"):
            ast.parse(data, filename=name)
            (tmp_path / name).write_bytes(data)
    ruff = [sys.executable, "-m", "ruff"]
    check = subprocess.run(
        [*ruff, "check", "--isolated", "--select", "E,F,W,B", "--ignore", "E501", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stdout
    default = subprocess.run([*ruff, "check", "--isolated", str(tmp_path)], capture_output=True)
    assert default.returncode == 0, default.stdout  # ruff's default rules, as a user runs them
    rendered = [str(tmp_path / n) for n, d in files.items() if n.endswith(".py") and COPY not in d]
    fmt = subprocess.run(
        [*ruff, "format", "--isolated", "--check", *rendered],
        capture_output=True,
        text=True,
    )
    assert fmt.returncode == 0, fmt.stdout
    assert "import moec" not in "".join(d.decode() for n, d in files.items() if n.endswith(".py"))
    layer = files["layer.py"].decode()
    assert "T tokens" in layer and "H = " in layer and "K = " in layer  # the shape legend


def test_spec_strings_are_inert(tmp_path, load_layer):
    """A description trying to break out of its string is rendered as a literal: the package
    parses, imports, runs nothing extra, and keeps the text."""
    marker = tmp_path / "pwned"
    payload = (
        f'x"""\nimport os; os.system("touch {marker}")\n"""\' + __import__("os").getcwd() + \''
    )
    text = (
        (EXAMPLES / "tiny-cpu.toml")
        .read_text()
        .replace(
            'name = "tiny_cpu"', f'name = "tiny_cpu_inert"\ndescription = {toml_string(payload)}'
        )
    )
    package = load_layer(text)
    assert package.DESCRIPTION == payload
    assert not marker.exists()
    layer = package.MoELayer().random_(0)
    layer(torch.randn(3, 256).bfloat16())
    assert not marker.exists()


def test_paths_from_the_environment_are_inert(tmp_path, monkeypatch):
    """A tuning folder whose path tries to break out of the tiles docstring (the path is named
    there: "looked in ...") leaves the generated files plain text: each parses to the same
    module whatever the path, nothing runs on import, and the path is still shown."""
    marker = tmp_path / "pwned"
    folder = tmp_path / f'x"""\n__import__("os").system("touch {marker}")\nX = """\\'
    monkeypatch.setenv("MOEC_TUNING_DIR", str(folder))
    out = tmp_path / "out"
    spec = EXAMPLES / "deepseek-v3-fp8.toml"  # hidden 4096: a layer no shipped table holds
    assert main(["build", str(spec), "-o", str(out), "--set", "model.hidden_size=4096"]) == 0
    package = next(path for path in out.iterdir() if path.is_dir())
    tiles = (package / "tiles.py").read_text()
    assert "looked in" in tiles and "touch" in tiles  # the path is shown, as text
    for path in package.glob("*.py"):
        tree = ast.parse(path.read_text())
        calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)]
        assert not any(getattr(call.func, "id", "") == "__import__" for call in calls), path
    command = [sys.executable, "-c", f"import {package.name}.tiles"]
    subprocess.run(command, cwd=out, check=True)
    assert not marker.exists()


def toml_string(value: str) -> str:
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def test_injected_names_are_rejected(capsys):
    for name in ("x; import os", "__import__('os')", "os.system", "class", "ｍｏｅ"):
        text = f'name = "{name}"\n[model]\npreset = "deepseek-v3"\n'
        with pytest.raises(moec.MoecError) as error:
            parse_spec(text)
        assert error.value.problems[0].path == "name"


def test_build_time_of_an_example(tmp_path):
    start = time.perf_counter()
    build(EXAMPLES / "deepseek-v3-fp8.toml", tmp_path)
    elapsed = time.perf_counter() - start
    assert elapsed < 2.0, f"moec build took {elapsed:.2f} s"


def test_load_builds_once_and_imports(cache_dir):
    first = moec.load(str(EXAMPLES / "tiny-cpu.toml"), cache_dir=cache_dir)
    second = moec.load(str(EXAMPLES / "tiny-cpu.toml"), cache_dir=cache_dir)
    assert first is second
    assert first.SPEC["name"] == "tiny_cpu" and first.PLAN["spec"]["name"] == "tiny_cpu"
    other = moec.load(
        str(EXAMPLES / "tiny-cpu.toml"), ["router.routed_scaling_factor=3.0"], cache_dir=cache_dir
    )
    assert other is not first and other.SPEC["router"]["routed_scaling_factor"] == 3.0


def test_missing_optional_backend_fails_at_build(tmp_path, capsys):
    from moec.plan.environment import Environment

    loaded = load_spec(EXAMPLES / "deepseek-v3-fp8.toml", ["experts.gemm_backend=deep_gemm"])
    with pytest.raises(moec.MoecError) as error:
        render_package(loaded, Environment(frozenset({"triton"})))
    assert error.value.kind == "backend"
    assert "deep_gemm" in str(error.value) and "not installed" in str(error.value)
    code = main(["build", str(EXAMPLES / "deepseek-v3-deepep-ll-ep8.toml"), "-o", str(tmp_path)])
    assert code == 2
    assert "deep_ep" in capsys.readouterr().err


def test_generated_package_imports_without_moec(tmp_path):
    """The package runs in a Python that cannot import moec (only torch)."""
    build(EXAMPLES / "tiny-cpu.toml", tmp_path)
    code = (
        "import sys; sys.modules['moec'] = None\n"
        "import torch, tiny_cpu\n"
        "layer = tiny_cpu.MoELayer().random_(0)\n"
        "print(layer(torch.randn(2, 256).bfloat16()).shape)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert "torch.Size([2, 256])" in result.stdout


def test_run_command(capsys):
    assert main(["run", str(EXAMPLES / "tiny-cpu.toml"), "--tokens", "4"]) == 0
    out = capsys.readouterr().out
    assert "checksum" in out and "ms per forward" in out
    assert main(["run", str(EXAMPLES / "deepseek-v3-fp8.toml")]) == 2 or torch.cuda.is_available()


def _literal_positionals(source: bytes) -> set[str]:
    """Calls in `source` that pass a number, a flag or None by position (builtins aside)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and ast.unparse(node.func) not in ("slice", "range"):
            if any(isinstance(arg, ast.Constant) for arg in node.args):
                found.add(ast.unparse(node))
    return found


def test_generated_calls_pass_values_by_keyword():
    """A stage function's calls name every value they pass (experts=257, shared=None): only the
    tensors in scope go by position. Every example, with every backend importable."""
    from moec.plan.environment import Environment

    full = Environment(frozenset({"triton", "deep_gemm", "deep_ep"}))
    rendered = 0
    for path in sorted(EXAMPLES.glob("*.toml")):
        stages = render_package(load_spec(path), full)["stages.py"]
        assert _literal_positionals(stages) == set(), path.name
        rendered += 1
    assert rendered >= 10
    assert _literal_positionals(b"grouping.route_masked(topk_ids, 16)\n")  # the check sees one


def test_every_forward_call_has_its_shapes_above_it():
    """The forward a person reads: above each stage call, what it returns as the plan types it
    (`# h: bf16[M, 2I]`), one entry per tensor it binds (scales go with their tensor)."""
    from moec.plan.environment import Environment

    full = Environment(frozenset({"triton", "deep_gemm", "deep_ep"}))
    checked = 0
    for path in sorted(EXAMPLES.glob("*.toml")):
        layer = render_package(load_spec(path), full)["layer.py"].decode()
        lines = [line.strip() for line in layer[layer.index("def _forward") :].splitlines()]
        for index, line in enumerate(lines):
            if " = stages." not in line:
                continue
            comment = lines[index - 1]
            assert comment.startswith("# "), (path.name, line)
            for name in line.split(" = ")[0].split(", "):
                assert name.endswith("_scale") or f"{name}: " in comment, (path.name, comment)
            checked += 1
    assert checked >= 50


def test_the_legend_names_the_fused_shared_expert_and_one_binding_per_format():
    """stages.py says what E and K are where the shared expert is fused, and a matmul the routed
    and shared experts share is bound once."""
    stages = render_package(load_spec(EXAMPLES / "deepseek-v3-fp8.toml"))["stages.py"].decode()
    legend = " ".join(stages[: stages.index('"""\n\n')].split())
    assert "256 routed experts in the router's [T, E]; 257 in the grouped layout" in legend
    assert "fused as expert 256" in legend and "K = 9 rows per token (top-8 and 1 shared)" in legend
    separate = render_package(load_spec(EXAMPLES / "tiny-cpu.toml"))["stages.py"].decode()
    assert separate.count("torch_matmul.matmul_block_scaled,") == 1
    assert separate.count("matmul_blocks_128x128 = ") == 1
    assert "def shared_expert" in separate and "matmul_blocks_128x128(" in separate
