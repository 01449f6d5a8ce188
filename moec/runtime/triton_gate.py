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

The counters are the layer's: int32 zeros, at least one per token tile; every launch leaves
them zero. Two launches with the same counters must not run at once (two streams).
"""

import torch
import triton
import triton.language as tl

from .triton_numerics import launch_options, wait_inputs
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
def _gate_kernel(
    # pointers
    x_ptr,  # [T, H] bf16
    parts_ptr,  # [PARTS, E, H] bf16
    partials_ptr,  # [S, T, E] fp32 scratch: the partial logits of each K slice
    bias_ptr,  # [E] fp32 (HAS_BIAS)
    ids_ptr,  # [T, TOP_K + FUSED_SHARED] int32 out
    weights_ptr,  # [T, TOP_K + FUSED_SHARED] fp32 out
    counters_ptr,  # [>= token tiles] int32, zero: programs of each token tile done
    # dims
    T,
    E,
    H,
    K_SLICE,  # hidden elements per K slice, a multiple of ROUTER_K
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
    # meta-parameters: the router's
    PARTS: tl.constexpr,  # bf16 parts of the weight (triton_router)
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
    ROUNDING: tl.constexpr,
    ROUND_TO: tl.constexpr,
    SOFT_ROUND: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_TOP: tl.constexpr,
    PER_GROUP: tl.constexpr,
    SLICES_AT_ONCE: tl.constexpr,
    PDL: tl.constexpr,
):
    wait_inputs(PDL)
    acc = partial_logits(
        x_ptr, parts_ptr, T, E, H, K_SLICE, stride_xt, stride_xh, stride_pp, stride_pe,
        stride_ph, PARTS, UPCAST, ROUTER_T, ROUTER_E, ROUTER_K,
    )  # fmt: skip
    store_partial_logits(partials_ptr, acc, T, E, stride_ls, stride_lt, 1, ROUTER_T, ROUTER_E)
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
                TOP_K, NORMALIZE, ROUTED_SCALING, FUSED_SHARED, ROUNDING, ROUND_TO, SOFT_ROUND,
                BLOCK_E, BLOCK_K, BLOCK_TOP, PER_GROUP, True,
            )  # fmt: skip
            store_choice(
                ids_ptr + t * stride_it, weights_ptr + t * stride_wt, top_ids, top_weights,
                TOP_K + FUSED_SHARED, BLOCK_K,
            )  # fmt: skip


def gate(x, parts, bias, counters, *, config, one_launch, pdl=False, **choice):
    """(weights [T, K'] fp32, ids [T, K'] int32) of x [T, H] bf16 routed by the router weight's
    bf16 parts [P, E, H] (triton_router) and bias [E] fp32 or None, as select_topk of
    router_logits; `choice`: select_topk's options (scoring_func, topk_method, n_group,
    topk_group, top_k, norm_topk_prob, routed_scaling_factor, fused_shared; rounding and
    round_to where the router rounds). config: the
    router's tiles; up to one_launch tokens one launch, with counters [>= one_launch] int32
    (zeros, left zero); above, two."""
    tokens, hidden = x.shape
    if tokens > one_launch or tokens == 0:
        logits = router_logits(x, parts, config=config, pdl=pdl)
        return select_topk(logits, bias, pdl=pdl, **choice)
    experts = parts.shape[1]
    grid, k_slice = split_k(tokens, experts, hidden, config)
    if grid[1] > counters.numel():
        raise ValueError(f"{grid[1]} token tiles need as many counters, got {counters.numel()}")
    width = choice["top_k"] + choice["fused_shared"]
    partials = torch.empty((grid[2], tokens, experts), dtype=torch.float32, device=x.device)
    ids = torch.empty((tokens, width), dtype=torch.int32, device=x.device)
    weights = torch.empty((tokens, width), dtype=torch.float32, device=x.device)
    _gate_kernel[grid](
        # pointers
        x,
        parts,
        partials,
        bias if bias is not None else partials,
        ids,
        weights,
        counters,
        # dims
        tokens,
        experts,
        hidden,
        k_slice,
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
        # meta-parameters
        PARTS=parts.shape[0],
        UPCAST=triton.knobs.runtime.interpret,
        ROUTER_T=config["BLOCK_T"],
        ROUTER_E=config["BLOCK_E"],
        ROUTER_K=config["BLOCK_K"],
        **choice_meta(experts, has_bias=bias is not None, **choice),
        SLICES_AT_ONCE=SLICES_AT_ONCE,
        num_warps=config["num_warps"],
        num_stages=config.get("num_stages", 2),
        **launch_options(pdl),
    )
    return weights, ids
