"""route: the grouped layout's indices from the chosen experts.

route_layout  the rows of the grouped layout, in token order within each expert (the same
              indices on every run). One program per part of SPAN assignments places them at
              rows start[e] + (expert e's assignments in earlier parts) + (those earlier in
              the part): a fixed amount of work per assignment, however many experts. Records
              programs write each expert's count, start and padding rows. Up to `one_pass`
              assignments (the plan's Dispatch.route_one_pass) every program counts them all
              itself (one launch); above, two
              launches first count each part (histograms, exact) and prefix the counts over
              the parts.
              contiguous: each expert's rows padded to BLOCK_M (m_indices -1 on padding), the
              first records program writes num_rows and fills the unused tail; masked: expert
              e owns rows e * max_m .. + max_m. An id outside [0, E) (an expert-parallel rank's
              view of another rank's expert) counts for no expert and gets row_of -1.
The experts themselves are chosen by triton_select.
"""

import torch
import triton
import triton.language as tl

from .grouping import ContiguousRouting, MaskedRouting, compact_rows, masked_max_m
from .triton_numerics import launch_options, wait_inputs

ROUTE_SPAN = 128
"""Assignments per program of route_layout, ranked at once (a SPAN x SPAN comparison)."""
PREFIX_BINS = 16
"""Experts per program of the prefix over parts."""
PREFIX_PARTS = 256
"""Parts the prefix adds per step."""
RECORD_BINS = 16
"""Experts per records program. One program for all 256 of DeepSeek-V3 took 33 us at T=256."""
MASKED_RECORD_ROWS = 256
"""Padding rows a masked layout's records program writes per expert and step (contiguous:
block_m, all of them)."""


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
    ends_ptr,  # [E] int32 out (contiguous): start + count
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
            tl.store(ends_ptr + group, first + count, mask=group < E)
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
    ends=None,
    num_rows=None,
    block_m=1,
    max_m=0,
    pdl=False,
    one_pass,
    span=ROUTE_SPAN,
):
    """Indices of the grouped layout for topk_ids [T, K] (int32), written in place:
    row_of [T, K], token_of_row [M], counts [E]; contiguous also m_indices [M], starts [E]
    (int64), ends [E] and num_rows [1]. See the comment above. span: assignments per part, a
    power of two from 16 to 512; one_pass: the most assignments every program counts itself."""
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
        ends if ends is not None else counts,
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
        ends=torch.empty(experts, dtype=torch.int32, device=device),
        num_rows=torch.empty(1, dtype=torch.int32, device=device),
    )


def route_contiguous(
    topk_ids, experts: int, block_m: int, *, one_pass: int, pdl: bool = False
) -> ContiguousRouting:
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
        ends=routing.ends,
        num_rows=routing.num_rows,
        block_m=block_m,
        pdl=pdl,
        one_pass=one_pass,
    )
    return routing


def route_masked(topk_ids, experts: int, *, one_pass: int, pdl: bool = False) -> MaskedRouting:
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
        one_pass=one_pass,
    )
    return routing
