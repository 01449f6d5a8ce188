"""The Triton hash selection (moec/runtime/triton_hash.py) against torch_select.select_hash:
the same experts (the table's rows) and weights within fp32 rounding of the scores, for every
scoring function, split-K partial logits, fused shared experts and repeated token ids."""

from __future__ import annotations

import pytest
import torch

from moec.runtime import torch_select, triton_hash

from .harness import DEVICE, on_device

# where MOEC_KERNEL_DEVICE says (the tests build CPU tensors; on_device copies them there)
select_hash = triton_hash.select_hash if DEVICE == "cpu" else on_device(triton_hash.select_hash)

EXPERTS, TOP_K, VOCAB = 24, 4, 50  # E not a power of two: the masked lanes count


def _table(generator) -> torch.Tensor:
    draws = torch.rand(VOCAB, EXPERTS, generator=generator)
    return draws.argsort(dim=1)[:, :TOP_K].to(torch.int32)


@pytest.mark.parametrize("scoring_func", ["sqrtsoftplus", "sigmoid", "softmax"])
@pytest.mark.parametrize(("slices", "fused_shared"), [(1, 0), (3, 1)])
def test_equals_torch(scoring_func, slices, fused_shared):
    generator = torch.Generator().manual_seed(slices)
    partials = torch.randn(slices, 9, EXPERTS, generator=generator)
    token_ids = torch.randint(0, VOCAB, (9,), generator=generator)
    token_ids[4:7] = token_ids[3]  # repeated ids
    table = _table(generator)
    options = dict(
        scoring_func=scoring_func,
        norm_topk_prob=scoring_func != "softmax",
        routed_scaling_factor=1.5,
        fused_shared=fused_shared,
    )
    weights, ids = select_hash(partials, token_ids, table, **options)
    logits = partials[0].clone()
    for s in range(1, slices):  # in slice order, as the kernel adds them
        logits += partials[s]
    expected_weights, expected_ids = torch_select.select_hash(logits, token_ids, table, **options)
    assert torch.equal(ids, expected_ids)
    assert torch.equal(ids[4:7], ids[3:4].expand(3, -1))
    # sigmoid / sqrtsoftplus: a score is one elementwise function of one logit, a few ulps of
    # fp32 apart. softmax: exp(x - max) on a GPU is exp2 of a rounded product, |x - max| ulps
    # off (plus 2 for the approximate exp2), summed over E terms in another order, and divided:
    # 2 * (span + 2) + E ulps, span the largest logit range of a token.
    ulps = 8.0
    if scoring_func == "softmax":
        span = (logits.max(dim=1).values - logits.min(dim=1).values).max().item()
        ulps = 2 * (span + 2) + EXPERTS
    assert torch.allclose(weights, expected_weights, rtol=ulps * 2.0**-24, atol=0)


def test_int32_ids_and_no_tokens():
    generator = torch.Generator().manual_seed(2)
    table = _table(generator)
    logits = torch.randn(5, EXPERTS, generator=generator)
    token_ids = torch.randint(0, VOCAB, (5,), generator=generator)
    options = dict(
        scoring_func="sigmoid", norm_topk_prob=True, routed_scaling_factor=1.0, fused_shared=0
    )
    wide = select_hash(logits, token_ids, table, **options)
    narrow = select_hash(logits, token_ids.to(torch.int32), table, **options)
    assert all(torch.equal(a, b) for a, b in zip(wide, narrow, strict=True))
    weights, ids = select_hash(logits[:0], token_ids[:0], table, **options)
    assert weights.shape == ids.shape == (0, TOP_K)
