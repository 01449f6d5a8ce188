"""The deep_gemm backend at DeepSeek-V3 dims on the GPU (DeepGEMM built from source, see
docs/backends.md) against the torch backend on the same weights and input, with the bounds of
test_layer.py; and the scale-layout converter on the GPU against the CPU."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from moec.runtime.scale_layout import to_mn_major

from .specs import HIDDEN, SCHEMES, SMALL, SMALL_HIDDEN, V3, norm_error
from .test_layer import BOUND

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("deep_gemm") is None, reason="DeepGEMM is not installed"
)

CASES = [
    ("fp8_block", "contiguous", 1),
    ("fp8_block", "contiguous", 2048),
    ("fp8_block", "masked", 64),
    ("bf16", "contiguous", 2048),
    ("bf16", "masked", 64),
]


@pytest.mark.parametrize(("scheme", "layout", "tokens"), CASES)
def test_deep_gemm_layer_equals_torch_backend(load_layer, scheme, layout, tokens):
    overrides = [*SCHEMES[scheme], f"experts.layout={layout}"]
    package = load_layer(V3, "experts.gemm_backend=deep_gemm", *overrides)
    assert [s["backend"] for s in package.PLAN["stages"] if s["kind"] == "gemm"] == [
        "deep_gemm",
        "deep_gemm",
    ]
    layer = package.MoELayer(device="cuda").random_(0)
    assert against_torch_backend(load_layer, V3, overrides, layer, tokens, 5) <= BOUND[scheme]


def against_torch_backend(load_layer, spec, overrides, layer, tokens, seed, hidden=HIDDEN):
    """Norm-wise error of `layer` on a random input against the torch backend's layer of
    `spec` with the same overrides and random weights (its output checked finite)."""
    x = torch.randn(
        tokens, hidden, device="cuda", generator=torch.Generator("cuda").manual_seed(seed)
    )
    x = x.bfloat16()
    out = layer(x)
    torch.cuda.empty_cache()
    reference = load_layer(spec, "experts.gemm_backend=torch", *overrides)
    expected = reference.MoELayer(device="cuda").random_(0)(x)
    assert torch.isfinite(out).all()
    return norm_error(out, expected)


def test_scale_layout_on_the_gpu_equals_the_cpu():
    scale = torch.rand(3, 300, 56) + 0.5
    on_gpu = to_mn_major(scale.cuda())
    assert on_gpu.stride() == to_mn_major(scale).stride()
    assert torch.equal(on_gpu.cpu(), scale)


@pytest.mark.parametrize("tokens", [64, 2048])
def test_auto_layer_splits_its_gemms_by_token_count(load_layer, tokens):
    """gemm_backend auto with the shipped H200 times: Triton GEMMs up to T=1024, DeepGEMM
    above, on one set of weights; each side equals the torch backend."""
    overrides = [*SCHEMES["fp8_block"], "experts.layout=contiguous"]
    package = load_layer(V3, "experts.gemm_backend=auto", *overrides)
    assert package.PLAN["above"]["up_to"] == 1024
    assert package.PLAN["above"]["gemm_backend"] == "deep_gemm"
    layer = package.MoELayer(device="cuda").random_(0)
    error = against_torch_backend(load_layer, V3, overrides, layer, tokens, 7)
    assert error <= BOUND["fp8_block"]


MXFP4 = ["name=gpu_small_mxfp4", "quant.scheme=mxfp4", "quant.checkpoint=quantized"]


@pytest.mark.parametrize("tokens", [64, 2048])
def test_mxfp4_experts_on_deep_gemm_equal_torch_backend(load_layer, tokens):
    """mxfp4 experts stored as exact e4m3 blocks, through DeepGEMM's fp8 GEMMs, against the
    torch backend's mxfp4 layer on the same weights: both quantize activations to e4m3 (1 x 128
    and 1 x 32 groups), each within 2**-3 of unquantized activations (tests/test_quantized.py)."""
    package = load_layer(SMALL, *MXFP4, "experts.gemm_backend=deep_gemm")
    layer = package.MoELayer(device="cuda").random_(0)
    assert layer.w13.dtype == torch.float8_e4m3fn
    error = against_torch_backend(load_layer, SMALL, MXFP4, layer, tokens, 9, hidden=SMALL_HIDDEN)
    assert error <= 2 * 2**-3
