"""gate: the router and the selection in one launch (the last program of each token tile to
finish selects its tokens) against the two launches it replaces, router_logits then
select_topk, on the same tiles: the same logits added in the same order, so the same experts
and the same weights, bit for bit. Softmax scores divide by a sum over the E experts whose
order follows the warps of the program (the router's 4, select_topk's 1): two fp32 sums of E
terms differ by at most 2 (E - 1) ulps relative, and the quotient by one more rounding. The
arrival counters are left zero for the next launch."""

from __future__ import annotations

import pytest
import torch

from moec.runtime.quant import split_bf16x3

from .harness import load

DEEPSEEK = dict(
    scoring_func="sigmoid",
    topk_method="noaux_tc",
    n_group=8,
    topk_group=4,
    top_k=6,
    norm_topk_prob=True,
    routed_scaling_factor=2.5,
    fused_shared=1,
)
GREEDY = dict(
    scoring_func="softmax",
    topk_method="greedy",
    n_group=1,
    topk_group=1,
    top_k=4,
    norm_topk_prob=False,
    routed_scaling_factor=1.0,
    fused_shared=0,
)


def _router(tokens, experts, hidden, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=gen).bfloat16()
    w = torch.randn(experts, hidden, generator=gen) / hidden**0.5
    bias = 0.1 * torch.randn(experts, generator=gen)
    return x, split_bf16x3(w), bias


# tokens, experts, router tiles: one token tile split over 4 K slices and 2 expert tiles; three
# token tiles (the last one partial), each the last arrival of its own 2 x 2 programs; no split
@pytest.mark.parametrize(("tokens", "block_t", "programs"), [(1, 16, 8), (5, 2, 12), (3, 16, 1)])
@pytest.mark.parametrize("choice", [DEEPSEEK, GREEDY], ids=["noaux_tc", "greedy"])
def test_one_launch_equals_router_then_select(tokens, block_t, programs, choice):
    kernels = load()
    experts, hidden = 64, 256
    x, parts, bias = _router(tokens, experts, hidden, seed=tokens)
    bias = bias if choice["topk_method"] == "noaux_tc" else None
    config = {"BLOCK_T": block_t, "BLOCK_E": 32, "BLOCK_K": 64, "PROGRAMS": programs,
              "num_warps": 4, "num_stages": 1}  # fmt: skip
    counters = torch.zeros(8, dtype=torch.int32)
    logits = kernels.router_logits(x, parts, config=config)
    want_weights, want_ids = kernels.select_topk(logits, bias, **choice)
    rtol = (2 * experts + 2) * 2**-24 if choice["scoring_func"] == "softmax" else 0.0
    for _ in range(2):  # the counters the first launch leaves serve the second
        weights, ids = kernels.gate(x, parts, bias, counters, config=config, one_launch=8, **choice)
        assert torch.equal(ids, want_ids)
        assert torch.allclose(weights, want_weights, rtol=rtol, atol=0.0)
        assert not counters.any()


@pytest.mark.parametrize("ties", ["twin_experts", "zero_tokens"])
@pytest.mark.parametrize("choice", [DEEPSEEK, GREEDY], ids=["noaux_tc", "greedy"])
def test_one_launch_breaks_ties_as_select(ties, choice):
    """The one launch finds the top-k by a sort, select_topk by repeated argmax: among equal
    values both take the lower expert first (twin experts: pairs of equal logits; zero tokens:
    every logit equal)."""
    kernels = load()
    x, parts, bias = _router(3, 64, 128, seed=9)
    if ties == "twin_experts":
        parts[:, 1::2] = parts[:, 0::2]
    else:
        x[1:] = 0.0
    bias = bias if choice["topk_method"] == "noaux_tc" else None
    config = {"BLOCK_T": 16, "BLOCK_E": 32, "BLOCK_K": 64, "PROGRAMS": 4, "num_warps": 4}
    counters = torch.zeros(1, dtype=torch.int32)
    logits = kernels.router_logits(x, parts, config=config)
    _, want_ids = kernels.select_topk(logits, bias, **choice)
    _, ids = kernels.gate(x, parts, bias, counters, config=config, one_launch=8, **choice)
    assert torch.equal(ids, want_ids)


def test_above_one_launch_is_router_then_select():
    """Past one_launch tokens the counters are not touched (even too few of them are fine)."""
    kernels = load()
    x, parts, bias = _router(6, 64, 128, seed=6)
    config = {"BLOCK_T": 2, "BLOCK_E": 64, "BLOCK_K": 64, "PROGRAMS": 4, "num_warps": 4}
    counters = torch.zeros(1, dtype=torch.int32)
    weights, ids = kernels.gate(x, parts, bias, counters, config=config, one_launch=4, **DEEPSEEK)
    logits = kernels.router_logits(x, parts, config=config)
    want_weights, want_ids = kernels.select_topk(logits, bias, **DEEPSEEK)
    assert torch.equal(ids, want_ids) and torch.equal(weights, want_weights)
    with pytest.raises(ValueError, match="3 token tiles need as many counters, got 1"):
        kernels.gate(x, parts, bias, counters, config=config, one_launch=8, **DEEPSEEK)


def test_one_launch_of_a_bf16_weight_reads_its_first_part():
    """A bf16 router weight is its first part alone (router_parts = 1): the one launch on that
    part chooses what it chooses on all three parts, with the same weights, bit for bit."""
    kernels = load()
    x, parts, bias = _router(2, 64, 128, seed=4)
    parts = split_bf16x3(parts[0].float())
    config = {"BLOCK_T": 16, "BLOCK_E": 32, "BLOCK_K": 64, "PROGRAMS": 4, "num_warps": 4}
    counters = torch.zeros(1, dtype=torch.int32)
    one = kernels.gate(x, parts[:1], bias, counters, config=config, one_launch=8, **DEEPSEEK)
    three = kernels.gate(x, parts, bias, counters, config=config, one_launch=8, **DEEPSEEK)
    assert torch.equal(one[0], three[0]) and torch.equal(one[1], three[1])
