"""select_hash: hash-routed expert selection (DeepSeek-V4's hash_moe layers), one program per
token: the experts are the token's row of the table, tid2eid[token_id] (no choice among the
scores), the weights the scores of those experts (SCORING softmax | sigmoid | sqrtsoftplus of
the fp32 logits, or of the sum of the split-K router's partial logits, in slice order),
renormalized and scaled as asked (rounded as ROUNDING says), then FUSED_SHARED extra experts E.. with weight 1: what
torch_select.select_hash computes.

Token ids are checked against the table on the host before the launch (the layer's forward);
the kernel reads row 0 for an id outside it (a captured CUDA graph skips that check) instead
of reading past the table.
"""

import torch
import triton
import triton.language as tl

from .triton_numerics import launch_options, wait_inputs
from .triton_select import (
    SLICES_AT_ONCE,
    finish_choice,
    rounding_meta,
    score_row,
    store_choice,
    sum_partials,
)


@triton.jit
def _select_hash_kernel(
    # pointers
    logits_ptr,  # [S, T, E] fp32: S partial sums (split-K router) to add, in order
    token_ids_ptr,  # [T] int64 or int32
    table_ptr,  # [V, TOP_K] int32: tid2eid
    ids_ptr,  # [T, TOP_K + FUSED_SHARED] int32 out
    weights_ptr,  # [T, TOP_K + FUSED_SHARED] fp32 out
    # dims
    E,
    S,
    V,
    # strides
    stride_ls,
    stride_lt,
    stride_tv,
    stride_it,
    stride_wt,
    # meta-parameters
    SCORING: tl.constexpr,
    TOP_K: tl.constexpr,
    NORMALIZE: tl.constexpr,
    ROUTED_SCALING: tl.constexpr,
    FUSED_SHARED: tl.constexpr,
    ROUNDING: tl.constexpr,  # router.rounding: none | logits | all
    ROUND_TO: tl.constexpr,  # the model dtype it rounds to
    SOFT_ROUND: tl.constexpr,  # interpreter: round to bf16 in software (its cast truncates)
    BLOCK_E: tl.constexpr,  # power of two >= E
    BLOCK_K: tl.constexpr,  # power of two >= TOP_K + FUSED_SHARED
    SLICES_AT_ONCE: tl.constexpr,  # partial logits loaded per step
    PDL: tl.constexpr,
):
    wait_inputs(PDL)
    t = tl.program_id(0).to(tl.int64)
    logits = sum_partials(logits_ptr + t * stride_lt, E, S, stride_ls, BLOCK_E, SLICES_AT_ONCE, "")
    scores = score_row(logits, E, SCORING, ROUNDING, ROUND_TO, SOFT_ROUND, BLOCK_E)  # [BLOCK_E]
    token = tl.load(token_ids_ptr + t).to(tl.int64)
    token = tl.where((token >= 0) & (token < V), token, 0)  # never past the table
    slot = tl.arange(0, BLOCK_K)
    routed = slot < TOP_K
    top_ids = tl.load(table_ptr + token * stride_tv + slot, mask=routed, other=0)
    top_weights = tl.where(routed, tl.gather(scores, top_ids, 0), 0.0)
    top_ids, top_weights = finish_choice(
        top_ids, top_weights, E, TOP_K, NORMALIZE, ROUTED_SCALING, ROUNDING, ROUND_TO,
        SOFT_ROUND, BLOCK_K,
    )  # fmt: skip
    store_choice(
        ids_ptr + t * stride_it, weights_ptr + t * stride_wt, top_ids, top_weights,
        TOP_K + FUSED_SHARED, BLOCK_K,
    )  # fmt: skip


def select_hash(
    logits,
    token_ids,
    tid2eid,
    *,
    scoring_func,
    norm_topk_prob,
    routed_scaling_factor,
    fused_shared,
    rounding="none",
    round_to=None,
    pdl=False,
):
    """(weights [T, K'] fp32, ids [T, K'] int32), K' = top_k + fused_shared, for logits [T, E]
    fp32 or partial logits [S, T, E], token_ids [T] and tid2eid [V, top_k] int32; the keywords
    as torch_select.select_hash's. One warp per token, as select_topk."""
    if logits.dim() == 2:
        logits = logits.unsqueeze(0)
    _, tokens, experts = logits.shape
    vocab, top_k = tid2eid.shape
    width = top_k + fused_shared
    ids = torch.empty((tokens, width), dtype=torch.int32, device=logits.device)
    weights = torch.empty((tokens, width), dtype=torch.float32, device=logits.device)
    if tokens:
        _select_hash_kernel[(tokens,)](
            # pointers
            logits,
            token_ids,
            tid2eid,
            ids,
            weights,
            # dims
            experts,
            logits.shape[0],
            vocab,
            # strides
            logits.stride(0),
            logits.stride(1),
            tid2eid.stride(0),
            ids.stride(0),
            weights.stride(0),
            # meta-parameters
            SCORING=scoring_func,
            TOP_K=top_k,
            NORMALIZE=norm_topk_prob,
            ROUTED_SCALING=routed_scaling_factor,
            FUSED_SHARED=fused_shared,
            **rounding_meta(rounding, round_to),
            BLOCK_E=triton.next_power_of_2(experts),
            BLOCK_K=triton.next_power_of_2(width),
            SLICES_AT_ONCE=SLICES_AT_ONCE,
            num_warps=1,
            **launch_options(pdl),
        )
    return weights, ids
