"""Top-k expert selection with torch ops: scores, (grouped) choice, weights.

scoring_func: softmax | sigmoid | sqrtsoftplus (sqrt(softplus(x))).
topk_method: greedy (top-k of all experts); group_limited_greedy (top-k within the topk_group
groups whose best expert scores highest); noaux_tc (as grouped, ranking groups by the sum of
their top-2 scores, with `e_score_correction_bias` added to the choice but not the weights);
hash (DeepSeek-V4's hash_moe layers: a frozen table of token ids chooses, `select_hash`).
rounding (router.rounding, to `round_to`, the model dtype): none; logits (the logits rounded,
then fp32); all (the logits, the scoring and the weights computed in that dtype, op by op as
torch computes in it; the bias-corrected choice in fp32).
"""

import torch
import torch.nn.functional as F


def scores_of(
    logits: torch.Tensor, scoring_func: str, rounding: str = "none", round_to=None
) -> torch.Tensor:
    """[T, E] fp32 logits -> [T, E] fp32 scores, rounded to `round_to` as `rounding` says."""
    if rounding != "none":  # the gate GEMM's output in the model dtype
        logits = logits.to(round_to)
        if rounding == "logits":
            logits = logits.float()
    scores = _score(logits, scoring_func)  # under "all": each op rounds to round_to
    return scores.float()


def _score(logits: torch.Tensor, scoring_func: str) -> torch.Tensor:
    if scoring_func == "softmax":
        return logits.softmax(dim=-1)
    if scoring_func == "sigmoid":
        return logits.sigmoid()
    return F.softplus(logits).sqrt()


def _keep_groups(choice, n_group: int, topk_group: int, by_top2: bool) -> torch.Tensor:
    """The choice with experts outside each token's best `topk_group` groups masked out."""
    tokens, experts = choice.shape
    grouped = choice.view(tokens, n_group, experts // n_group)  # [T, G, E/G]
    if by_top2:
        group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)  # [T, G]
    else:
        group_scores = grouped.amax(dim=-1)  # [T, G]: best expert of each group
    kept = group_scores.topk(topk_group, dim=-1, sorted=False).indices  # [T, topk_group]
    group_mask = torch.zeros_like(group_scores).scatter_(1, kept, 1.0)  # [T, G]
    expert_mask = (
        group_mask.unsqueeze(-1).expand(-1, -1, experts // n_group).reshape(tokens, experts)
    )
    return choice.masked_fill(expert_mask == 0, float("-inf") if by_top2 else 0.0)


def select_topk(
    logits: torch.Tensor,
    bias: torch.Tensor | None,
    *,
    scoring_func: str,
    topk_method: str,
    n_group: int,
    topk_group: int,
    top_k: int,
    norm_topk_prob: bool,
    routed_scaling_factor: float,
    fused_shared: int,
    rounding: str = "none",
    round_to: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(topk_weights [T, K'] fp32, topk_ids [T, K'] int32), K' = top_k + fused_shared: the
    fused shared experts E.. follow every token's choice with weight 1."""
    scores = scores_of(logits, scoring_func, rounding, round_to)
    if topk_method == "greedy":
        topk_ids = scores.topk(top_k, dim=-1, sorted=False).indices  # [T, K]
    else:
        choice = scores + bias if bias is not None else scores  # the bias steers the choice only
        if n_group > 1:
            choice = _keep_groups(choice, n_group, topk_group, topk_method == "noaux_tc")
        topk_ids = choice.topk(top_k, dim=-1, sorted=False).indices  # [T, K]
    weights_to = round_to if rounding == "all" else None
    return _weights_of(
        scores, topk_ids, norm_topk_prob, routed_scaling_factor, fused_shared, weights_to
    )


def select_hash(
    logits: torch.Tensor,
    token_ids: torch.Tensor,
    tid2eid: torch.Tensor,
    *,
    scoring_func: str,
    norm_topk_prob: bool,
    routed_scaling_factor: float,
    fused_shared: int,
    rounding: str = "none",
    round_to: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """As select_topk, with the experts of each token from the hash table: tid2eid[token_ids]
    [T, K]; the weights are the scores of those experts (transformers' DeepseekV4HashRouter)."""
    scores = scores_of(logits, scoring_func, rounding, round_to)  # [T, E]
    topk_ids = tid2eid[token_ids.long()].long()  # [T, K]
    weights_to = round_to if rounding == "all" else None
    return _weights_of(
        scores, topk_ids, norm_topk_prob, routed_scaling_factor, fused_shared, weights_to
    )


def _weights_of(scores, topk_ids, norm_topk_prob, routed_scaling_factor, fused_shared, dtype):
    """(weights fp32, ids int32) of the chosen experts: their scores, renormalized and scaled
    as asked (in `dtype`, each op rounding to it, where not None), then the fused shared
    experts with weight 1."""
    tokens, experts = scores.shape
    topk_weights = scores.gather(1, topk_ids)  # [T, K]
    if dtype is not None:
        topk_weights = topk_weights.to(dtype)
    if norm_topk_prob:
        topk_weights = topk_weights / (topk_weights.sum(dim=-1, keepdim=True) + 1e-20)
    if routed_scaling_factor != 1.0:
        topk_weights = topk_weights * routed_scaling_factor
    topk_weights = topk_weights.float()
    if fused_shared:
        shared_ids = torch.arange(experts, experts + fused_shared, device=scores.device)
        topk_ids = torch.cat((topk_ids, shared_ids.expand(tokens, fused_shared)), dim=1)
        ones = topk_weights.new_ones(tokens, fused_shared)
        topk_weights = torch.cat((topk_weights, ones), dim=1)
    return topk_weights, topk_ids.to(torch.int32)
