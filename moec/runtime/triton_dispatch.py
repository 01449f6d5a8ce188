"""dispatch: token rows into the grouped layout of their top-k experts, with the layout's indices.

Up to `one_launch` assignments (decode) of the contiguous layout, one launch does both: the
programs of an assignment (one per BLOCK_H columns) find its row from the histogram of all
assignments (the expert's padded start, plus how many earlier assignments chose the same
expert: token order within each expert, the rows route_layout gives) and copy their columns of
its token's row there, quantized; the first of them writes the indices. Each token is read and
quantized once per assignment, which at a few tokens costs less than a second launch; the
expert's first assignment writes the expert's padding rows, and one more program writes
counts, starts, num_rows and the unused tail.
Above, or for the masked layout, route_layout then permute_quant (two launches at most 1024
assignments, four above).

With `gather` (contiguous) no row is copied: the tokens stay in token order, quantized once
each, and the gate/up GEMM reads each layout row's token through token_of_row. The one launch
then quantizes token t in the programs of assignment t.
"""

import triton
import triton.language as tl

from .grouping import rows_shape
from .triton_numerics import launch_options, wait_inputs
from .triton_permute import (
    dynamic_scale,
    empty_rows,
    permute,
    quantize_rows,
    quantize_tile,
    store_rows,
)
from .triton_route import empty_contiguous, route_contiguous, route_masked


@triton.jit
def _dispatch_one_launch_kernel(
    # pointers
    x_ptr,  # [T, H]
    ids_ptr,  # [A] int32, A = T * K assignments
    row_of_ptr,  # [A] int32 out
    token_of_row_ptr,  # [M] int32 out
    m_indices_ptr,  # [M] int32 out
    counts_ptr,  # [E] int32 out
    starts_ptr,  # [E] int64 out
    ends_ptr,  # [E] int32 out: start + count
    num_rows_ptr,  # [1] int32 out
    out_ptr,  # [M, H] e4m3, or x's dtype for QUANT "none"; GATHER: [T, H]
    scale_ptr,  # "group": [M (GATHER: T), ceil(H / G)] fp32 out; "tensor": [1] fp32 in
    # dims
    A,
    T,
    K,
    E,
    M,  # rows of the layout (the worst case)
    H,
    # strides
    stride_xt,
    stride_xh,
    stride_om,
    stride_oh,
    stride_sm,
    stride_sg,
    # meta-parameters
    QUANT: tl.constexpr,
    GROUP_SIZE: tl.constexpr,
    POW2_SCALES: tl.constexpr,
    SOFT_ROUND: tl.constexpr,
    BLOCK_M: tl.constexpr,  # row padding of each expert
    BLOCK_A: tl.constexpr,  # power of two >= A
    BLOCK_E: tl.constexpr,  # power of two > E
    BLOCK_H: tl.constexpr,  # columns per program (program_id(1))
    GATHER: tl.constexpr,  # write x's rows in token order, not in the layout
    PDL: tl.constexpr,
):
    wait_inputs(PDL)
    a = tl.program_id(0)
    h0 = tl.program_id(1) * BLOCK_H
    offs = tl.arange(0, BLOCK_A)
    ids = tl.load(ids_ptr + offs, mask=offs < A, other=E)  # E: a bin no expert reads
    bins = tl.arange(0, BLOCK_E)
    counts = tl.where(bins < E, tl.histogram(ids, BLOCK_E), 0)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    if a == A:  # the extra programs (the first one works): the layout's records, the unused tail
        if h0 > 0:
            return
        total = tl.sum(padded, axis=0)
        tl.store(counts_ptr + bins, counts, mask=bins < E)
        starts = tl.cumsum(padded, axis=0) - padded
        tl.store(starts_ptr + bins, starts.to(tl.int64), mask=bins < E)
        tl.store(ends_ptr + bins, starts + counts, mask=bins < E)
        tl.store(num_rows_ptr, total)
        for r0 in range(total, M, BLOCK_A):
            rows = r0 + offs
            tl.store(token_of_row_ptr + rows, -1, mask=rows < M)
            tl.store(m_indices_ptr + rows, -1, mask=rows < M)
    else:
        expert = tl.sum(tl.where(offs == a, ids, 0), axis=0)
        rank = tl.sum(tl.where((offs < a) & (ids == expert), 1, 0), axis=0)
        start = tl.sum(tl.where(bins < expert, padded, 0), axis=0)
        row = start + rank
        token = a // K
        if h0 == 0:  # the indices, once per assignment
            tl.store(row_of_ptr + a, row)
            tl.store(token_of_row_ptr + row, token)
            tl.store(m_indices_ptr + row, expert)
            if rank == 0:  # the expert's padding rows
                end = start + tl.sum(tl.where(bins == expert, padded, 0), axis=0)
                first = start + tl.sum(tl.where(bins == expert, counts, 0), axis=0)
                for r0 in range(first, end, BLOCK_A):
                    rows = r0 + offs
                    tl.store(token_of_row_ptr + rows, -1, mask=rows < end)
                    tl.store(m_indices_ptr + rows, -1, mask=rows < end)
        source, target = token, row  # the token row this program copies, and where to
        if GATHER:  # the programs of assignment t quantize token t, in place of a copy
            source, target = a, a
        if not GATHER or (a < T and QUANT != "none"):  # gathered bf16 rows are x's own
            offs_h = h0 + tl.arange(0, BLOCK_H)
            x_ptrs = x_ptr + source.to(tl.int64) * stride_xt + offs_h[None, :] * stride_xh
            x = tl.load(x_ptrs, mask=(offs_h < H)[None, :], other=0.0)
            value, scale = quantize_tile(x, scale_ptr, QUANT, GROUP_SIZE, POW2_SCALES, SOFT_ROUND)
            store_rows(
                out_ptr, scale_ptr, target + tl.zeros((1,), dtype=tl.int32), h0, H, value, scale,
                stride_om, stride_oh, stride_sm, stride_sg, QUANT, GROUP_SIZE,
            )  # fmt: skip


def dispatch(
    x,
    topk_ids,
    experts,
    *,
    layout,
    config,
    route_one_pass,
    block_m=1,
    quant="none",
    group_size=128,
    pow2_scales=False,
    scale=None,
    mn_major_scales=False,
    one_launch=0,
    gather=False,
    pdl=False,
    copy_pdl=True,
):
    """(a, a_scale, routing): x [T, H]'s rows in the `layout` ("contiguous", rows padded to
    block_m per expert; "masked") of topk_ids [T, K] int32 over `experts` experts, quantized as
    triton_permute.permute does (a_scale None for quant "none"), and the layout's indices
    (grouping.ContiguousRouting / MaskedRouting). gather (contiguous): a is x's rows in token
    order [T, H], quantized (or x itself for quant "none"), for a GEMM that reads them through
    routing.token_of_row. config: the permute kernel's tiles; route_one_pass: the most
    assignments route_layout counts in each program (one launch); one_launch: the most assignments
    a contiguous dispatch does in one launch (0: none); pdl: programmatic dependent launch,
    which the row copy (or quantization) after route_layout takes part in only with copy_pdl
    (the plan's choice, Dispatch.copy_pdl)."""
    assignments = topk_ids.numel()
    if gather and (layout != "contiguous" or mn_major_scales):
        raise ValueError("gather is for the contiguous layout with K-major scales")
    quantized = (quant, group_size, pow2_scales, scale, mn_major_scales)
    if layout == "masked":
        routing = route_masked(topk_ids, experts, one_pass=route_one_pass, pdl=pdl)
    elif assignments > one_launch or assignments == 0:
        routing = route_contiguous(topk_ids, experts, block_m, one_pass=route_one_pass, pdl=pdl)
    else:
        return _one_launch(x, topk_ids, experts, block_m, config, *quantized, gather, pdl)
    rows = {  # the pass over the tokens after the route
        "config": config,
        "quant": quant,
        "group_size": group_size,
        "pow2_scales": pow2_scales,
        "scale": scale,
        "pdl": pdl and copy_pdl,
    }
    if not gather:
        a, a_scale = permute(x, routing, experts, mn_major_scales=mn_major_scales, **rows)
    elif quant == "none":  # the GEMM reads x's rows themselves
        a, a_scale = x, None
    else:
        a, a_scale = quantize_rows(x, **rows)
    return a, a_scale, routing


def _one_launch(
    x,
    topk_ids,
    experts,
    block_m,
    config,
    quant,
    group_size,
    pow2_scales,
    scale,
    mn_major,
    gather,
    pdl,
):
    routing = empty_contiguous(topk_ids, experts, block_m)
    copies = not (gather and quant == "none")  # else the GEMM reads x's rows themselves
    leading = (x.shape[0],) if gather else rows_shape(routing, experts)
    out, empty_scale = empty_rows(x, leading, quant, group_size, mn_major) if copies else (x, None)
    if quant != "tensor" or scale is None:
        scale = empty_scale
    hidden = x.shape[1]
    block_h = config["BLOCK_H"]
    if quant == "group" and block_h % group_size:
        raise ValueError(f"BLOCK_H={block_h} is not a multiple of group_size={group_size}")
    if quant == "tensor" and scale is empty_scale:
        dynamic_scale(x, scale, config=config, pow2_scales=pow2_scales, pdl=pdl)
    strides_s = scale.view(-1, scale.shape[-1]).stride() if quant == "group" else (0, 0)
    assignments = topk_ids.numel()
    column_programs = triton.cdiv(hidden, block_h) if copies else 1
    _dispatch_one_launch_kernel[(assignments + 1, column_programs)](
        # pointers
        x,
        topk_ids,
        routing.row_of,
        routing.token_of_row,
        routing.m_indices,
        routing.counts,
        routing.starts,
        routing.ends,
        routing.num_rows,
        out,
        scale if scale is not None else out,
        # dims
        assignments,
        x.shape[0],
        topk_ids.shape[1],
        experts,
        routing.token_of_row.numel(),
        hidden,
        # strides
        x.stride(0),
        x.stride(1),
        out.stride(0),
        out.stride(1),
        *strides_s,
        # meta-parameters
        QUANT=quant,
        GROUP_SIZE=group_size,
        POW2_SCALES=pow2_scales,
        SOFT_ROUND=triton.knobs.runtime.interpret,
        BLOCK_M=block_m,
        BLOCK_A=max(triton.next_power_of_2(assignments), 16),
        BLOCK_E=triton.next_power_of_2(experts + 1),
        BLOCK_H=block_h,
        GATHER=gather,
        num_warps=config["num_warps"],
        **launch_options(pdl),
    )
    return out, scale, routing
