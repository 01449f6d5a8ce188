"""The Triton router (the fp32 weight as three bf16 parts) against an fp64 GEMM of the fp32
weight.

Bound, from the formats: the parts sum to the fp32 weight within one fp32 rounding (2**-24
relative per weight); each product of a bf16 x and a bf16 part is exact in fp32 and the sums
are fp32: per logit |out - ref| <= (3H + 2) * 2**-24 * sum_h |x_h w_h| (3H products summed,
and the weight's rounding)."""

from __future__ import annotations

import pytest
import torch

from moec.runtime.quant import split_bf16x3

from .harness import load

CONFIG = {"BLOCK_T": 16, "BLOCK_E": 32, "BLOCK_K": 64, "num_warps": 4, "num_stages": 1}


def test_three_parts_sum_to_the_weight():
    w = torch.randn(64, 300, dtype=torch.float64).float() * 10.0 ** torch.randint(-3, 3, (64, 1))
    parts = split_bf16x3(w)
    assert parts.dtype == torch.bfloat16 and parts.shape == (3, 64, 300)
    total = parts[0].double() + parts[1].double() + parts[2].double()
    assert ((total - w.double()).abs() <= 2**-24 * w.double().abs()).all()


@pytest.mark.parametrize("programs", [1, 8])
@pytest.mark.parametrize(("tokens", "experts", "hidden"), [(1, 64, 256), (37, 96, 200)])
def test_router_logits_equal_the_fp32_gemm(tokens, experts, hidden, programs):
    """With PROGRAMS = 8 the few output tiles get split K: partial logits per slice, whose sum
    (as select_topk adds them, in fp32) is held to the same bound."""
    kernels = load()
    gen = torch.Generator().manual_seed(tokens)
    x = torch.randn(tokens, hidden, generator=gen).bfloat16()
    w = torch.randn(experts, hidden, generator=gen) / hidden**0.5
    out = kernels.router_logits(x, split_bf16x3(w), config={**CONFIG, "PROGRAMS": programs})
    # 1 token: 2 output tiles, 8 programs -> 4 slices of 64; 37 tokens: 9 tiles, no split
    slices = 4 if (tokens, programs) == (1, 8) else 1
    assert out.dtype == torch.float32 and out.shape == (slices, tokens, experts)
    total = out[0].clone()
    for partial in out[1:]:
        total += partial
    ref = x.double() @ w.double().T
    bound = (3 * hidden + 2) * 2**-24 * (x.double().abs() @ w.double().abs().T)
    assert ((total.double() - ref).abs() <= bound).all()


@pytest.mark.parametrize("programs", [1, 8])
def test_a_bf16_weight_needs_its_first_part_alone(programs):
    """A router weight the checkpoint stores in bf16 splits into itself and two zero parts: the
    router given its first part alone (as the layer passes it, router_parts = 1) writes the
    three parts' logits bit for bit."""
    kernels = load()
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(3, 256, generator=gen).bfloat16()
    w = (torch.randn(64, 256, generator=gen) / 16).bfloat16().float()
    parts = split_bf16x3(w)
    assert not parts[1:].any()
    config = {**CONFIG, "PROGRAMS": programs}
    one = kernels.router_logits(x, parts[:1], config=config)
    three = kernels.router_logits(x, parts, config=config)
    assert torch.equal(one, three)
