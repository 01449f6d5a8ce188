"""Quantized schemes against a float64 reference built from the dequantized stored weights.

Two references per scheme (tests/numerics_ref.py, independent of moec's code):
- emulated: activations quantized in float64 exactly as docs/numerics.md defines. The layer
  differs only by fp32 accumulation and rounding its bf16 GEMM outputs; rare one-ulp e4m3 flips
  of the intermediate follow. Bound: norm-wise relative error <= 2**-7 (two bf16 roundings,
  u = 2**-8 each, with margin for the flips).
- unquantized: activations kept in float64. Each e4m3 rounding moves an element by at most
  u = 2**-4 relative (3 mantissa bits); the layer quantizes twice (expert input and
  intermediate), so the norm-wise relative error is bounded by 2u = 2**-3 (observed ~u/2).
bf16 weights: the unquantized reference differs only by bf16 roundings: 2**-6.
"""

from __future__ import annotations

import numerics_ref as ref
import pytest
import torch

SPEC = """
name = "quantized"
[model]
hidden_size = 256
moe_intermediate_size = 128
n_routed_experts = 8
num_experts_per_tok = 3
n_shared_experts = 1
[router]
scoring_func = "softmax"
[experts]
gemm_backend = "torch"
[target]
device = "cpu"
dtype = "bfloat16"
max_num_tokens = 64
"""

SCHEMES = {
    "bf16": ([], None, False),
    "fp8_per_tensor": (["quant.checkpoint=bf16"], None, False),
    "fp8_block": (["quant.checkpoint=bf16"], 128, False),
    "fp8_block_ue8m0": (["quant.checkpoint=bf16", "quant.scale_dtype=ue8m0"], 128, True),
    "mxfp8": (["quant.checkpoint=bf16"], 32, True),
    "mxfp4": (["quant.checkpoint=quantized"], 32, True),
}


def _norm_error(out: torch.Tensor, expected: torch.Tensor) -> float:
    return ((out.double() - expected).norm() / expected.norm()).item()


def _reference(layer, stages, x, scheme, group, pow2, quantize, act_kind="silu", act_params=None):
    """float64 output of the layer's experts for x, with the layer's own routing."""
    base = scheme.replace("_ue8m0", "")
    weights, ids = stages.select(stages.router(x, layer.gate_weight))
    inter = layer.w13.shape[1] // 2

    def quant(v):
        return ref.quantize_groups(v, group, pow2) if quantize and base != "bf16" else v

    def act(g, u):
        return ref.activation(act_kind, act_params or {}, g, u)

    x64 = quant(x.double())  # per row groups, or one scale over all T tokens
    experts = []
    for e in range(layer.w13.shape[0]):
        tokens, slot = (ids == e).nonzero(as_tuple=True)
        if tokens.numel() == 0:
            continue
        w13 = ref.dequant(layer.w13[e], getattr(layer, "w13_scale", [None] * 99)[e], base)
        w2 = ref.dequant(layer.w2[e], getattr(layer, "w2_scale", [None] * 99)[e], base)
        h = (x64[tokens] @ w13.T).to(torch.bfloat16).double()  # GEMM output in bf16
        experts.append((tokens, slot, act(h[:, :inter], h[:, inter:]), w2))
    # The intermediate is quantized per row group, or with one scale over all experts' rows.
    quantized = quant(torch.cat([g for _, _, g, _ in experts]))
    out = torch.zeros_like(x64)
    start = 0
    for tokens, slot, g, w2 in experts:
        y = quantized[start : start + g.shape[0]] @ w2.T
        start += g.shape[0]
        out.index_add_(0, tokens, y * weights[tokens, slot].double()[:, None])
    return out


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_routed_experts_match_float64_reference(load_layer, scheme):
    extra, group, pow2 = SCHEMES[scheme]
    base = scheme.replace("_ue8m0", "")
    package = load_layer(SPEC, f"quant.scheme={base}", "model.n_shared_experts=0", *extra)
    stages = __import__(f"{package.__name__}.stages", fromlist=["stages"])
    layer = package.MoELayer().random_(3)
    x = torch.randn(24, 256, generator=torch.Generator().manual_seed(4)).bfloat16()
    out = layer(x)
    emulated = _reference(layer, stages, x, scheme, group, pow2, quantize=True)
    unquantized = _reference(layer, stages, x, scheme, group, pow2, quantize=False)
    if base == "bf16":
        assert _norm_error(out, unquantized) <= 2**-6
    else:
        assert _norm_error(out, emulated) <= 2**-7
        assert _norm_error(out, unquantized) <= 2**-3


@pytest.mark.parametrize(
    "kind, params",
    [
        ("silu_clamped", {"swiglu_limit": 0.5}),
        ("oai_swiglu", {"alpha": 1.702, "limit": 0.5}),
        ("situ", {"beta": 0.5, "linear_beta": 2.0}),
    ],
)
def test_activations_match_float64_reference(load_layer, kind, params):
    sets = [f"activation.kind={kind}"] + [f"activation.{k}={v}" for k, v in params.items()]
    package = load_layer(
        SPEC, "quant.scheme=fp8_block", "quant.checkpoint=bf16", "model.n_shared_experts=0", *sets
    )
    stages = __import__(f"{package.__name__}.stages", fromlist=["stages"])
    layer = package.MoELayer().random_(5)
    x = (4 * torch.randn(24, 256, generator=torch.Generator().manual_seed(6))).bfloat16()
    out = layer(x)
    emulated = _reference(layer, stages, x, "fp8_block", 128, False, True, kind, params)
    assert _norm_error(out, emulated) <= 2**-7


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_overlapped_shared_experts_equal_separate(load_layer, backend):
    """Overlapped shared experts are the separate ones issued first, on a second stream (on the
    CPU: in order): the same kernels on the same inputs, the same bits."""
    options = ("model.n_shared_experts=2", "quant.checkpoint=bf16", "quant.scheme=fp8_block")
    options += (f"experts.gemm_backend={backend}",)
    separate = load_layer(SPEC, *options, "experts.shared_experts=separate").MoELayer().random_(7)
    overlapped = load_layer(SPEC, *options, "experts.shared_experts=overlapped").MoELayer()
    overlapped.random_(7)
    x = torch.randn(5, 256, generator=torch.Generator().manual_seed(8)).bfloat16()
    assert torch.equal(overlapped(x), separate(x))


def test_fused_shared_experts_equal_separate(load_layer):
    """Fused shared experts (extra experts of weight 1) compute the same layer as separate."""
    separate = load_layer(SPEC, "model.n_shared_experts=2").MoELayer().random_(7)
    fused = (
        load_layer(SPEC, "model.n_shared_experts=2", "experts.shared_experts=fused")
        .MoELayer()
        .random_(7)
    )
    x = torch.randn(16, 256, generator=torch.Generator().manual_seed(8)).bfloat16()
    a, b = separate(x).double(), fused(x).double()
    assert (a - b).norm() / a.norm() <= 2**-7  # the same math, summed in another order
