"""Every Triton kernel that small generated layers launch compiles for Hopper (sm_90), here,
without a GPU.

The interpreter runs a kernel's operations one by one in numpy and accepts programs the
compiler refuses. For example, a name bound to tensors of two types in the two branches of an
`if` ran in the interpreter and failed to compile on the H200 (benchmarks/RESULTS.md, runs
42-45). So each layer below runs forwards in the interpreter with every launch recorded; then a
process without the interpreter compiles each distinct launch with Triton's NVIDIA backend,
down to a cubin (Triton ships ptxas). Compiled as on a GPU: the interpreter-only constexprs off,
PDL on (tests/hopper_compile.py).

Not reached: a launch the interpreter never makes (the TMA GEMM, which runs only on a GPU).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import EXAMPLES

from moec.cli import main

SCRIPT = Path(__file__).with_name("hopper_compile.py")
SPEC = EXAMPLES / "tiny-cpu-triton.toml"
COMMON = ["target.max_num_tokens=512"]
# (name, --set values, tokens): together they reach every kernel of moec/runtime/triton_*.py
# but the TMA GEMM; 400 tokens are 1200 assignments, past the one-launch dispatch and route
LAYERS = [
    ("fp8_block", ["experts.layout=contiguous"], "1,400"),  # the example's scheme
    # router.rounding: each step rounded (bf16) here, the logits in the mxfp4 layer
    ("bf16_masked", ["quant.scheme=bf16", "experts.layout=masked", "router.rounding=all"], "1,40"),
    (
        "mxfp4",
        [
            "quant.scheme=mxfp4",
            "quant.checkpoint=quantized",
            "quant.shared_scheme=mxfp8",
            "experts.layout=contiguous",
            "router.rounding=logits",
        ],
        "1,40",
    ),
    (
        "fp8_tensor_separate",
        [
            "quant.scheme=fp8_per_tensor",
            "experts.shared_experts=separate",
            "activation.kind=oai_swiglu",
            "activation.limit=1.0",
        ],
        "1,40",
    ),
]


def _nvidia_backend() -> bool:
    try:
        from triton.backends import backends
    except ImportError:
        return False
    return "nvidia" in backends


pytestmark = pytest.mark.skipif(not _nvidia_backend(), reason="Triton without its NVIDIA backend")


def _env(tmp_path: Path, interpret: str) -> dict[str, str]:
    path = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "TRITON_INTERPRET": interpret, "PYTHONPATH": path}


def test_every_launch_compiles_for_sm90(tmp_path):
    recorders = []
    for name, sets, tokens in LAYERS:
        options = [item for value in [*COMMON, *sets] for item in ("--set", value)]
        args = ["build", str(SPEC), "-o", str(tmp_path), "--set", f"name=hc_{name}", *options]
        assert main(args) == 0
        launches = tmp_path / f"{name}.json"
        command = [sys.executable, str(SCRIPT), "record", f"hc_{name}", tokens, str(launches)]
        process = subprocess.Popen(
            command, cwd=tmp_path, env=_env(tmp_path, "1"), stderr=subprocess.PIPE, text=True
        )
        recorders.append((name, process, launches))
    merged = {}
    for name, process, launches in recorders:
        _, err = process.communicate(timeout=600)
        assert process.returncode == 0, f"recording {name} failed:\n{err[-3000:]}"
        for launch in json.loads(launches.read_text()):
            key = json.dumps([launch["kernel"][1], launch["types"], launch["constants"]])
            merged.setdefault(key, launch)
    kernels = {launch["kernel"][1] for launch in merged.values()}
    # every kernel of the runtime's Triton modules but the TMA GEMM's
    assert kernels >= {
        "_router_kernel",
        "_select_topk_kernel",
        "_dispatch_one_launch_kernel",
        "_route_count_kernel",
        "_route_prefix_kernel",
        "_route_layout_kernel",
        "_permute_quant_kernel",
        "_grouped_gemm_kernel",
        "_act_quant_kernel",
        "_combine_kernel",
        "tensor_scale_kernel",
    }, kernels
    every = tmp_path / "launches.json"
    every.write_text(json.dumps(list(merged.values())))
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "compile", str(every)],
        cwd=tmp_path,
        env=_env(tmp_path, "0"),
        capture_output=True,
        text=True,
        timeout=900,
    )
    failures = [line for line in result.stdout.splitlines() if line.startswith("FAILED")]
    assert result.returncode == 0 and not failures, "\n".join(failures) or result.stderr[-3000:]
