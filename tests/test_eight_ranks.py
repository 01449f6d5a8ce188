"""Expert parallelism at production width on the CPU: EP=8 on 8 gloo ranks (all2all, and DeepEP
normal and low-latency through the stand-in of tests/stand_ins/deep_ep) equals the one-rank
layer on the same tokens and weights. Small dims; DeepSeek-V3 dims on eight GPUs are issue 13's
GPU run.

Bound, norm-wise on bf16 outputs (u = 2**-8): each rank rounds its partial sum to bf16 before
the token's rank adds the partials (all2all, DeepEP normal), or DeepEP's combine rounds once and
the shared expert is added after (low latency): at most ranks + 2 roundings, (8 + 2)u. fp8
layers quantize the same values the same way on one rank and on eight.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from test_distributed import _run

STAND_INS = Path(__file__).resolve().parent / "stand_ins"
SPEC = """
name = "ep8"
[model]
hidden_size = 2048
moe_intermediate_size = 128
n_routed_experts = 16
num_experts_per_tok = 4
n_shared_experts = 1
[router]
scoring_func = "sigmoid"
topk_method = "noaux_tc"
n_group = 4
topk_group = 2
norm_topk_prob = true
routed_scaling_factor = 2.5
[experts]
gemm_backend = "torch"
[target]
device = "cuda"
arch = "sm90"
max_num_tokens = 8
"""
FP8 = ["quant.scheme=fp8_block", "quant.checkpoint=bf16"]
EP8 = ["parallel.ep_size=8"]
CASES = {
    "all2all contiguous fp8": ["parallel.dispatch=all2all", "experts.layout=contiguous", *FP8],
    "all2all masked": ["parallel.dispatch=all2all", "experts.layout=masked"],
    "deepep normal fp8": ["parallel.dispatch=deepep_normal", *FP8],
    "deepep low latency fp8": [
        "parallel.dispatch=deepep_low_latency",
        "parallel.max_tokens_per_rank=8",
        *FP8,
    ],
}


@pytest.fixture(scope="module")
def stand_in_deep_ep():
    sys.path.insert(0, str(STAND_INS))
    sys.modules.pop("deep_ep", None)
    yield
    sys.path.remove(str(STAND_INS))
    sys.modules.pop("deep_ep", None)


def test_eight_ranks_equal_one(stand_in_deep_ep, load_layer, tmp_path):
    """30 tokens over 8 ranks, unevenly (rank 2 has none, rank 5 has 8)."""
    split = [0, 4, 7, 7, 11, 14, 22, 26, 30]
    x = torch.randn(split[-1], 2048, generator=torch.Generator().manual_seed(31)).bfloat16()
    jobs = [([*EP8, *overrides], False, {}) for overrides in CASES.values()]
    results = _run(load_layer, tmp_path, 8, jobs, x, split, SPEC)
    for (name, overrides), outputs in zip(CASES.items(), results, strict=True):
        one_rank = [o for o in overrides if o in FP8 or o.startswith("experts.")]
        expected = load_layer(SPEC, *one_rank).MoELayer().random_(11)(x).double()
        out = torch.cat(outputs).double()
        assert out.shape == expected.shape
        error = ((out - expected).norm() / expected.norm()).item()
        assert error <= 10 * 2**-8, f"{name}: {error:.3g}"
