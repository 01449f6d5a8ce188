"""The generated Triton layer at DeepSeek-V3 dims on the GPU against the torch backend of the same
spec, on the same weights and input.

Bounds (docs/numerics.md, "Comparing two fp8 layers"): bf16 layers differ by fp32 summation order
and one bf16 rounding of each output: 2**-7 norm-wise. fp8 layers quantize their intermediate
after a GEMM whose bf16 output may differ by one bf16 ulp between the backends; an intermediate
value then lands on the neighbouring e4m3 value with probability <= 2**-7 / 2**-3, moving by one
e4m3 ulp (<= 2**-3 relative): rms <= 2**-2 * 2**-3, so 2**-5 + 2**-7 norm-wise.
"""

from __future__ import annotations

import pytest
import torch

from moec.runtime import cuda_graph

from .specs import HIDDEN, SCHEMES, V3, norm_error

CASES = [
    ("fp8_block", "contiguous", 1),
    ("fp8_block", "contiguous", 2048),
    ("fp8_block", "masked", 64),
    ("bf16", "contiguous", 1),
    ("bf16", "contiguous", 2048),
    ("bf16", "masked", 64),
]


BOUND = {"bf16": 2**-7, "fp8_block": 2**-5 + 2**-7}


@pytest.fixture(scope="module")
def layers(load_layer):
    built = {}

    def get(scheme, layout, backend, shared="separate"):
        key = (scheme, layout, backend, shared)
        if key not in built:
            if len(built) >= 2:  # 11-22 GB each at these dims: keep the last two
                built.pop(next(iter(built)))
                torch.cuda.empty_cache()
            overrides = [
                *SCHEMES[scheme],
                f"experts.layout={layout}",
                f"experts.gemm_backend={backend}",
                f"experts.shared_experts={shared}",
            ]
            package = load_layer(V3, *overrides)
            built[key] = package.MoELayer(device="cuda").random_(0)
        return built[key]

    yield get
    built.clear()
    torch.cuda.empty_cache()


@pytest.mark.parametrize(("scheme", "layout", "tokens"), CASES)
def test_triton_layer_equals_torch_backend(layers, scheme, layout, tokens):
    x = torch.randn(
        tokens, HIDDEN, device="cuda", generator=torch.Generator("cuda").manual_seed(tokens)
    )
    x = x.bfloat16()
    out = layers(scheme, layout, "triton")(x)
    expected = layers(scheme, layout, "torch")(x)
    assert torch.isfinite(out).all()
    assert norm_error(out, expected) <= BOUND[scheme]


def test_fused_shared_expert_equals_separate(layers):
    x = torch.randn(256, HIDDEN, device="cuda").bfloat16()
    fused = layers("fp8_block", "contiguous", "triton", "fused")(x)
    separate = layers("fp8_block", "contiguous", "torch", "separate")(x)
    assert norm_error(fused, separate) <= BOUND["fp8_block"]


def test_overlapped_shared_expert_equals_separate(layers):
    """The shared experts on a second stream run the same kernels on the same inputs as the
    separate ones: the same bits, eager and replayed from a CUDA graph (the fork and the join
    captured), at a decode and a prefill size."""
    for tokens in (1, 512):
        x = torch.randn(tokens, HIDDEN, device="cuda").bfloat16()
        separate = layers("fp8_block", "contiguous", "triton")(x)
        layer = layers("fp8_block", "contiguous", "triton", "overlapped")
        assert torch.equal(layer(x), separate)
        replay, out = cuda_graph.capture(lambda: layer(x), warmup=1)  # noqa: B023
        replay()
        torch.cuda.synchronize()
        assert torch.equal(out, separate)


@pytest.mark.parametrize("tokens", [1, 8])
def test_cuda_graph_replay_equals_eager(layers, tokens):
    """At 1 token the router and the selection are one launch, whose arrival counters the
    layer keeps: replayed twice, the graph finds them as the eager calls left them (zero)."""
    layer = layers("fp8_block", "contiguous", "triton")
    x = torch.randn(tokens, HIDDEN, device="cuda").bfloat16()
    eager = layer(x)
    replay, out = cuda_graph.capture(lambda: layer(x), warmup=1)
    for _ in range(2):
        replay()
        torch.cuda.synchronize()
        assert torch.equal(out, eager)
    assert not layer.gate_counters.any()
