"""gate: router logits and top-k selection, in one launch for a few tokens.

Up to `one_launch` tokens one kernel does both. Its programs are the split-K router's
(triton_router: expert tiles x token tiles x K slices), each storing its partial logits; then
each counts itself in its token tile's arrival counter. The program that arrives last has
every partial of the tile in memory: it resets the counter (for the next launch) and selects
the tile's tokens one after the other, adding their partials in slice order, as select_topk
does, and finding each token's groups and experts by one top-k sort where select_topk takes
repeated argmax (with the router's 4 warps the sort is faster; on select_topk's one warp it is
slower). The two paths choose the same experts with the same weights, bit for bit; with softmax
scores up to the order of the denominator's sum, which follows the program's warps.
At decode this saves select's launch and its wait on the router; above, selecting a whole tile
in one program would serialize what select_topk runs as one program per token, so the router
and select_topk run as two launches.

gate_and_dispatch adds the copy-free dispatch (triton_dispatch, gather) to the one launch: the
programs of the first expert tile quantize their K slice of the tile's tokens beside their
partial logits, and the last program writes the contiguous layout's indices after its choices
(triton_route.write_contiguous), which needs every token in one token tile. This saves the
dispatch's launch and its wait on the choice.

The counters are the layer's: int32 zeros, at least one per token tile; every launch leaves
them zero. Two launches with the same counters must not run at once (two streams).
"""

import torch
import triton
import triton.language as tl

from .triton_dispatch import dispatch as dispatch_tokens
from .triton_numerics import launch_options, wait_inputs
from .triton_permute import empty_rows, quantize_tile, store_rows
from .triton_route import empty_contiguous, write_contiguous
from .triton_router import partial_logits, router_logits, split_k, store_partial_logits
from .triton_select import (
    SLICES_AT_ONCE,
    choice_meta,
    select_row,
    select_topk,
    store_choice,
    sum_partials,
)


@triton.jit
def _quantize_slice(
    x_ptr, q_ptr, q_scale_ptr, T, H, K_SLICE, stride_xt, stride_xh, stride_qt, stride_qh,
    stride_qst, stride_qsg, ROUTER_T: tl.constexpr, ROUTER_K: tl.constexpr, QUANT: tl.constexpr,
    GROUP_SIZE: tl.constexpr, UE8M0: tl.constexpr, SOFT_ROUND: tl.constexpr,
):  # fmt: skip
    """The first expert tile's programs quantize their token tile's rows of x in their K slice
    (triton_permute's group quantization), each token once."""
    if tl.program_id(0) == 0:
        rows = tl.program_id(1) * ROUTER_T + tl.arange(0, ROUTER_T)
        start = tl.program_id(2) * K_SLICE
        for h0 in range(start, tl.minimum(start + K_SLICE, H), ROUTER_K):
            offs_h = h0 + tl.arange(0, ROUTER_K)
            x_ptrs = x_ptr + rows[:, None] * stride_xt + offs_h[None, :] * stride_xh
            x = tl.load(x_ptrs, mask=(rows < T)[:, None] & (offs_h < H)[None, :], other=0.0)
            value, scale = quantize_tile(x, q_scale_ptr, QUANT, GROUP_SIZE, UE8M0, SOFT_ROUND)
            store_rows(
                q_ptr, q_scale_ptr, tl.where(rows < T, rows, -1), h0, H, value, scale,
                stride_qt, stride_qh, stride_qst, stride_qsg, QUANT, GROUP_SIZE,
            )  # fmt: skip


@triton.jit
def _gate_kernel(
    # pointers
    x_ptr,  # [T, H] bf16
    parts_ptr,  # [3, E, H] bf16
    partials_ptr,  # [S, T, E] fp32 scratch: the partial logits of each K slice
    bias_ptr,  # [E] fp32 (HAS_BIAS)
    ids_ptr,  # [T, TOP_K + FUSED_SHARED] int32 out
    weights_ptr,  # [T, TOP_K + FUSED_SHARED] fp32 out
    counters_ptr,  # [>= token tiles] int32, zero: programs of each token tile done
    # DISPATCH: the copy-free contiguous dispatch's (triton_dispatch.dispatch, gather)
    q_ptr,  # [T, H] e4m3 out (QUANT "group")
    q_scale_ptr,  # [T, ceil(H / GROUP_SIZE)] fp32 out
    row_of_ptr,  # [T, TOP_K + FUSED_SHARED] int32 out
    token_of_row_ptr,  # [M_ROWS] int32 out
    m_indices_ptr,  # [M_ROWS] int32 out
    layout_counts_ptr,  # [E_LAYOUT] int32 out
    starts_ptr,  # [E_LAYOUT] int64 out
    num_rows_ptr,  # [1] int32 out
    # dims
    T,
    E,
    H,
    K_SLICE,  # hidden elements per K slice, a multiple of ROUTER_K
    E_LAYOUT,  # DISPATCH: experts of the layout (the fused shared ones included)
    M_ROWS,  # DISPATCH: rows of the layout
    # strides
    stride_xt,
    stride_xh,
    stride_pp,
    stride_pe,
    stride_ph,
    stride_ls,
    stride_lt,
    stride_it,
    stride_wt,
    stride_qt,
    stride_qh,
    stride_qst,
    stride_qsg,
    # meta-parameters: the router's tiles
    UPCAST: tl.constexpr,  # interpreter: dot on fp32 tiles (its bf16 dot is wrong)
    ROUTER_T: tl.constexpr,
    ROUTER_E: tl.constexpr,
    ROUTER_K: tl.constexpr,
    # the selection's (triton_select.choice_meta)
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
    SLICES_AT_ONCE: tl.constexpr,
    # the dispatch's
    DISPATCH: tl.constexpr,
    QUANT: tl.constexpr,  # "group" | "none"
    GROUP_SIZE: tl.constexpr,
    UE8M0: tl.constexpr,
    SOFT_ROUND: tl.constexpr,  # interpreter: round to e4m3 in software (its cast truncates)
    ROW_PAD: tl.constexpr,  # row padding of each expert
    BLOCK_A: tl.constexpr,  # power of two >= the assignments
    BLOCK_EL: tl.constexpr,  # power of two > E_LAYOUT
    PDL: tl.constexpr,
):
    wait_inputs(PDL)
    acc = partial_logits(
        x_ptr, parts_ptr, T, E, H, K_SLICE, stride_xt, stride_xh, stride_pp, stride_pe,
        stride_ph, UPCAST, ROUTER_T, ROUTER_E, ROUTER_K,
    )  # fmt: skip
    store_partial_logits(partials_ptr, acc, T, E, stride_ls, stride_lt, 1, ROUTER_T, ROUTER_E)
    if DISPATCH and QUANT != "none":
        _quantize_slice(
            x_ptr, q_ptr, q_scale_ptr, T, H, K_SLICE, stride_xt, stride_xh, stride_qt, stride_qh,
            stride_qst, stride_qsg, ROUTER_T, ROUTER_K, QUANT, GROUP_SIZE, UE8M0, SOFT_ROUND,
        )  # fmt: skip
    # Every thread's stores are done (the barrier) before one thread counts the program in with
    # release semantics; the last to arrive acquires, so the others' partials are visible to it.
    tl.debug_barrier()
    tile = tl.program_id(1)
    arrived = tl.atomic_add(counters_ptr + tile, 1, sem="acq_rel", scope="gpu")
    if arrived == tl.num_programs(0) * tl.num_programs(2) - 1:
        tl.store(counters_ptr + tile, 0)
        S = tl.num_programs(2)
        for t in range(tile * ROUTER_T, tl.minimum(tile * ROUTER_T + ROUTER_T, T)):
            # partials other programs wrote: read from L2 (".cg"), past this SM's L1
            logits = sum_partials(
                partials_ptr + t * stride_lt, E, S, stride_ls, BLOCK_E, SLICES_AT_ONCE, ".cg"
            )
            top_ids, top_weights = select_row(  # by sort: on 4 warps, faster than argmax
                logits, bias_ptr, E, SCORING, METHOD, HAS_BIAS, N_GROUP, BLOCK_G, TOPK_GROUP,
                TOP_K, NORMALIZE, ROUTED_SCALING, FUSED_SHARED, BLOCK_E, BLOCK_K, BLOCK_TOP,
                PER_GROUP, True,
            )  # fmt: skip
            store_choice(
                ids_ptr + t * stride_it, weights_ptr + t * stride_wt, top_ids, top_weights,
                TOP_K + FUSED_SHARED, BLOCK_K,
            )  # fmt: skip
        if DISPATCH:  # the layout of every token (one tile): its choices, read back
            tl.debug_barrier()
            write_contiguous(
                ids_ptr, stride_it, TOP_K + FUSED_SHARED, T * (TOP_K + FUSED_SHARED), E_LAYOUT,
                M_ROWS, row_of_ptr, token_of_row_ptr, m_indices_ptr, layout_counts_ptr,
                starts_ptr, num_rows_ptr, ROW_PAD, BLOCK_A, BLOCK_EL,
            )  # fmt: skip


def gate(x, parts, bias, counters, *, config, one_launch, pdl=False, **choice):
    """(weights [T, K'] fp32, ids [T, K'] int32) of x [T, H] bf16 routed by the router weight's
    three bf16 parts [3, E, H] (triton_router) and bias [E] fp32 or None, as select_topk of
    router_logits; `choice`: select_topk's options (scoring_func, topk_method, n_group,
    topk_group, top_k, norm_topk_prob, routed_scaling_factor, fused_shared). config: the
    router's tiles; up to one_launch tokens one launch, with counters [>= one_launch] int32
    (zeros, left zero); above, two."""
    tokens = x.shape[0]
    if tokens > one_launch or tokens == 0:
        logits = router_logits(x, parts, config=config, pdl=pdl)
        return select_topk(logits, bias, pdl=pdl, **choice)
    weights, ids, _ = _one_launch(x, parts, bias, counters, config, pdl, choice, None)
    return weights, ids


def gate_and_dispatch(
    x, parts, bias, counters, *, config, one_launch, dispatch, pdl=False, **choice
):
    """(weights, a, a_scale, routing): gate's choice for x, then the copy-free contiguous
    dispatch of x (triton_dispatch.dispatch, gather=True, with the options `dispatch`: experts,
    block_m, config, quant "group" or "none", group_size, ue8m0, one_launch, copy_pdl). Up to
    one_launch tokens, all in the gate's one launch: the first expert tile's programs quantize
    their K slice of x while the router runs, and the last program writes the layout after the
    choices (one token tile); above, the gate's launches, then the dispatch's."""
    tokens = x.shape[0]
    if tokens > one_launch or tokens == 0:
        weights, ids = gate(
            x, parts, bias, counters, config=config, one_launch=one_launch, pdl=pdl, **choice
        )
        return weights, *dispatch_tokens(
            x, ids, layout="contiguous", gather=True, pdl=pdl, **dispatch
        )
    weights, _, (a, a_scale, routing) = _one_launch(
        x, parts, bias, counters, config, pdl, choice, dispatch
    )
    return weights, a, a_scale, routing


def _one_launch(x, parts, bias, counters, config, pdl, choice, layout):
    """(weights, ids, (a, a_scale, routing) or None) of the one-launch gate, with the dispatch
    `layout` describes (gate_and_dispatch's options) or none."""
    tokens, hidden = x.shape
    experts = parts.shape[1]
    grid, k_slice = split_k(tokens, experts, hidden, config)
    if grid[1] > counters.numel():
        raise ValueError(f"{grid[1]} token tiles need as many counters, got {counters.numel()}")
    width = choice["top_k"] + choice["fused_shared"]
    partials = torch.empty((grid[2], tokens, experts), dtype=torch.float32, device=x.device)
    ids = torch.empty((tokens, width), dtype=torch.int32, device=x.device)
    weights = torch.empty((tokens, width), dtype=torch.float32, device=x.device)
    dispatched, meta = None, {"DISPATCH": False, "QUANT": "none", "GROUP_SIZE": 1, "UE8M0": False}
    pointers, dims, strides = (partials,) * 8, (0, 0), (0,) * 4
    meta.update(ROW_PAD=1, BLOCK_A=1, BLOCK_EL=1)
    if layout is not None:
        dispatched, meta = _dispatch_outputs(x, ids, grid, config, layout)
        a, a_scale, routing = dispatched
        scales = a_scale if a_scale is not None else a
        pointers = (a, scales, routing.row_of, routing.token_of_row, routing.m_indices)
        pointers += (routing.counts, routing.starts, routing.num_rows)
        dims = (layout["experts"], routing.token_of_row.numel())
        strides = (*a.stride(), *scales.stride())
    _gate_kernel[grid](
        # pointers
        x,
        parts,
        partials,
        bias if bias is not None else partials,
        ids,
        weights,
        counters,
        *pointers,
        # dims
        tokens,
        experts,
        hidden,
        k_slice,
        *dims,
        # strides
        x.stride(0),
        x.stride(1),
        parts.stride(0),
        parts.stride(1),
        parts.stride(2),
        partials.stride(0),
        partials.stride(1),
        ids.stride(0),
        weights.stride(0),
        *strides,
        # meta-parameters
        UPCAST=triton.knobs.runtime.interpret,
        ROUTER_T=config["BLOCK_T"],
        ROUTER_E=config["BLOCK_E"],
        ROUTER_K=config["BLOCK_K"],
        **choice_meta(experts, has_bias=bias is not None, **choice),
        SLICES_AT_ONCE=SLICES_AT_ONCE,
        **meta,
        SOFT_ROUND=triton.knobs.runtime.interpret,
        num_warps=config["num_warps"],
        num_stages=config.get("num_stages", 2),
        **launch_options(pdl),
    )
    return weights, ids, dispatched


def _dispatch_outputs(x, ids, grid, config, layout):
    """((a, a_scale, routing) to fill, the kernel's dispatch meta-parameters) of the one-launch
    gate's dispatch."""
    quant, group_size = layout.get("quant", "none"), layout.get("group_size", 128)
    if quant not in ("none", "group"):
        raise ValueError(f"the gate's launch quantizes per group or not at all, not {quant!r}")
    if grid[1] != 1:
        raise ValueError("the dispatch in the gate's launch needs the tokens in one token tile")
    if quant == "group" and config["BLOCK_K"] % group_size:
        raise ValueError(
            f"BLOCK_K={config['BLOCK_K']} is not a multiple of group_size={group_size}"
        )
    routing = empty_contiguous(ids, layout["experts"], layout["block_m"])
    if quant == "none":
        a, a_scale = x, None
    else:
        a, a_scale = empty_rows(x, (x.shape[0],), quant, group_size)
    meta = {
        "DISPATCH": True,
        "QUANT": quant,
        "GROUP_SIZE": group_size,
        "UE8M0": layout.get("ue8m0", False),
        "ROW_PAD": layout["block_m"],
        "BLOCK_A": max(triton.next_power_of_2(ids.numel()), 16),
        "BLOCK_EL": triton.next_power_of_2(layout["experts"] + 1),
    }
    return (a, a_scale, routing), meta
