"""select_topk and route_layout against plain torch (the torch backend's select and route).

The chosen expert sets, their weights (fp32: equal up to the order of an 8-term sum) and every
index of the layout (row_of, token_of_row, m_indices, counts, starts, ends, num_rows) must match;
the layout is deterministic (token order within an expert), so indices match exactly.
"""

from __future__ import annotations

import pytest
import torch

from moec.plan.build import ONE_LAUNCH_ROUTE
from moec.runtime import grouping
from moec.runtime.grouping import compact_rows

from .harness import load


def torch_select(logits, bias, scoring, method, n_group, topk_group, top_k, normalize, scale):
    if scoring == "softmax":
        scores = logits.softmax(-1)
    elif scoring == "sigmoid":
        scores = logits.sigmoid()
    else:
        scores = torch.nn.functional.softplus(logits).sqrt()
    choice = scores + bias if bias is not None else scores
    tokens, experts = logits.shape
    if method != "greedy" and n_group > 1:
        grouped = choice.view(tokens, n_group, experts // n_group)
        if method == "noaux_tc":
            group_scores = grouped.topk(2, -1).values.sum(-1)
        else:
            group_scores = grouped.amax(-1)
        kept = group_scores.topk(topk_group, -1).indices
        mask = torch.zeros_like(group_scores).scatter_(1, kept, 1.0)
        mask = mask.unsqueeze(-1).expand(-1, -1, experts // n_group).reshape(tokens, experts)
        choice = choice.masked_fill(mask == 0, float("-inf"))
    ids = choice.topk(top_k, -1).indices
    weights = scores.gather(1, ids)
    if normalize:
        weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
    return weights * scale, ids


CASES = [
    ("sigmoid", "noaux_tc", 8, 4, 8, True, 2.5, True),  # DeepSeek-V3 shape of routing
    ("softmax", "greedy", 1, 1, 6, False, 1.0, False),  # V2-Lite
    ("softmax", "group_limited_greedy", 8, 3, 6, False, 16.0, False),  # V2
    ("sqrtsoftplus", "noaux_tc", 1, 1, 6, True, 1.5, True),  # V4-style, no groups
]


@pytest.mark.parametrize(
    "scoring, method, n_group, topk_group, top_k, normalize, scale, bias", CASES
)
@pytest.mark.parametrize("experts", [64, 160])
def test_select_topk(scoring, method, n_group, topk_group, top_k, normalize, scale, bias, experts):
    kernels = load()
    gen = torch.Generator().manual_seed(experts)
    logits = torch.randn(37, experts, generator=gen)
    b = 0.1 * torch.randn(experts, generator=gen) if bias else None
    weights, ids = kernels.select_topk(
        logits,
        b,
        scoring_func=scoring,
        topk_method=method,
        n_group=n_group,
        topk_group=topk_group,
        top_k=top_k,
        norm_topk_prob=normalize,
        routed_scaling_factor=scale,
        fused_shared=1,
    )
    assert ids.shape == weights.shape == (37, top_k + 1)
    expected_w, expected_ids = torch_select(
        logits, b, scoring, method, n_group, topk_group, top_k, normalize, scale
    )
    ours = ids[:, :top_k].long()
    assert torch.equal(ours.sort(-1).values, expected_ids.sort(-1).values)
    order, expected_order = ours.argsort(-1), expected_ids.argsort(-1)
    got = weights[:, :top_k].gather(1, order)
    want = expected_w.gather(1, expected_order)
    assert torch.allclose(got, want, rtol=8 * 2**-24, atol=0)
    assert (ids[:, top_k] == experts).all() and (weights[:, top_k] == 1.0).all()  # fused shared


@pytest.mark.parametrize(
    "method, experts, n_group, topk_group",
    [("noaux_tc", 96, 3, 2), ("group_limited_greedy", 96, 6, 4), ("noaux_tc", 160, 5, 3)],
)
def test_select_topk_groups_not_a_power_of_two(method, experts, n_group, topk_group):
    """A group count that is not a power of two (tl.arange takes only those): the groups are
    held in the next power of two, the extra ones never kept."""
    kernels = load()
    gen = torch.Generator().manual_seed(n_group)
    logits = torch.randn(11, experts, generator=gen)
    bias = 0.1 * torch.randn(experts, generator=gen)
    options = (method, n_group, topk_group, 4, True, 2.5)
    weights, ids = kernels.select_topk(
        logits,
        bias,
        scoring_func="sigmoid",
        topk_method=method,
        n_group=n_group,
        topk_group=topk_group,
        top_k=4,
        norm_topk_prob=True,
        routed_scaling_factor=2.5,
        fused_shared=0,
    )
    expected_w, expected_ids = torch_select(logits, bias, "sigmoid", *options)
    assert torch.equal(ids.long().sort(-1).values, expected_ids.sort(-1).values)
    order, expected_order = ids.long().argsort(-1), expected_ids.argsort(-1)
    got, want = weights.gather(1, order), expected_w.gather(1, expected_order)
    assert torch.allclose(got, want, rtol=8 * 2**-24, atol=0)


@pytest.mark.parametrize("slices, fused_shared", [(3, 0), (9, 2), (28, 1)])
def test_select_topk_partial_logits(slices, fused_shared):
    """Partial logits [S, T, E] of a split-K router are added in slice order (S beyond one
    step of loads, and not a multiple of it), then selected as one logits tensor; no fused
    shared expert, or two of them after the routed ones."""
    kernels = load()
    gen = torch.Generator().manual_seed(slices)
    partials = torch.randn(slices, 5, 64, generator=gen)
    logits = partials[0].clone()
    for part in partials[1:]:  # in order, as the kernel adds them
        logits += part
    bias = 0.1 * torch.randn(64, generator=gen)
    options = dict(
        scoring_func="sigmoid",
        topk_method="noaux_tc",
        n_group=8,
        topk_group=4,
        top_k=6,
        norm_topk_prob=True,
        routed_scaling_factor=2.5,
        fused_shared=fused_shared,
    )
    weights, ids = kernels.select_topk(partials, bias, **options)
    want_weights, want_ids = kernels.select_topk(logits, bias, **options)
    assert torch.equal(ids, want_ids) and torch.equal(weights, want_weights)
    assert ids.shape == (5, 6 + fused_shared)
    expected_w, expected_ids = torch_select(logits, bias, "sigmoid", "noaux_tc", 8, 4, 6, True, 2.5)
    assert torch.equal(ids[:, :6].long().sort(-1).values, expected_ids.sort(-1).values)
    assert (ids[:, 6:] == 64 + torch.arange(fused_shared)).all() and (weights[:, 6:] == 1).all()


def torch_route(topk_ids, experts, layout, block_m, spare=0):
    """The layout by a stable sort (masked: `spare` rows past the last expert's slots, for an
    expert that may take more than max_m)."""
    tokens, top_k = topk_ids.shape
    flat = topk_ids.reshape(-1).long()
    order = torch.argsort(flat, stable=True)
    sorted_experts = flat[order]
    counts = torch.bincount(flat, minlength=experts)
    first = torch.cumsum(counts, 0) - counts
    rank = torch.arange(flat.numel()) - first[sorted_experts]
    if layout == "contiguous":
        padded = (counts + block_m - 1) // block_m * block_m
        starts = torch.cumsum(padded, 0) - padded
        nonempty = min(flat.numel(), experts)
        rows = block_m * (nonempty + (flat.numel() - nonempty) // block_m)
        sorted_rows = starts[sorted_experts] + rank
        m_indices = torch.full((rows,), -1, dtype=torch.int32)
        m_indices[sorted_rows] = sorted_experts.to(torch.int32)
        ends = (starts + counts).to(torch.int32)
        extra = (m_indices, starts, ends, padded.sum().reshape(1).to(torch.int32))
    else:
        max_m = (tokens // 256 + 1) * 256
        rows = experts * max_m + spare
        sorted_rows = sorted_experts * max_m + rank
        extra = (max_m,)
    row_of = torch.empty_like(flat)
    row_of[order] = sorted_rows
    token_of_row = torch.full((rows,), -1, dtype=torch.int32)
    token_of_row[sorted_rows] = (order // top_k).to(torch.int32)
    return row_of.view(tokens, top_k).to(torch.int32), token_of_row, counts.to(torch.int32), extra


@pytest.mark.parametrize("layout", ["contiguous", "masked"])
@pytest.mark.parametrize(
    "tokens, experts, top_k, span",
    [
        (1, 16, 4, 128),  # counted in each program, one part of 16
        (37, 16, 4, 16),  # ten parts of 16
        (256, 20, 4, 128),  # 1024 assignments: the most counted in each program
        (300, 40, 3, 64),
        (400, 12, 3, 512),  # 1200: counted first, in three parts
        (1000, 12, 3, 128),  # 3000 in 24 parts (the last one short)
        (1500, 10, 3, 512),  # 4500 in nine parts
        (600, 256, 8, 128),  # as many experts as bins: no bin spare for other ids
        (100, 257, 9, 128),  # DeepSeek-V3 with its shared expert fused: 900 counted in each
        (200, 257, 9, 128),  # program, then 1800 counted first; 17 records programs
        (0, 8, 2, 128),
    ],
)
def test_route_layout(layout, tokens, experts, top_k, span):
    kernels = load()
    gen = torch.Generator().manual_seed(tokens)
    ids = (
        torch.stack([torch.randperm(experts, generator=gen)[:top_k] for _ in range(tokens)])
        if tokens
        else torch.zeros(0, top_k, dtype=torch.long)
    )
    ids = ids.to(torch.int32)
    block_m = 16
    row_of, token_of_row, counts, extra = torch_route(ids, experts, layout, block_m)
    got_row_of = torch.full_like(row_of, -7)
    got_token = torch.full_like(token_of_row, -7)
    got_counts = torch.full((experts,), -7, dtype=torch.int32)
    if layout == "contiguous":
        got_m = torch.full_like(extra[0], -7)
        got_starts = torch.full((experts,), -7, dtype=torch.int64)
        got_ends = torch.full((experts,), -7, dtype=torch.int32)
        got_rows = torch.full((1,), -7, dtype=torch.int32)
        kernels.route_layout(
            ids,
            got_row_of,
            got_token,
            got_counts,
            layout=layout,
            experts=experts,
            m_indices=got_m,
            starts=got_starts,
            ends=got_ends,
            num_rows=got_rows,
            block_m=block_m,
            span=span,
            one_pass=ONE_LAUNCH_ROUTE,
        )
        assert (
            torch.equal(got_m, extra[0])
            and torch.equal(got_starts, extra[1])
            and torch.equal(got_ends, extra[2])
            and torch.equal(got_rows, extra[3])
        )
    else:
        kernels.route_layout(
            ids,
            got_row_of,
            got_token,
            got_counts,
            layout=layout,
            experts=experts,
            max_m=extra[0],
            span=span,
            one_pass=ONE_LAUNCH_ROUTE,
        )
    assert torch.equal(got_row_of, row_of)
    assert torch.equal(got_token, token_of_row)
    assert torch.equal(got_counts, counts)


@pytest.mark.parametrize("layout", ["contiguous", "masked"])
@pytest.mark.parametrize("experts", [12, 16])  # a power of two: no bin spare for other ids
@pytest.mark.parametrize("tokens, span", [(30, 128), (700, 128)])  # one launch; 17 parts
def test_route_layout_ids_of_no_expert(layout, tokens, span, experts):
    """Expert parallelism: a received row's ids of other ranks' experts (-1, or past E) get no
    row (row_of -1) and count for no expert; the other assignments are laid out as if those
    were absent. The Triton kernels and the torch runtime agree with the reference."""
    kernels = load()
    top_k, block_m = 3, 16
    gen = torch.Generator().manual_seed(tokens)
    ids = torch.stack([torch.randperm(2 * experts, generator=gen)[:top_k] for _ in range(tokens)])
    ids = torch.where(ids < experts, ids, torch.where(ids % 2 == 0, -1, ids)).to(torch.int32)
    valid = (ids >= 0) & (ids < experts)
    # the reference: the absent assignments as one more expert E, laid out last, then cut off
    row_x, token_x, counts_x, extra_x = torch_route(
        torch.where(valid, ids, experts), experts + 1, layout, block_m, spare=tokens * top_k
    )
    row_of = torch.where(valid, row_x, -1)
    counts = counts_x[:experts]
    if layout == "contiguous":
        rows = compact_rows(tokens * top_k, experts, block_m)
        used = int(extra_x[3]) - -(-int(counts_x[experts]) // block_m) * block_m
        token_of_row = torch.where(torch.arange(rows) < used, token_x[:rows], -1)
        m_indices = torch.where(torch.arange(rows) < used, extra_x[0][:rows], -1)
        starts, ends = extra_x[1][:experts], extra_x[2][:experts]
        want = (m_indices, starts, ends, torch.tensor([used], dtype=torch.int32))
    else:
        max_m = extra_x[0]
        token_of_row = token_x[: experts * max_m]
    got = [torch.full_like(row_of, -7), torch.full_like(token_of_row, -7)]
    got.append(torch.full((experts,), -7, dtype=torch.int32))
    options = {"layout": layout, "experts": experts, "span": span, "one_pass": ONE_LAUNCH_ROUTE}
    if layout == "contiguous":
        extra = [
            torch.full_like(want[0], -7),
            torch.full((experts,), -7, dtype=torch.int64),
            torch.full((experts,), -7, dtype=torch.int32),
            torch.full((1,), -7, dtype=torch.int32),
        ]
        options.update(
            m_indices=extra[0], starts=extra[1], ends=extra[2], num_rows=extra[3], block_m=block_m
        )
        torch_routing = grouping.route_contiguous(ids, experts, block_m)
    else:
        options.update(max_m=max_m)
        torch_routing = grouping.route_masked(ids, experts)
    kernels.route_layout(ids, *got, **options)
    for routing in (got, torch_routing):
        assert torch.equal(routing[0], row_of)
        assert torch.equal(routing[1], token_of_row)
        assert torch.equal(routing[2], counts)
    if layout == "contiguous":
        for routing in (extra, torch_routing[3:]):
            assert all(torch.equal(g, w) for g, w in zip(routing, want, strict=True))
