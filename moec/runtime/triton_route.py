"""route: top-k expert selection and the grouped layout's indices.

select_topk   one program per token: scores from fp32 logits (SCORING softmax | sigmoid |
              sqrtsoftplus), choice = scores (+ correction bias), expert groups (METHOD
              group_limited_greedy: best expert per group; noaux_tc: sum of the top-2), the
              best groups and the top-k experts by repeated argmax (the lower index first among
              equal values), weights = scores of the chosen experts (renormalized, scaled),
              then FUSED_SHARED extra experts E.. with weight 1. select_row can instead find
              each by one sort (BY_SORT, the same choice): faster in the router's 4-warp
              programs (triton_gate), slower on select_topk's one warp at 256 experts (H200,
              benchmarks/RESULTS.md run 60).
route_layout  the rows of the grouped layout, in token order within each expert (the same
              indices on every run). One program per part of SPAN assignments places them at
              rows start[e] + (expert e's assignments in earlier parts) + (those earlier in
              the part): a fixed amount of work per assignment, however many experts. Records
              programs write each expert's count, start and padding rows. Up to ONE_PASS
              assignments every program counts all of them itself (one launch); above, two
              launches first count each part (histograms, exact) and prefix the counts over
              the parts.
              contiguous: each expert's rows padded to BLOCK_M (m_indices -1 on padding), the
              first records program writes num_rows and fills the unused tail; masked: expert
              e owns rows e * max_m .. + max_m. An id outside [0, E) (an expert-parallel rank's
              view of another rank's expert) counts for no expert and gets row_of -1.
"""

import torch
import triton
import triton.language as tl

from .grouping import ContiguousRouting, MaskedRouting, compact_rows, masked_max_m
from .triton_numerics import launch_options, wait_inputs

ROUTE_SPAN = 128
"""Assignments per program of route_layout, ranked at once (a SPAN x SPAN comparison)."""
ONE_PASS = 1024
"""Assignments up to which route_layout counts them in each program: one launch."""
PREFIX_BINS = 16
"""Experts per program of the prefix over parts."""
PREFIX_PARTS = 256
"""Parts the prefix adds per step."""
RECORD_BINS = 16
"""Experts per records program. One program for all 256 of DeepSeek-V3 took 33 us at T=256."""
MASKED_RECORD_ROWS = 256
"""Padding rows a masked layout's records program writes per expert and step (contiguous:
block_m, all of them)."""

# select_topk adds the split-K router's partial logits in order, loading this many at a time:
# at T=1 the decode router leaves 28 slices, and one dependent load per slice made select wait
# on memory 28 times in a row
SLICES_AT_ONCE = 8


@triton.jit
def sum_partials(
    logits_ptr,
    E,
    S,
    stride_ls,
    BLOCK_E: tl.constexpr,
    SLICES_AT_ONCE: tl.constexpr,
    CACHE: tl.constexpr,
):
    """One token's logits [BLOCK_E] (-inf past E): the sum of its S partial rows (logits_ptr:
    the token's row of slice 0), added in slice order; CACHE: the loads' cache modifier."""
    e = tl.arange(0, BLOCK_E)
    logits = tl.load(logits_ptr + e, mask=e < E, other=float("-inf"), cache_modifier=CACHE)
    for s0 in range(1, S, SLICES_AT_ONCE):  # the slices in order; their loads issued together
        for i in tl.static_range(SLICES_AT_ONCE):
            slice_width = tl.where(s0 + i < S, E, 0)  # past S: masked, and x + 0.0 == x
            logits += tl.load(
                logits_ptr + (s0 + i) * stride_ls + e,
                mask=e < slice_width,
                other=0.0,
                cache_modifier=CACHE,
            )
    return logits


@triton.jit
def top_indices(values, BLOCK: tl.constexpr, K: tl.constexpr):
    """The indices of the K largest of `values` [BLOCK] fp32, largest first ([K] int32; equal
    values: the lower index first, -0.0 equal to +0.0): one bitonic top-k of int64 keys, the
    value's bits ordered as integers above the reversed index."""
    index = tl.arange(0, BLOCK)
    bits = (values + 0.0).to(tl.int32, bitcast=True)  # + 0.0 turns -0.0 into +0.0
    ordered = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)  # negative floats: reversed
    keys = (ordered.to(tl.int64) << 32) | (BLOCK - 1 - index).to(tl.int64)
    top = tl.topk(keys, K)
    return (BLOCK - 1 - (top & 0xFFFFFFFF)).to(tl.int32)


@triton.jit
def select_row(
    logits,
    bias_ptr,
    E,
    SCORING: tl.constexpr,
    METHOD: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    N_GROUP: tl.constexpr,
    BLOCK_G: tl.constexpr,
    TOPK_GROUP: tl.constexpr,
    TOP_K: tl.constexpr,
    NORMALIZE: tl.constexpr,
    ROUTED_SCALING: tl.constexpr,
    FUSED_SHARED: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_TOP: tl.constexpr,
    PER_GROUP: tl.constexpr,
    BY_SORT: tl.constexpr,
):
    """One token's choice from its logits [BLOCK_E]: (ids [BLOCK_K] int32, weights [BLOCK_K]
    fp32), the first TOP_K + FUSED_SHARED of them used (see the comment at the top). BY_SORT:
    the groups and the experts each by one top-k sort, not by repeated argmax."""
    e = tl.arange(0, BLOCK_E)
    valid = e < E
    if SCORING == "softmax":
        shifted = tl.exp(logits - tl.max(logits, axis=0))
        scores = shifted / tl.sum(shifted, axis=0)
    elif SCORING == "sigmoid":
        scores = tl.sigmoid(logits)
    else:  # sqrt(softplus(x)), softplus(x) = max(x, 0) + log1p(exp(-|x|))
        y = tl.exp(-tl.abs(logits))
        z = 1.0 + y  # log1p(y) = log(z) * y / (z - 1): exact up to a few ulps (Kahan)
        exact = z == 1.0
        log1p = tl.where(exact, y, tl.log(z) * (y / tl.where(exact, 1.0, z - 1.0)))
        scores = tl.sqrt(tl.maximum(logits, 0.0) + log1p)
    scores = tl.where(valid, scores, 0.0)
    choice = scores
    if HAS_BIAS:
        choice = choice + tl.load(bias_ptr + e, mask=valid, other=0.0)
    choice = tl.where(valid, choice, float("-inf"))
    if METHOD != "greedy" and N_GROUP > 1:
        g = tl.arange(0, BLOCK_G)  # groups past N_GROUP score -inf: never kept
        if PER_GROUP:  # E == BLOCK_E: the groups as rows, every group's reductions at once
            grouped = tl.reshape(choice, (N_GROUP, PER_GROUP))
            group_scores = tl.max(grouped, axis=1)
            if METHOD == "noaux_tc":  # sum of the group's top-2 scores
                first = tl.argmax(grouped, axis=1)
                member = tl.arange(0, PER_GROUP)
                rest = tl.where(member[None, :] == first[:, None], float("-inf"), grouped)
                group_scores = group_scores + tl.max(rest, axis=1)
        else:  # one group at a time
            per_group = E // N_GROUP
            group = tl.where(valid, e // per_group, BLOCK_G)
            group_scores = tl.full((BLOCK_G,), float("-inf"), dtype=tl.float32)
            for index in tl.static_range(N_GROUP):
                members = tl.where(group == index, choice, float("-inf"))
                best = tl.max(members, axis=0)
                if METHOD == "noaux_tc":  # sum of the group's top-2 scores
                    first = tl.argmax(members, axis=0)
                    best = best + tl.max(tl.where(e == first, float("-inf"), members), axis=0)
                group_scores = tl.where(g == index, best, group_scores)
        if BY_SORT:
            ranked = top_indices(group_scores, BLOCK_G, BLOCK_G)  # every group, best first
            picked = tl.where(g < TOPK_GROUP, ranked, BLOCK_G)  # the best TOPK_GROUP of them
            kept = tl.max(tl.where(picked[None, :] == g[:, None], 1, 0), axis=1) > 0
        else:
            kept = tl.zeros((BLOCK_G,), dtype=tl.int1)
            for _ in tl.static_range(TOPK_GROUP):
                top = tl.argmax(tl.where(kept, float("-inf"), group_scores), axis=0)
                kept = kept | (g == top)
        if PER_GROUP:
            choice = tl.reshape(tl.where(kept[:, None], grouped, float("-inf")), (BLOCK_E,))
        else:
            keep_expert = tl.sum(
                tl.where(kept[None, :] & (g[None, :] == group[:, None]), 1, 0), axis=1
            )
            choice = tl.where(keep_expert > 0, choice, float("-inf"))
    # the row of ids and weights, built in registers and stored once
    slot = tl.arange(0, BLOCK_K)
    if BY_SORT:  # the top BLOCK_TOP (a power of two >= TOP_K) over the slots, TOP_K of them kept
        ranked = top_indices(choice, BLOCK_E, BLOCK_TOP)
        top_ids = tl.gather(ranked, tl.minimum(slot, BLOCK_TOP - 1), 0)
        top_weights = tl.where(slot < TOP_K, tl.gather(scores, top_ids, 0), 0.0)
    else:
        top_ids = tl.zeros((BLOCK_K,), dtype=tl.int32)
        top_weights = tl.zeros((BLOCK_K,), dtype=tl.float32)
        for k in tl.static_range(TOP_K):
            top = tl.argmax(choice, axis=0)
            weight = tl.sum(tl.where(e == top, scores, 0.0), axis=0)
            top_ids = tl.where(slot == k, top.to(tl.int32), top_ids)
            top_weights = tl.where(slot == k, weight, top_weights)
            choice = tl.where(e == top, float("-inf"), choice)
    total = tl.sum(top_weights, axis=0)  # one reduction either way: the same sum
    if NORMALIZE:  # as the torch backend: w / (sum + 1e-20) * scale
        top_weights = top_weights / (total + 1e-20)
    if ROUTED_SCALING != 1.0:
        top_weights = top_weights * ROUTED_SCALING
    shared = slot >= TOP_K  # the fused shared experts E.., weight 1
    top_ids = tl.where(shared, E + slot - TOP_K, top_ids)
    top_weights = tl.where(shared, 1.0, top_weights)
    return top_ids, top_weights


@triton.jit
def store_choice(
    ids_ptr, weights_ptr, top_ids, top_weights, WIDTH: tl.constexpr, BLOCK_K: tl.constexpr
):
    """Store one token's ids and weights (the first WIDTH of BLOCK_K) at ids_ptr, weights_ptr."""
    slot = tl.arange(0, BLOCK_K)
    tl.store(ids_ptr + slot, top_ids, mask=slot < WIDTH)
    tl.store(weights_ptr + slot, top_weights, mask=slot < WIDTH)


@triton.jit
def _select_topk_kernel(
    # pointers
    logits_ptr,  # [S, T, E] fp32: S partial sums (split-K router) to add, in order
    bias_ptr,  # [E] fp32 (HAS_BIAS)
    ids_ptr,  # [T, TOP_K + FUSED_SHARED] int32 out
    weights_ptr,  # [T, TOP_K + FUSED_SHARED] fp32 out
    # dims
    E,
    S,
    # strides
    stride_ls,
    stride_lt,
    stride_it,
    stride_wt,
    # meta-parameters
    SCORING: tl.constexpr,
    METHOD: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    N_GROUP: tl.constexpr,
    BLOCK_G: tl.constexpr,  # power of two >= N_GROUP (tl.arange takes powers of two)
    TOPK_GROUP: tl.constexpr,
    TOP_K: tl.constexpr,
    NORMALIZE: tl.constexpr,
    ROUTED_SCALING: tl.constexpr,
    FUSED_SHARED: tl.constexpr,
    BLOCK_E: tl.constexpr,  # power of two >= E
    BLOCK_K: tl.constexpr,  # power of two >= TOP_K + FUSED_SHARED
    BLOCK_TOP: tl.constexpr,  # power of two >= TOP_K
    PER_GROUP: tl.constexpr,  # E // N_GROUP where E == BLOCK_E (groups as rows), else 0
    SLICES_AT_ONCE: tl.constexpr,  # partial logits loaded per step
    PDL: tl.constexpr,
):
    wait_inputs(PDL)
    t = tl.program_id(0).to(tl.int64)
    logits = sum_partials(logits_ptr + t * stride_lt, E, S, stride_ls, BLOCK_E, SLICES_AT_ONCE, "")
    top_ids, top_weights = select_row(
        logits, bias_ptr, E, SCORING, METHOD, HAS_BIAS, N_GROUP, BLOCK_G, TOPK_GROUP, TOP_K,
        NORMALIZE, ROUTED_SCALING, FUSED_SHARED, BLOCK_E, BLOCK_K, BLOCK_TOP, PER_GROUP, False,
    )  # fmt: skip
    store_choice(
        ids_ptr + t * stride_it, weights_ptr + t * stride_wt, top_ids, top_weights,
        TOP_K + FUSED_SHARED, BLOCK_K,
    )  # fmt: skip


@triton.jit
def _part_counts(ids_ptr, a0, end, E, WIDTH: tl.constexpr, BLOCK_E: tl.constexpr):
    """Assignments per expert among ids a0 .. min(a0 + WIDTH, end) ([BLOCK_E] int32); ids
    outside [0, E) count for none."""
    offs = a0 + tl.arange(0, WIDTH)
    ids = tl.load(ids_ptr + offs, mask=offs < end, other=-1)
    valid = (ids >= 0) & (ids < E)
    counts = tl.histogram(tl.where(valid, ids, 0), BLOCK_E)  # the others in bin 0, then removed
    bins = tl.arange(0, BLOCK_E)
    return counts - tl.where(bins == 0, tl.sum((~valid).to(tl.int32), axis=0), 0)


@triton.jit
def _route_count_kernel(
    ids_ptr,  # [A] int32
    part_counts_ptr,  # [PARTS, BLOCK_E] int32 out: assignments per expert in each part
    A,
    E,
    SPAN: tl.constexpr,  # assignments per part
    BLOCK_E: tl.constexpr,
    PDL: tl.constexpr,
):
    wait_inputs(PDL)
    part = tl.program_id(0)
    counts = _part_counts(ids_ptr, part * SPAN, A, E, SPAN, BLOCK_E)  # one histogram
    tl.store(part_counts_ptr + part * BLOCK_E + tl.arange(0, BLOCK_E), counts)


@triton.jit
def _route_prefix_kernel(
    part_counts_ptr,  # [PARTS, BLOCK_E] int32 in, overwritten with the exclusive prefix
    totals_ptr,  # [BLOCK_E] int32 out: assignments per expert
    PARTS,
    BLOCK_E: tl.constexpr,
    BLOCK_P: tl.constexpr,  # parts per step
    BINS: tl.constexpr,  # experts per program
    PDL: tl.constexpr,
):
    wait_inputs(PDL)
    bins = tl.program_id(0) * BINS + tl.arange(0, BINS)  # the grid covers BLOCK_E exactly
    carry = tl.zeros((BINS,), dtype=tl.int32)
    for p0 in range(0, PARTS, BLOCK_P):
        parts = p0 + tl.arange(0, BLOCK_P)
        ptrs = part_counts_ptr + parts[:, None] * BLOCK_E + bins[None, :]
        mask = tl.broadcast_to((parts < PARTS)[:, None], (BLOCK_P, BINS))
        counts = tl.load(ptrs, mask=mask, other=0)
        tl.store(ptrs, carry[None, :] + tl.cumsum(counts, axis=0) - counts, mask=mask)
        carry += tl.sum(counts, axis=0)
    tl.store(totals_ptr + bins, carry)


@triton.jit
def _route_layout_kernel(
    # pointers
    ids_ptr,  # [A] int32, A = T * K assignments
    all_counts_ptr,  # [BLOCK_E] int32: assignments per expert (without LOCAL_COUNTS)
    part_offsets_ptr,  # [PARTS, BLOCK_E] int32: an expert's assignments in earlier parts
    row_of_ptr,  # [A] int32 out
    token_of_row_ptr,  # [M] int32 out
    m_indices_ptr,  # [M] int32 out (contiguous)
    counts_ptr,  # [E] int32 out
    starts_ptr,  # [E] int64 out (contiguous)
    num_rows_ptr,  # [1] int32 out (contiguous)
    # dims
    A,
    K,
    E,
    M,  # rows of the layout (contiguous: worst case; masked: E * max_m)
    MAX_M,  # masked: rows per expert
    PARTS,  # programs of assignments; the rest write the experts' records
    # meta-parameters
    LAYOUT: tl.constexpr,
    BLOCK_M: tl.constexpr,  # contiguous row padding
    SPAN: tl.constexpr,  # assignments per part (a power of two), ranked at once
    BLOCK_E: tl.constexpr,  # power of two >= E
    BINS: tl.constexpr,  # experts per records program
    BLOCK_R: tl.constexpr,  # padding rows per step of a records program, a power of two
    LOCAL_COUNTS: tl.constexpr,  # 0, or a power of two >= A: every program counts them all
    PDL: tl.constexpr,
):
    wait_inputs(PDL)
    pid = tl.program_id(0)
    bins = tl.arange(0, BLOCK_E)
    if LOCAL_COUNTS:  # few assignments, one launch
        counts = _part_counts(ids_ptr, 0, A, E, LOCAL_COUNTS, BLOCK_E)
        before = _part_counts(ids_ptr, 0, tl.minimum(A, pid * SPAN), E, LOCAL_COUNTS, BLOCK_E)
    else:
        counts = tl.load(all_counts_ptr + bins)
        part = tl.minimum(pid, PARTS - 1)  # records programs read the last part's, unused
        before = tl.load(part_offsets_ptr + part * BLOCK_E + bins)
    counts = tl.where(bins < E, counts, 0)
    if LAYOUT == "contiguous":
        padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
        start = tl.cumsum(padded, axis=0) - padded
    else:
        start = bins * MAX_M
    if pid < PARTS:
        # an assignment's row: its expert's start, plus the expert's assignments in earlier
        # parts, plus those earlier in this part (a SPAN x SPAN comparison)
        lane = tl.arange(0, SPAN)
        offs = pid * SPAN + lane
        ids = tl.load(ids_ptr + offs, mask=offs < A, other=-1)
        mine = (ids >= 0) & (ids < E)
        expert = tl.where(mine, ids, 0)
        same = (expert[:, None] == expert[None, :]) & mine[None, :]
        rank = tl.sum((same & (lane[None, :] < lane[:, None])).to(tl.int32), axis=1)
        rows = tl.gather(start + before, expert, 0) + rank
        tl.store(row_of_ptr + offs, tl.where(mine, rows, -1), mask=offs < A)
        tl.store(token_of_row_ptr + rows, (offs // K).to(tl.int32), mask=mine)
        if LAYOUT == "contiguous":
            tl.store(m_indices_ptr + rows, expert, mask=mine)
    else:  # the records of experts BINS * g ..: counts, starts, padding rows
        g = pid - PARTS
        group = g * BINS + tl.arange(0, BINS)
        pick = bins[None, :] == group[:, None]
        count = tl.sum(tl.where(pick, counts[None, :], 0), axis=1)
        first = tl.sum(tl.where(pick, start[None, :], 0), axis=1)
        tl.store(counts_ptr + group, count, mask=group < E)
        if LAYOUT == "contiguous":
            tl.store(starts_ptr + group, first.to(tl.int64), mask=group < E)
            pad = tl.sum(tl.where(pick, padded[None, :], 0), axis=1)
        else:
            pad = tl.zeros((BINS,), dtype=tl.int32) + MAX_M
        longest = tl.max(tl.where(group < E, pad - count, 0), axis=0)
        for r0 in range(0, longest, BLOCK_R):  # rows count .. pad of each expert
            j = count[:, None] + r0 + tl.arange(0, BLOCK_R)[None, :]
            blank_rows = first[:, None] + j
            blank = (j < pad[:, None]) & (group < E)[:, None]
            tl.store(token_of_row_ptr + blank_rows, -1, mask=blank)
            if LAYOUT == "contiguous":
                tl.store(m_indices_ptr + blank_rows, -1, mask=blank)
        if LAYOUT == "contiguous":  # noqa: SIM102 (a constexpr test, then a runtime one)
            if g == 0:  # the number of rows, and the unused tail
                total = tl.sum(padded, axis=0)
                tl.store(num_rows_ptr, total)
                for r0 in range(total, M, 1024):
                    tail = r0 + tl.arange(0, 1024)
                    tl.store(token_of_row_ptr + tail, -1, mask=tail < M)
                    tl.store(m_indices_ptr + tail, -1, mask=tail < M)


def select_topk(logits, bias, *, pdl=False, num_warps=1, **choice):
    """Top-k selection for every token of logits [T, E] fp32, or of the sum of partial logits
    [S, T, E] (the split-K router's), with bias [E] fp32 or None, as torch_select.select_topk
    with the same keywords (`choice`: scoring_func, topk_method, n_group, topk_group, top_k,
    norm_topk_prob, routed_scaling_factor, fused_shared; choice_meta names them):
    returns (weights [T, K'] fp32, ids [T, K'] int32), K' = top_k + fused_shared; see the
    comment above. One warp per token by default: its reductions over E need no shared-memory
    barriers (H200, 256 experts: 9.2 us at T=1 and 39 us at T=4096, against 10.7 and 64 us
    with 4 warps; benchmarks/RESULTS.md, run 9)."""
    if logits.dim() == 2:
        logits = logits.unsqueeze(0)
    _, tokens, experts = logits.shape
    width = choice["top_k"] + choice["fused_shared"]
    ids = torch.empty((tokens, width), dtype=torch.int32, device=logits.device)
    weights = torch.empty((tokens, width), dtype=torch.float32, device=logits.device)
    if tokens:
        _select_topk_kernel[(tokens,)](
            # pointers
            logits,
            bias if bias is not None else logits,
            ids,
            weights,
            # dims
            experts,
            logits.shape[0],
            # strides
            logits.stride(0),
            logits.stride(1),
            ids.stride(0),
            weights.stride(0),
            # meta-parameters
            **choice_meta(experts, has_bias=bias is not None, **choice),
            SLICES_AT_ONCE=SLICES_AT_ONCE,
            num_warps=num_warps,
            **launch_options(pdl),
        )
    return weights, ids


def choice_meta(
    experts,
    *,
    has_bias,
    scoring_func,
    topk_method,
    n_group,
    topk_group,
    top_k,
    norm_topk_prob,
    routed_scaling_factor,
    fused_shared,
) -> dict:
    """The meta-parameters of select_row (and store_choice's BLOCK_K) for these options."""
    block_e = triton.next_power_of_2(experts)
    return {
        "SCORING": scoring_func,
        "METHOD": topk_method,
        "HAS_BIAS": has_bias,
        "N_GROUP": n_group,
        "BLOCK_G": triton.next_power_of_2(n_group),
        "TOPK_GROUP": topk_group,
        "TOP_K": top_k,
        "NORMALIZE": norm_topk_prob,
        "ROUTED_SCALING": routed_scaling_factor,
        "FUSED_SHARED": fused_shared,
        "BLOCK_E": block_e,
        "BLOCK_K": triton.next_power_of_2(top_k + fused_shared),
        "BLOCK_TOP": triton.next_power_of_2(top_k),
        "PER_GROUP": experts // n_group if experts == block_e and n_group > 1 else 0,
    }


def route_layout(
    topk_ids,
    row_of,
    token_of_row,
    counts,
    *,
    layout,
    experts,
    m_indices=None,
    starts=None,
    num_rows=None,
    block_m=1,
    max_m=0,
    pdl=False,
    span=ROUTE_SPAN,
    one_pass=ONE_PASS,
):
    """Indices of the grouped layout for topk_ids [T, K] (int32), written in place:
    row_of [T, K], token_of_row [M], counts [E]; contiguous also m_indices [M], starts [E]
    (int64) and num_rows [1]. See the comment above. span: assignments per part, a power of two
    from 16 to 512; one_pass: the most assignments every program counts itself."""
    assignments = topk_ids.numel()
    if not 16 <= span <= 512 or span & (span - 1):
        raise ValueError(f"span={span} is not a power of two from 16 to 512")
    span = min(span, max(16, triton.next_power_of_2(assignments)))
    parts = triton.cdiv(assignments, span)
    block_e = triton.next_power_of_2(experts)
    block_r = triton.next_power_of_2(block_m) if layout == "contiguous" else MASKED_RECORD_ROWS
    bins = min(block_e, RECORD_BINS)
    local_counts = max(16, triton.next_power_of_2(assignments)) if assignments <= one_pass else 0
    histogram = offsets = counts  # not read when every program counts
    if not local_counts:  # counts per part, their prefix over parts, then every part at once
        offsets = torch.empty((parts, block_e), dtype=torch.int32, device=topk_ids.device)
        histogram = torch.empty(block_e, dtype=torch.int32, device=topk_ids.device)
        _route_count_kernel[(parts,)](
            topk_ids, offsets, assignments, experts,
            SPAN=span, BLOCK_E=block_e, num_warps=4, **launch_options(pdl),
        )  # fmt: skip
        prefix_bins = min(PREFIX_BINS, block_e)
        _route_prefix_kernel[(block_e // prefix_bins,)](
            offsets, histogram, parts,
            BLOCK_E=block_e, BLOCK_P=PREFIX_PARTS, BINS=prefix_bins, num_warps=4,
            **launch_options(pdl),
        )  # fmt: skip
    _route_layout_kernel[(parts + triton.cdiv(experts, bins),)](
        # pointers
        topk_ids,
        histogram,
        offsets,
        row_of,
        token_of_row,
        m_indices if m_indices is not None else counts,
        counts,
        starts if starts is not None else counts,
        num_rows if num_rows is not None else counts,
        # dims
        assignments,
        topk_ids.shape[1] if topk_ids.dim() == 2 else 1,
        experts,
        token_of_row.numel(),
        max_m,
        parts,
        # meta-parameters
        LAYOUT=layout,
        BLOCK_M=block_m,
        SPAN=span,
        BLOCK_E=block_e,
        BINS=bins,
        BLOCK_R=block_r,
        LOCAL_COUNTS=local_counts,
        num_warps=4,
        **launch_options(pdl),
    )


def empty_contiguous(topk_ids, experts: int, block_m: int) -> ContiguousRouting:
    """The contiguous layout's index tensors for topk_ids [T, K], to be filled: the worst case
    of rows over all routings (compact_rows)."""
    tokens, top_k = topk_ids.shape
    device = topk_ids.device
    rows = compact_rows(tokens * top_k, experts, block_m)
    return ContiguousRouting(
        row_of=torch.empty((tokens, top_k), dtype=torch.int32, device=device),
        token_of_row=torch.empty(rows, dtype=torch.int32, device=device),
        counts=torch.empty(experts, dtype=torch.int32, device=device),
        m_indices=torch.empty(rows, dtype=torch.int32, device=device),
        starts=torch.empty(experts, dtype=torch.int64, device=device),
        num_rows=torch.empty(1, dtype=torch.int32, device=device),
    )


def route_contiguous(topk_ids, experts: int, block_m: int, pdl: bool = False) -> ContiguousRouting:
    """The contiguous layout's indices for topk_ids [T, K] int32 in one pass of two launches
    (token order within each expert, as grouping.route_contiguous)."""
    routing = empty_contiguous(topk_ids, experts, block_m)
    route_layout(
        topk_ids,
        routing.row_of,
        routing.token_of_row,
        routing.counts,
        layout="contiguous",
        experts=experts,
        m_indices=routing.m_indices,
        starts=routing.starts,
        num_rows=routing.num_rows,
        block_m=block_m,
        pdl=pdl,
    )
    return routing


def route_masked(topk_ids, experts: int, pdl: bool = False) -> MaskedRouting:
    """The masked layout's indices for topk_ids [T, K] int32 (as grouping.route_masked)."""
    tokens, top_k = topk_ids.shape
    device = topk_ids.device
    max_m = masked_max_m(tokens)
    routing = MaskedRouting(
        row_of=torch.empty((tokens, top_k), dtype=torch.int32, device=device),
        token_of_row=torch.empty(experts * max_m, dtype=torch.int32, device=device),
        counts=torch.empty(experts, dtype=torch.int32, device=device),
        max_m=max_m,
    )
    route_layout(
        topk_ids,
        routing.row_of,
        routing.token_of_row,
        routing.counts,
        layout="masked",
        experts=experts,
        max_m=max_m,
        pdl=pdl,
    )
    return routing
