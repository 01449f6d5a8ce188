"""combine against an fp64 weighted sum (numerics.md, Combine).

Tolerance (fp32 accumulation of K products and the shared term, then one rounding):
    |out - ref| <= u_out * |ref| + (2 * K + 2) * 2**-24 * (sum_k |w_k * y_k| + |shared|)
"""

from __future__ import annotations

import pytest
import torch

from moec.runtime import grouping

from .harness import load
from .reference import UNIT_ROUNDOFF, is_nan, poison, route

CONFIG = {"BLOCK_T": 8, "BLOCK_H": 256, "num_warps": 4}
HIDDEN = 256


def reference(y, row_of, weights, shared):
    """fp64 sum and the magnitude that bounds its fp32 accumulation error."""
    rows = row_of.long()
    terms = weights.double()[..., None] * y.double()[rows.clamp(min=0)]
    terms[rows < 0] = 0.0
    ref, magnitude = terms.sum(dim=1), terms.abs().sum(dim=1)
    if shared is not None:
        ref, magnitude = ref + shared.double(), magnitude + shared.double().abs()
    return ref, magnitude


# the decode tiles (moec/plan/tuning.py combine_decode_config): one token per program, every
# term of a step loaded at once
DECODE_CONFIG = {"BLOCK_T": 1, "BLOCK_H": 64, "num_warps": 1, "TERMS_AT_ONCE": 16}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("has_shared", [False, True])
@pytest.mark.parametrize("layout", ["contiguous", "masked"])
@pytest.mark.parametrize("topk", [3, 9])  # within one step of loads, and over two
def test_combine(layout, has_shared, dtype, topk):
    check_combine(layout, has_shared, dtype, topk, CONFIG)


@pytest.mark.parametrize(("terms", "topk"), [(16, 9), (8, 12)])  # one step of loads, and two
def test_combine_decode_tiles(terms, topk):
    config = {**DECODE_CONFIG, "TERMS_AT_ONCE": terms}
    check_combine("contiguous", True, torch.bfloat16, topk, config)


def check_combine(layout, has_shared, dtype, topk, config):
    kernels = load()
    tokens = 20
    routing = route(tokens=tokens, topk=topk, experts=12, block_m=16)
    gen = torch.Generator().manual_seed(3)
    if layout == "contiguous":
        y = torch.randn(len(routing.m_indices), HIDDEN, generator=gen).to(dtype)
        row_of = routing.row_of
    else:
        y = torch.randn(12, routing.max_m, HIDDEN, generator=gen).to(dtype)
        row_of = routing.masked_row_of
    row_of = row_of.clone()
    row_of[3, 1] = -1  # an assignment without a local row adds nothing
    weights = torch.rand(tokens, topk, generator=gen)
    shared = torch.randn(tokens, HIDDEN, generator=gen).to(dtype) if has_shared else None
    out = poison(torch.empty(tokens, HIDDEN, dtype=dtype))
    kernels.combine(y, row_of, weights, out, shared, config=config)
    ref, magnitude = reference(y.view(-1, HIDDEN), row_of, weights, shared)
    assert not is_nan(out).any()
    bound = UNIT_ROUNDOFF[dtype] * ref.abs() + (2 * topk + 2) * 2.0**-24 * magnitude
    assert ((out.double() - ref).abs() <= bound).all()


def test_no_tokens():
    kernels = load()
    y = torch.randn(32, HIDDEN).bfloat16()
    out = torch.empty(0, HIDDEN, dtype=torch.bfloat16)
    row_of, weights = torch.empty(0, 2, dtype=torch.int32), torch.empty(0, 2)
    kernels.combine(y, row_of, weights, out, config=CONFIG)


@pytest.mark.parametrize("has_shared", [False, True])
def test_torch_weighted_rows(has_shared):
    """The torch runtime's weighted sum (the expert-parallel combine's torch backend) within the
    same bound, rows -1 adding nothing."""
    tokens, topk = 20, 3
    routing = route(tokens=tokens, topk=topk, experts=12, block_m=16)
    gen = torch.Generator().manual_seed(5)
    y = torch.randn(len(routing.m_indices), HIDDEN, generator=gen).bfloat16()
    row_of = routing.row_of.clone()
    row_of[3, 1] = row_of[7, 0] = -1
    weights = torch.rand(tokens, topk, generator=gen)
    shared = torch.randn(tokens, HIDDEN, generator=gen).bfloat16() if has_shared else None
    out = grouping.weighted_rows(y, row_of, weights, shared, torch.bfloat16)
    ref, magnitude = reference(y, row_of, weights, shared)
    bound = UNIT_ROUNDOFF[torch.bfloat16] * ref.abs() + (2 * topk + 2) * 2.0**-24 * magnitude
    assert ((out.double() - ref).abs() <= bound).all()
