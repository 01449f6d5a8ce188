"""Expert and tensor parallelism over NCCL at DeepSeek-V3 dims (fp8_block): EP=2 (all2all) and
TP=2 on two GPUs equal the one-GPU layer on the same tokens and weights.

Bound: the same values are quantized the same way on one GPU and on two; the two-GPU outputs
add partial sums sent in bf16, so they differ by fp32 summation order and two bf16 roundings
(each u = 2**-8): 2**-7 norm-wise.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from . import nccl_worker
from .specs import HIDDEN, SCHEMES, V3, norm_error

FP8 = SCHEMES["fp8_block"]
CASES = {
    "ep2-all2all-triton": (["parallel.dispatch=all2all", "parallel.ep_size=2"], False),
    "ep2-all2all-triton-masked": (
        ["parallel.dispatch=all2all", "parallel.ep_size=2", "experts.layout=masked"],
        False,
    ),
    "tp2-triton": (["parallel.tp_size=2", "experts.layout=contiguous"], True),
}


@pytest.mark.gpus(2)
@pytest.mark.parametrize("tokens_per_rank", [64, 512])
def test_two_gpus_equal_one(load_layer, tmp_path, tokens_per_rank):
    jobs, names = [], []
    for name, (overrides, replicated) in CASES.items():
        package = load_layer(V3, *FP8, "experts.gemm_backend=triton", *overrides)
        jobs.append((str(Path(package.__file__).parent), package.__name__, replicated))
        names.append(name)
    tokens = 2 * tokens_per_rank
    x = torch.randn(tokens, HIDDEN, generator=torch.Generator().manual_seed(7)).bfloat16()
    split = [0, tokens_per_rank, tokens]
    out_file = str(tmp_path / "out")
    os.environ.update(nccl_worker.MULTICAST_OFF)
    mp.start_processes(
        nccl_worker.run_layers,
        args=(2, str(tmp_path / "init"), jobs, x, split, out_file),
        nprocs=2,
        start_method="spawn",
    )
    ranks = [torch.load(f"{out_file}.{rank}") for rank in range(2)]
    one = load_layer(V3, *FP8, "experts.gemm_backend=triton").MoELayer(device="cuda").random_(11)
    expected = one(x.cuda()).cpu()
    report = {}
    for index, name in enumerate(names):
        replicated = CASES[name][1]
        outs = [rank["outputs"][index] for rank in ranks]
        out = outs[0] if replicated else torch.cat(outs)
        error = norm_error(out, expected)
        report[name] = {"error": error, "ms_per_rank": [rank["times"][index] for rank in ranks]}
        assert error <= 2**-7, f"{name}: {error:.3g}"
    folder = os.environ.get("MOEC_GPU_REPORT")
    if folder:
        path = Path(folder) / f"parallel-T{tokens_per_rank}.json"
        path.write_text(json.dumps(report, indent=2) + "\n")


DEEPEP_CASES = {  # name: (overrides, bound against one GPU)
    "ep2-all2all-deep_gemm": (
        [
            "parallel.dispatch=all2all",
            "experts.gemm_backend=deep_gemm",
            "experts.layout=contiguous",
        ],
        2**-7,
    ),
    "ep2-deepep-normal-triton": (
        ["parallel.dispatch=deepep_normal", "experts.layout=contiguous"],
        2**-7,
    ),
    "ep2-deepep-normal-deep_gemm": (
        ["parallel.dispatch=deepep_normal", "experts.gemm_backend=deep_gemm"],
        2**-7,
    ),
    # DeepEP quantizes the tokens itself (its own amax / 448 arithmetic): one fp8 layer against
    # another, the fp8_block bound of docs/numerics.md
    "ep2-deepep-ll-triton": (["parallel.dispatch=deepep_low_latency"], 2**-5 + 2**-7),
    "ep2-deepep-ll-deep_gemm": (
        ["parallel.dispatch=deepep_low_latency", "experts.gemm_backend=deep_gemm"],
        2**-5 + 2**-7,
    ),
}


@pytest.mark.gpus(2)
def test_deepep_two_gpus_equal_one(load_layer, tmp_path):
    """DeepEP normal and low-latency dispatch on two GPUs (64 tokens per rank), Triton and
    DeepGEMM experts, and all2all into DeepGEMM, against the one-GPU layer; low-latency layers
    also replayed from a CUDA graph, which must give the eager output bit for bit."""
    pytest.importorskip("deep_ep")
    pytest.importorskip("deep_gemm")
    jobs, names = [], []
    for name, (overrides, _) in DEEPEP_CASES.items():
        backend = [] if "deep_gemm" in name else ["experts.gemm_backend=triton"]
        package = load_layer(
            V3,
            *FP8,
            "parallel.ep_size=2",
            "parallel.max_tokens_per_rank=128",
            "target.max_num_tokens=128",
            *backend,
            *overrides,
        )
        jobs.append((str(Path(package.__file__).parent), package.__name__, False))
        names.append(name)
    tokens = 128
    x = torch.randn(tokens, HIDDEN, generator=torch.Generator().manual_seed(8)).bfloat16()
    out_file = str(tmp_path / "out")
    os.environ.update(nccl_worker.MULTICAST_OFF)
    mp.start_processes(
        nccl_worker.run_layers,
        args=(2, str(tmp_path / "init"), jobs, x, [0, 64, tokens], out_file),
        nprocs=2,
        start_method="spawn",
    )
    ranks = [torch.load(f"{out_file}.{rank}") for rank in range(2)]
    one = load_layer(V3, *FP8, "experts.gemm_backend=triton").MoELayer(device="cuda").random_(11)
    expected = one(x.cuda()).cpu()
    report, failures = {}, []
    for index, name in enumerate(names):
        error = norm_error(torch.cat([rank["outputs"][index] for rank in ranks]), expected)
        graphs = [rank["graphs"][index] for rank in ranks]
        report[name] = {
            "error": error,
            "ms_per_rank": [rank["times"][index] for rank in ranks],
            "graph": graphs,
        }
        if error > DEEPEP_CASES[name][1]:
            failures.append(f"{name}: {error:.3g}")
        if "-ll-" in name and not all(g and g["equal"] for g in graphs):
            failures.append(f"{name}: the CUDA graph replay differs from eager: {graphs}")
    folder = os.environ.get("MOEC_GPU_REPORT")
    if folder:
        (Path(folder) / "deepep-T64.json").write_text(json.dumps(report, indent=2) + "\n")
    assert not failures, failures
