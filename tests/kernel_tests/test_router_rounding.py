"""router.rounding in the Triton selection (select_topk, the one-launch gate, select_hash)
against a router written out in the model dtype, as transformers' routers compute it: "logits"
as Qwen3-MoE's (F.linear in bf16, then an fp32 softmax), "all" as DeepSeek-V4's (the scoring
function and the weights' arithmetic on bf16 tensors).

Every value is rounded to nearest even; the chosen experts must be the same (rows whose k-th
and (k+1)-th choice tie after the rounding are left out: the kernels take the lower expert,
torch.topk any), and under "all" the weights are equal bit for bit (each is one rounding of the
same fp32 value); under "logits" within fp32 rounding of the scores.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from moec.runtime import triton_hash

from .harness import DEVICE, load, on_device

select_hash = triton_hash.select_hash if DEVICE == "cpu" else on_device(triton_hash.select_hash)

TOKENS, EXPERTS, TOP_K = 41, 48, 4


def _score(logits: torch.Tensor, scoring: str) -> torch.Tensor:
    """In logits' own dtype, as transformers' ACT2FN / softmax compute on it."""
    if scoring == "softmax":
        return logits.softmax(dim=-1)
    if scoring == "sigmoid":
        return logits.sigmoid()
    return F.softplus(logits).sqrt()


def model_dtype_router(logits, bias, scoring, rounding, dtype, top_k, normalize, scale, ids=None):
    """(weights fp32, ids, choice fp32): the router of a model in `dtype`, from fp32 logits."""
    low = logits.to(dtype)
    scores = _score(low, scoring) if rounding == "all" else _score(low.float(), scoring)
    choice = scores.float() + bias if bias is not None else scores.float()
    if ids is None:
        ids = torch.topk(choice, top_k, dim=-1).indices
    weights = scores.gather(1, ids)  # in dtype under "all", fp32 under "logits"
    if normalize:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    weights = weights * scale
    return weights.float(), ids, choice


def _untied(choice: torch.Tensor, top_k: int) -> torch.Tensor:
    """Rows whose k-th and (k+1)-th best choices differ."""
    best = choice.topk(top_k + 1, dim=-1).values
    return best[:, top_k - 1] != best[:, top_k]


def _compare(weights, ids, want_weights, want_ids, choice, rounding, top_k):
    rows = _untied(choice, top_k)
    assert rows.float().mean() > 0.8  # the comparison covers most rows
    ours = ids[rows, :top_k].long()
    assert torch.equal(ours.sort(-1).values, want_ids[rows].sort(-1).values)
    got = weights[rows, :top_k].gather(1, ours.argsort(-1))
    want = want_weights[rows].gather(1, want_ids[rows].argsort(-1))
    if rounding == "all":
        assert torch.equal(got, want)
    else:
        assert torch.allclose(got, want, rtol=8 * 2**-24, atol=0)


V4 = dict(  # DeepSeek-V4's routed layers, ungrouped (select_topk's keywords)
    scoring_func="sqrtsoftplus",
    topk_method="noaux_tc",
    n_group=1,
    topk_group=1,
    top_k=TOP_K,
    norm_topk_prob=True,
    routed_scaling_factor=1.5,
    fused_shared=0,
)

CHOICES = [  # (scoring, method, normalize, scale, bias)
    ("sqrtsoftplus", "noaux_tc", True, 1.5, True),  # DeepSeek-V4
    ("softmax", "greedy", True, 1.0, False),  # Mixtral, Mistral-4
    ("sigmoid", "greedy", False, 2.0, False),  # LFM2-MoE
]


@pytest.mark.parametrize("rounding", ["logits", "all"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("scoring", "method", "normalize", "scale", "bias"), CHOICES)
def test_select_topk_rounds_as_the_model_dtype(
    rounding, dtype, scoring, method, normalize, scale, bias
):
    kernels = load()
    generator = torch.Generator().manual_seed(len(scoring) + len(rounding))
    logits = 2.0 * torch.randn(TOKENS, EXPERTS, generator=generator)
    b = 0.05 * torch.randn(EXPERTS, generator=generator) if bias else None
    weights, ids = kernels.select_topk(
        logits,
        b,
        scoring_func=scoring,
        topk_method=method,
        n_group=1,
        topk_group=1,
        top_k=TOP_K,
        norm_topk_prob=normalize,
        routed_scaling_factor=scale,
        fused_shared=1,
        rounding=rounding,
        round_to=dtype,
    )
    want_weights, want_ids, choice = model_dtype_router(
        logits, b, scoring, rounding, dtype, TOP_K, normalize, scale
    )
    _compare(weights, ids, want_weights, want_ids, choice, rounding, TOP_K)
    assert (ids[:, TOP_K] == EXPERTS).all() and (weights[:, TOP_K] == 1.0).all()


def test_rounding_differs_from_fp32():
    """The rounded selection is another selection: on these logits, "all" changes experts that
    the fp32 router picks (the test above would pass for a kernel that ignored the rounding
    only if no row changed)."""
    kernels = load()
    logits = 2.0 * torch.randn(TOKENS * 4, EXPERTS, generator=torch.Generator().manual_seed(3))
    options = {**V4, "topk_method": "greedy"}
    fp32_weights, fp32_ids = kernels.select_topk(logits, None, **options)
    weights, ids = kernels.select_topk(
        logits, None, **options, rounding="all", round_to=torch.bfloat16
    )
    assert not torch.equal(fp32_weights, weights)
    assert not torch.equal(fp32_ids.sort(-1).values, ids.sort(-1).values)


@pytest.mark.parametrize("rounding", ["logits", "all"])
def test_one_launch_gate_rounds_as_select(rounding):
    """The router and selection in one launch round as select_topk does, bit for bit."""
    kernels = load()
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(5, 128, generator=generator).bfloat16()
    weight = (torch.randn(EXPERTS, 128, generator=generator) * 128**-0.5).bfloat16()
    parts = weight.unsqueeze(0).contiguous()  # a bf16 weight: its one part
    bias = 0.05 * torch.randn(EXPERTS, generator=generator)
    choice = {**V4, "rounding": rounding, "round_to": torch.bfloat16}
    config = {"BLOCK_T": 16, "BLOCK_E": 32, "BLOCK_K": 64, "PROGRAMS": 4, "num_warps": 4}
    counters = torch.zeros(1, dtype=torch.int32)
    weights, ids = kernels.gate(x, parts, bias, counters, config=config, one_launch=8, **choice)
    logits = kernels.router_logits(x, parts, config=config)
    want_weights, want_ids = kernels.select_topk(logits, bias, **choice)
    assert torch.equal(ids, want_ids) and torch.equal(weights, want_weights)


@pytest.mark.parametrize("rounding", ["logits", "all"])
def test_select_hash_rounds_as_the_model_dtype(rounding):
    """DeepSeek-V4's hash layers: the table's experts, weighted as its router rounds."""
    generator = torch.Generator().manual_seed(7)
    logits = 2.0 * torch.randn(9, EXPERTS, generator=generator)
    table = torch.rand(50, EXPERTS, generator=generator).argsort(1)[:, :TOP_K].to(torch.int32)
    token_ids = torch.randint(0, 50, (9,), generator=generator)
    weights, ids = select_hash(
        logits,
        token_ids,
        table,
        scoring_func="sqrtsoftplus",
        norm_topk_prob=True,
        routed_scaling_factor=1.5,
        fused_shared=0,
        rounding=rounding,
        round_to=torch.bfloat16,
    )
    want_ids = table[token_ids].long()
    want_weights, _, _ = model_dtype_router(
        logits, None, "sqrtsoftplus", rounding, torch.bfloat16, TOP_K, True, 1.5, want_ids
    )
    assert torch.equal(ids.cpu().long(), want_ids)
    if rounding == "all":
        assert torch.equal(weights.cpu(), want_weights)
    else:
        assert torch.allclose(weights.cpu(), want_weights, rtol=8 * 2**-24, atol=0)
