"""DeepEP dispatch and combine: the plan (buffer sizes, stages, graph safety) and the generated
stages run on 2 gloo ranks against a CPU stand-in DeepEP (tests/stand_ins/deep_ep, DeepEP V1's
documented semantics over torch.distributed), each layer beside the all2all layer of the same
layout on the same ranks, tokens and weights. The real DeepEP runs in tests/gpu.

Bounds, norm-wise on the bf16 outputs (u = 2**-8, bf16's unit roundoff): normal mode sends the
same rows as all2all and returns bf16 partial sums the same way, so the two differ only in fp32
summation order before the final rounding: 2u. Low-latency combine sums all expert rows in fp32
and rounds, then adds the shared expert and rounds again, where all2all rounds each rank's
partial sum first: ranks + 2 roundings apart, (ranks + 2)u. Quantization before the exchange is
moec's own (normal) or the stand-in's DeepEP formula (low latency, the same amax / 448 scales),
so fp8 layers get the same bounds.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from test_distributed import _run

from moec.plan.deepep import low_latency_rdma_bytes, normal_nvl_bytes

STAND_INS = Path(__file__).resolve().parent / "stand_ins"
SPEC = """
name = "ep"
[model]
hidden_size = 2048
moe_intermediate_size = 256
n_routed_experts = 8
num_experts_per_tok = 3
n_shared_experts = 1
[router]
scoring_func = "sigmoid"
topk_method = "noaux_tc"
n_group = 4
topk_group = 2
norm_topk_prob = true
routed_scaling_factor = 2.0
[experts]
gemm_backend = "torch"
[parallel]
ep_size = 2
[target]
device = "cuda"
arch = "sm90"
max_num_tokens = 16
"""
U = 2.0**-8
FP8 = ["quant.scheme=fp8_block", "quant.checkpoint=bf16"]
NORMAL = ["parallel.dispatch=deepep_normal", "experts.layout=contiguous"]
LOW_LATENCY = ["parallel.dispatch=deepep_low_latency", "parallel.max_tokens_per_rank=16"]
ALL2ALL = {"contiguous": ["parallel.dispatch=all2all", "experts.layout=contiguous"]}
ALL2ALL["masked"] = ["parallel.dispatch=all2all", "experts.layout=masked"]


@pytest.fixture(scope="module")
def stand_ins():
    """deep_ep (and deep_gemm) importable: the stand-ins, for this module's plans and ranks."""
    sys.path.insert(0, str(STAND_INS))
    for name in ("deep_ep", "deep_gemm"):
        sys.modules.pop(name, None)
    yield
    sys.path.remove(str(STAND_INS))
    for name in ("deep_ep", "deep_gemm"):
        sys.modules.pop(name, None)


def _norm_error(out: torch.Tensor, expected: torch.Tensor) -> float:
    out, expected = out.double(), expected.double()
    return ((out - expected).norm() / expected.norm()).item()


# --- the plan ----------------------------------------------------------------------------------


def test_buffer_sizes_follow_deepeps_hints():
    # DeepEP's docs: about 1.78 GiB per rank for 128 tokens at DeepSeek-V3 dims, 256 experts
    assert low_latency_rdma_bytes(128, 7168, 256) / 2**30 == pytest.approx(1.777, abs=1e-3)
    # normal mode, 2 ranks, 24 SMs: 12 channels x 2 peers x 256 tokens of (the row, source meta,
    # 128 int64 ids, 128 fp32 weights, 128 fp32 scales) plus 5 ints of queue heads each
    per_token = 7168 * 2 + 8 + 128 * 8 + 128 * 4 + 128 * 4
    expected = 12 * 2 * 5 * 4 + 12 * 2 * 256 * per_token
    assert normal_nvl_bytes(7168 * 2, 2) == -(-expected // 128) * 128


def test_plans(stand_ins, load_layer):
    normal = load_layer(SPEC, *NORMAL, *FP8).PLAN
    stages = {s["name"]: s for s in normal["stages"]}
    assert stages["quantize"]["backend"] == "torch"  # moec quantizes before the exchange
    assert stages["dispatch"]["backend"] == stages["combine"]["backend"] == "deep_ep"
    assert not stages["dispatch"]["graph_safe"] and stages["dispatch"]["syncs_host"]
    assert stages["dispatch"]["choices"]["buffer"]["sms"] == 24
    decisions = {d["what"]: d["choice"] for d in normal["decisions"]}
    assert decisions["DeepEP buffer"].startswith("NVLink ")
    assert decisions["CUDA graph"].startswith("no")

    low = load_layer(SPEC, *LOW_LATENCY, *FP8, "experts.gemm_backend=triton").PLAN
    stages = {s["name"]: s for s in low["stages"]}
    assert "quantize" not in stages  # DeepEP quantizes as it sends
    assert stages["dispatch"]["fused"] == [] and stages["dispatch"]["graph_safe"]
    scale = stages["dispatch"]["outputs"][0]["type"]["scale"]
    assert (scale["major"], scale["tma_aligned"]) == ("MN", True)
    # Triton reads K-major scales: a converter, visible in the plan
    assert stages["convert_a_for_gemm_gate_up"]["note"] == "transpose scales to K-major"
    decisions = {d["what"]: d["choice"] for d in low["decisions"]}
    assert decisions["CUDA graph"] == "yes"
    assert "low-latency, 16 tokens per rank" in decisions["DeepEP buffer"]


# --- on two gloo ranks ---------------------------------------------------------------------


def test_two_ranks_equal_all2all(stand_ins, load_layer, tmp_path):
    """Each DeepEP layer beside the all2all layer of its layout; rank 0 has 10 tokens, rank 1
    six; in the last case rank 1's experts receive no token."""
    tokens = 16
    x = torch.randn(tokens, 2048, generator=torch.Generator().manual_seed(21)).bfloat16()
    starve_rank_1 = {e: -100.0 for e in range(4, 8)}
    cases = {  # name: (overrides, router bias, reference case, bound)
        "all2all contiguous": (ALL2ALL["contiguous"], {}, None, None),
        "all2all contiguous fp8": ([*ALL2ALL["contiguous"], *FP8], {}, None, None),
        "all2all masked": (ALL2ALL["masked"], {}, None, None),
        "all2all masked fp8": ([*ALL2ALL["masked"], *FP8], {}, None, None),
        "all2all masked starved": (ALL2ALL["masked"], starve_rank_1, None, None),
        "normal": (NORMAL, {}, "all2all contiguous", 2 * U),
        "normal fp8": ([*NORMAL, *FP8], {}, "all2all contiguous fp8", 2 * U),
        "normal fp8 deep_gemm": (
            [*NORMAL, *FP8, "experts.gemm_backend=deep_gemm"],
            {},
            "all2all contiguous fp8",
            2 * U,
        ),
        "low latency": (LOW_LATENCY, {}, "all2all masked", 4 * U),
        "low latency fp8": ([*LOW_LATENCY, *FP8], {}, "all2all masked fp8", 4 * U),
        "low latency fp8 deep_gemm": (
            [*LOW_LATENCY, *FP8, "experts.gemm_backend=deep_gemm"],
            {},
            "all2all masked fp8",
            4 * U,
        ),
        "low latency starved": (LOW_LATENCY, starve_rank_1, "all2all masked starved", 4 * U),
    }
    jobs = [(overrides, False, bias) for overrides, bias, _, _ in cases.values()]
    results = dict(
        zip(cases, _run(load_layer, tmp_path, 2, jobs, x, [0, 10, tokens], SPEC), strict=True)
    )
    for name, (_, _, reference, bound) in cases.items():
        if reference is None:
            continue
        out, expected = torch.cat(results[name]), torch.cat(results[reference])
        assert out.shape == expected.shape == (tokens, 2048)
        assert _norm_error(out, expected) <= bound, name


def test_low_latency_triton_converts_scales(stand_ins, load_layer, tmp_path):
    """Triton GEMMs after DeepEP's low-latency dispatch: its MN-major scales made K-major."""
    x = torch.randn(6, 2048, generator=torch.Generator().manual_seed(22)).bfloat16()
    overrides = [*LOW_LATENCY, *FP8, "experts.gemm_backend=triton"]
    jobs = [(ALL2ALL["masked"] + FP8, False, {}), (overrides, False, {})]
    reference, out = _run(load_layer, tmp_path, 2, jobs, x, [0, 4, 6], SPEC)
    assert _norm_error(torch.cat(out), torch.cat(reference)) <= 4 * U
