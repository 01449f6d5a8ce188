"""The whole generated layer with gemm_backend = "triton" (interpreted on the CPU) against the
same spec built with the torch backend, on the same weights and input.

Both backends implement docs/numerics.md exactly (quantization bytes included; the kernels round
in software where the interpreter's casts do not), so the outputs agree up to fp32 summation
order in the GEMMs: relative error <= 2**-7 of the output norm (one bf16 rounding of the output
plus rare one-ulp flips of a quantized intermediate), and usually exactly.
"""

from __future__ import annotations

import pytest
import torch

SPEC = """
name = "triton_layer"
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
[target]
device = "cpu"
max_num_tokens = 64
"""

SCHEMES = {
    "bf16": [],
    "fp8_per_tensor": ["quant.checkpoint=bf16"],
    "fp8_block": ["quant.checkpoint=bf16"],
    "mxfp8": ["quant.checkpoint=bf16"],
    "mxfp4": ["quant.checkpoint=quantized", "quant.shared_scheme=mxfp8"],
}
ACTIVATIONS = {
    "silu_clamped": ["activation.kind=silu_clamped", "activation.swiglu_limit=1.0"],
    "oai_swiglu": ["activation.kind=oai_swiglu", "activation.limit=1.0"],
    "situ": ["activation.kind=situ", "activation.beta=1.0", "activation.linear_beta=2.0"],
}


def _compare(load_layer, *overrides, tokens=12, seed=0):
    fast = load_layer(SPEC, "experts.gemm_backend=triton", *overrides).MoELayer().random_(seed)
    slow = load_layer(SPEC, "experts.gemm_backend=torch", *overrides).MoELayer().random_(seed)
    x = torch.randn(tokens, 256, generator=torch.Generator().manual_seed(seed + 1)).bfloat16()
    out, expected = fast(x).double(), slow(x).double()
    assert torch.isfinite(out).all()
    return ((out - expected).norm() / expected.norm()).item()


@pytest.mark.parametrize("layout", ["contiguous", "masked"])
@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_triton_layer_equals_torch_backend(load_layer, scheme, layout):
    error = _compare(
        load_layer, f"quant.scheme={scheme}", f"experts.layout={layout}", *SCHEMES[scheme]
    )
    assert error <= 2**-7


@pytest.mark.parametrize("kind", sorted(ACTIVATIONS))
def test_triton_activations_equal_torch_backend(load_layer, kind):
    overrides = ["quant.scheme=fp8_block", "quant.checkpoint=bf16", "experts.layout=contiguous"]
    assert _compare(load_layer, *overrides, *ACTIVATIONS[kind]) <= 2**-7


def test_triton_fused_shared_and_static_scales(load_layer):
    fused = ["quant.scheme=fp8_block", "quant.checkpoint=bf16", "experts.shared_experts=fused"]
    assert _compare(load_layer, *fused, "experts.layout=contiguous") <= 2**-7
    static = [
        "quant.scheme=fp8_per_tensor",
        "quant.activation_scheme=static",
        "quant.checkpoint=quantized",
    ]
    assert _compare(load_layer, *static, "experts.layout=contiguous") <= 2**-7


def test_triton_zero_and_one_token(load_layer):
    fast = load_layer(
        SPEC, "experts.gemm_backend=triton", "quant.scheme=fp8_block", "quant.checkpoint=bf16"
    )
    layer = fast.MoELayer().random_(0)
    assert layer(torch.zeros(0, 256, dtype=torch.bfloat16)).shape == (0, 256)
    overrides = ["quant.scheme=fp8_block", "quant.checkpoint=bf16", "experts.layout=contiguous"]
    assert _compare(load_layer, *overrides, tokens=1) <= 2**-7


@pytest.mark.parametrize("scheme", ["bf16", "fp8_per_tensor", "fp8_block", "mxfp4"])
def test_triton_layer_above_the_one_launch_dispatch(load_layer, scheme):
    """44 tokens, top-3 (and the fused shared expert, but for mxfp4): 132 rows or more, past the
    dispatch's one launch (128); the indices come first, then the tokens are quantized row by
    row, and the gate/up GEMM gathers them (copy-free dispatch)."""
    overrides = [f"quant.scheme={scheme}", "experts.layout=contiguous", *SCHEMES[scheme]]
    overrides.append("model.num_experts_per_tok=3")
    assert _compare(load_layer, *overrides, tokens=44) <= 2**-7
