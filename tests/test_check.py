"""`python -m <package>.check`: every package checks itself against its torch reference
(moec/runtime/reference.py, which composes the torch functions itself, not the package's
stages), times itself and stands each T beside the plan's floor."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys

import pytest
import torch
from conftest import EXAMPLES

from moec.codegen import build
from moec.runtime import reference, self_check

SPEC = """
name = "check_layer"
[model]
hidden_size = 256
moe_intermediate_size = 128
n_routed_experts = 8
num_experts_per_tok = 2
n_shared_experts = 1
[router]
scoring_func = "sigmoid"
topk_method = "noaux_tc"
n_group = 2
topk_group = 1
norm_topk_prob = true
routed_scaling_factor = 2.5
[experts]
gemm_backend = "torch"
[target]
device = "cpu"
max_num_tokens = 64
"""

VARIANTS = {
    "bf16": [],
    "fp8_per_tensor": ["quant.scheme=fp8_per_tensor", "quant.checkpoint=bf16"],
    "fp8_static": [
        "quant.scheme=fp8_per_tensor",
        "quant.activation_scheme=static",
        "quant.checkpoint=quantized",
    ],
    "fp8_block": ["quant.scheme=fp8_block", "quant.checkpoint=bf16"],
    "mxfp8": ["quant.scheme=mxfp8", "quant.checkpoint=bf16"],
    "mxfp4": ["quant.scheme=mxfp4", "quant.shared_scheme=mxfp8"],
    "fused_shared_oai": [
        "experts.shared_experts=fused",
        "activation.kind=oai_swiglu",
        "activation.limit=1.0",
        "router.scoring_func=softmax",
        "router.topk_method=group_limited_greedy",
    ],
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_the_reference_is_the_torch_layer(load_layer, variant):
    """On a CPU the torch backend and the reference run the same functions: equal within the
    check's bound (in fact exactly, up to summation order)."""
    package = load_layer(SPEC, *VARIANTS[variant])
    layer = package.MoELayer().random_(3)
    x = torch.randn(12, 256, generator=torch.Generator().manual_seed(4)).bfloat16()
    gated = package.gated_activation.torch_gated
    expected = reference.forward(layer, x, package.PLAN, gated)
    bound, _ = self_check.bound_of(package.PLAN)
    assert self_check.norm_error(layer(x), expected) <= bound


def test_the_reference_takes_no_tokens(load_layer):
    """Zero tokens: an empty output, as the layer gives (a view with -1 could not tell H)."""
    package = load_layer(SPEC)
    layer = package.MoELayer().random_(3)
    x = torch.zeros(0, 256).bfloat16()
    gated = package.gated_activation.torch_gated
    assert reference.forward(layer, x, package.PLAN, gated).shape == layer(x).shape == (0, 256)


def run_check(folder, package: str, *args: str, interpret: bool = False):
    env = {**os.environ, "TRITON_INTERPRET": "1" if interpret else "0"}
    return subprocess.run(
        [sys.executable, "-m", f"{package}.check", *args],
        cwd=folder,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


@pytest.mark.parametrize(
    ("example", "package", "interpret"),
    [("tiny-cpu.toml", "tiny_cpu", False), ("tiny-cpu-triton.toml", "tiny_cpu_triton", True)],
)
def test_a_built_package_checks_itself(tmp_path, example, package, interpret):
    """From the build folder, as a user runs it (the Triton layer contiguous: the interpreter's
    cost grows with the masked layout's programs)."""
    build(EXAMPLES / example, tmp_path, ["experts.layout=contiguous"])
    done = run_check(tmp_path, package, "--tokens", "1,4", "--repeats", "1", interpret=interpret)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    backend = "triton" if interpret else "torch"
    assert lines[0].startswith(f"{package} self-check: {backend} backend, random weights (seed 0)")
    assert lines[1].startswith("reference: the layer's math in torch ops on its own weights")
    assert "bound 2**-5 + 2**-7 of the output norm (fp8_block" in lines[1]
    assert lines[2] == (
        "floor: the plan's cost model for CPU (nominal), not measured: not this machine's CPU, "
        "compare with care"
    )
    assert lines[3].split() == ["T", "error", "time", "ms", "floor", "ms", "x", "floor"]
    one, four = lines[4].split(), lines[5].split()
    assert one[0] == "1" and one[-1] == "ok" and float(one[3]) > 0  # T=1 has a floor
    assert four[0] == "4" and four[-1] == "ok" and four[3] == "-"  # plan.json has no T=4 row
    assert lines[6] == "ok: within 2**-5 + 2**-7 of the reference at every T"
    assert done.stderr == ""


@pytest.fixture
def checked(load_layer):
    """The check of the tiny fp8 torch package, run in this process."""
    package = load_layer(EXAMPLES / "tiny-cpu.toml")
    check = importlib.import_module(f"{package.__name__}.check")
    return package, check


def test_a_corrupted_stage_fails_the_check(checked, monkeypatch, capsys):
    package, check = checked
    combine = package.stages.combine
    monkeypatch.setattr(package.stages, "combine", lambda *args: combine(*args) * 1.25)
    assert check.main(["--tokens", "1,4", "--repeats", "1"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[4].split()[0] == "1" and "OVER the bound 3.91e-02" in out[4]
    assert out[-1].startswith("FAILED: T=1: error 0.2") and "; T=4: error 0.2" in out[-1]


def test_a_stage_that_raises_fails_the_check(checked, monkeypatch, capsys):
    package, check = checked

    def broken(*args):
        raise RuntimeError("out of registers")

    monkeypatch.setattr(package.stages, "gemm_down", broken)
    assert check.main(["--tokens", "2", "--repeats", "1"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[4] == "     2 RuntimeError: out of registers"
    assert out[-1] == "FAILED: T=2: raised RuntimeError: out of registers"


def test_no_cuda_device_is_a_clear_message(checked, monkeypatch, capsys):
    package, check = checked
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert check.main(["--device", "cuda"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        "tiny_cpu.check: --device cuda: no CUDA device here "
        "(torch.cuda.is_available() is False); run it on a GPU, or pass --device cpu\n"
    )


def test_what_cannot_run_here_is_said(load_layer, monkeypatch):
    plan = load_layer(EXAMPLES / "tiny-cpu-triton.toml").PLAN
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert "set TRITON_INTERPRET=1" in self_check.cannot_run("cpu", plan)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert self_check.cannot_run("cpu", plan) == ""
    dims = {**plan["choices"]["dims"], "ep": 2}
    two_ranks = {**plan, "choices": {**plan["choices"], "dims": dims}}
    assert self_check.cannot_run("cpu", two_ranks).startswith("this layer runs on 2 ranks")


def test_bad_tokens_are_a_usage_error(checked, capsys):
    _, check = checked
    with pytest.raises(SystemExit) as raised:
        check.main(["--tokens", "0,x"])
    assert raised.value.code == 2
    assert "expects positive token counts" in capsys.readouterr().err


def test_the_floor_says_whose_device_it_is():
    assert self_check.same_device("H200", "NVIDIA H200")
    assert self_check.same_device("A100-80GB", "NVIDIA A100-SXM4-80GB")
    assert not self_check.same_device("H200", "NVIDIA H100 80GB HBM3")
    assert self_check.bound_of({"choices": {"dims": bf16_dims()}})[1] == "2**-7"


def bf16_dims():
    return {"routed": {"scheme": "bf16"}, "shared": {"scheme": "bf16"}}


def test_a_raised_error_is_told_by_its_last_line():
    """A compiler error's message ends with its cause; the check prints that line only."""
    error = RuntimeError(
        "at 35:36:\n    for part in tl.static_range(PARTS):\n\nNameError('PARTS')\n"
    )
    assert self_check.last_line(error) == "NameError('PARTS')"
    assert self_check.last_line(RuntimeError("x" * 300)) == "x" * 200


def test_header_names_both_backends_of_a_split():
    plan = {
        "choices": {"dims": {"routed": {"scheme": "fp8_block"}}, "gemm_backend": "triton"},
        "above": {"up_to": 1024, "gemm_backend": "deep_gemm"},
        "device": {"name": "H200", "measured": True},
        "target": {"device": "cuda"},
    }
    args = type("Args", (), {"seed": 0, "device": "cpu"})()
    line = self_check.header("v3", plan, args, "2**-5")[0]
    assert "triton (up to T=1024) and deep_gemm backend" in line
