"""select: top-k expert selection from router logits, one program per token.

select_topk   scores from fp32 logits (SCORING softmax | sigmoid | sqrtsoftplus), choice =
              scores (+ correction bias), expert groups (METHOD group_limited_greedy: best
              expert per group; noaux_tc: sum of the top-2), the best groups and the top-k
              experts by repeated argmax (the lower index first among equal values), weights =
              scores of the chosen experts (renormalized, scaled), then FUSED_SHARED extra
              experts E.. with weight 1. select_row can instead find each by one sort
              (BY_SORT, the same choice): faster in the router's 4-warp programs
              (triton_gate), slower on select_topk's one warp at 256 experts (H200,
              benchmarks/RESULTS.md run 60). ROUNDING (router.rounding, to ROUND_TO):
              logits rounds the logits; all also each step of the scoring and of the
              weights, as torch_select computes them in that dtype.
The jit helpers (sum_partials, select_row, store_choice) are shared with triton_gate, and
sum_partials, score_row and store_choice with triton_hash.
"""

import torch
import triton
import triton.language as tl

from .triton_numerics import launch_options, round_through, wait_inputs

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
def score_row(
    logits,
    E,
    SCORING: tl.constexpr,
    ROUNDING: tl.constexpr,
    ROUND_TO: tl.constexpr,
    SOFT_ROUND: tl.constexpr,
    BLOCK_E: tl.constexpr,
):
    """One token's scores [BLOCK_E] fp32 (0 past E) from its logits (-inf past E), rounded
    to ROUND_TO as ROUNDING says (SOFT_ROUND: in software, under the interpreter)."""
    e = tl.arange(0, BLOCK_E)
    if ROUNDING != "none":  # the gate GEMM's output in the model dtype
        logits = round_through(logits, ROUND_TO, SOFT_ROUND)
    if SCORING == "softmax":
        shifted = tl.exp(logits - tl.max(logits, axis=0))
        if ROUNDING == "all":  # IEEE division, as torch's: the rounding sees its exact fp32
            scores = tl.math.div_rn(shifted, tl.sum(shifted, axis=0))
        else:
            scores = shifted / tl.sum(shifted, axis=0)
    elif SCORING == "sigmoid":
        scores = tl.sigmoid(logits)
    else:  # sqrt(softplus(x)), softplus(x) = max(x, 0) + log1p(exp(-|x|))
        y = tl.exp(-tl.abs(logits))
        z = 1.0 + y  # log1p(y) = log(z) * y / (z - 1): exact up to a few ulps (Kahan)
        exact = z == 1.0
        log1p = tl.where(exact, y, tl.log(z) * (y / tl.where(exact, 1.0, z - 1.0)))
        softplus = tl.maximum(logits, 0.0) + log1p
        if ROUNDING == "all":  # torch rounds softplus, then its (IEEE) sqrt
            scores = tl.sqrt_rn(round_through(softplus, ROUND_TO, SOFT_ROUND))
        else:
            scores = tl.sqrt(softplus)
    if ROUNDING == "all":
        scores = round_through(scores, ROUND_TO, SOFT_ROUND)
    return tl.where(e < E, scores, 0.0)


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
    ROUNDING: tl.constexpr,
    ROUND_TO: tl.constexpr,
    SOFT_ROUND: tl.constexpr,
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
    scores = score_row(logits, E, SCORING, ROUNDING, ROUND_TO, SOFT_ROUND, BLOCK_E)
    choice = scores
    if HAS_BIAS:
        choice = choice + tl.load(bias_ptr + e, mask=valid, other=0.0)
    # a NaN score (a NaN token row) ranks at -1e30: below every real score, above the -inf of
    # padding and of experts taken (finite, as is a group's top-2 sum of two): the ids stay
    # experts of the layer, and the NaN weights make that token's output NaN alone
    not_nan = choice == choice  # noqa: PLR0124  (NaN alone differs from itself)
    choice = tl.where(valid, tl.where(not_nan, choice, -1e30), float("-inf"))
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
    # one reduction either way: the same sum
    return finish_choice(
        top_ids, top_weights, E, TOP_K, NORMALIZE, ROUTED_SCALING, ROUNDING, ROUND_TO,
        SOFT_ROUND, BLOCK_K,
    )  # fmt: skip


@triton.jit
def finish_choice(
    top_ids,
    top_weights,
    E,
    TOP_K: tl.constexpr,
    NORMALIZE: tl.constexpr,
    ROUTED_SCALING: tl.constexpr,
    ROUNDING: tl.constexpr,
    ROUND_TO: tl.constexpr,
    SOFT_ROUND: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """A token's chosen (ids, weights) in its first TOP_K of BLOCK_K slots -> the row as
    stored: weights renormalized and scaled (under ROUNDING "all" each op rounded to ROUND_TO),
    the fused shared experts E.. after, weight 1."""
    slot = tl.arange(0, BLOCK_K)
    total = tl.sum(top_weights, axis=0)
    if ROUNDING == "all":  # as torch in ROUND_TO: the sum, + 1e-20, the quotient, the product
        if NORMALIZE:
            total = round_through(total, ROUND_TO, SOFT_ROUND)
            total = round_through(total + 1e-20, ROUND_TO, SOFT_ROUND)
            top_weights = round_through(tl.math.div_rn(top_weights, total), ROUND_TO, SOFT_ROUND)
        if ROUTED_SCALING != 1.0:
            top_weights = round_through(top_weights * ROUTED_SCALING, ROUND_TO, SOFT_ROUND)
    else:
        if NORMALIZE:  # as the torch backend: w / (sum + 1e-20) * scale
            top_weights = top_weights / (total + 1e-20)
        if ROUTED_SCALING != 1.0:
            top_weights = top_weights * ROUTED_SCALING
    shared = slot >= TOP_K
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
    ROUNDING: tl.constexpr,  # router.rounding: none | logits | all
    ROUND_TO: tl.constexpr,  # the model dtype it rounds to
    SOFT_ROUND: tl.constexpr,  # interpreter: round to bf16 in software (its cast truncates)
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
        NORMALIZE, ROUTED_SCALING, FUSED_SHARED, ROUNDING, ROUND_TO, SOFT_ROUND, BLOCK_E, BLOCK_K,
        BLOCK_TOP, PER_GROUP, False,
    )  # fmt: skip
    store_choice(
        ids_ptr + t * stride_it, weights_ptr + t * stride_wt, top_ids, top_weights,
        TOP_K + FUSED_SHARED, BLOCK_K,
    )  # fmt: skip


def select_topk(logits, bias, *, pdl=False, num_warps=1, **choice):
    """Top-k selection for every token of logits [T, E] fp32, or of the sum of partial logits
    [S, T, E] (the split-K router's), with bias [E] fp32 or None, as torch_select.select_topk
    with the same keywords (`choice`: scoring_func, topk_method, n_group, topk_group, top_k,
    norm_topk_prob, routed_scaling_factor, fused_shared, and rounding, round_to where the
    router rounds; choice_meta names them):
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
    rounding="none",
    round_to=None,
) -> dict:
    """The meta-parameters of select_row (and store_choice's BLOCK_K) for these options."""
    block_e = triton.next_power_of_2(experts)
    return {
        **rounding_meta(rounding, round_to),
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


ROUND_TO = {
    torch.bfloat16: "bfloat16",
    torch.float16: "float16",
    torch.float32: "float32",
    None: "float32",
}
"""The model dtype a router rounds to, as round_through names it (None: no rounding)."""


def rounding_meta(rounding: str, round_to: torch.dtype | None) -> dict:
    """The meta-parameters of the router's rounding (score_row, finish_choice)."""
    return {
        "ROUNDING": rounding,
        "ROUND_TO": ROUND_TO[round_to],
        "SOFT_ROUND": triton.knobs.runtime.interpret,
    }
