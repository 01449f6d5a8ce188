"""Redundant experts and placements: a layer whose physical experts are replicas placed by
`parallel.placement` is the layer without them (the replica a token goes to holds the same
weights), on one rank and on 2 and 4 gloo ranks, torch and Triton, both replica choices.

float32 (and fp8 blocks, which quantize each token alike wherever it goes): the results differ
only by summation order (relative error <= 1e-5, as tests/test_distributed.py)."""

from __future__ import annotations

import pytest
import torch
from conftest import EXAMPLES
from test_distributed import FP8, HIDDEN, SPEC, _error, _one_rank, _run

PLACED_2 = "parallel.placement=[[5, 6, 7, 0, 1, 5], [2, 3, 4, 5, 6, 0]]"
"""8 experts + 4 replicas on 2 ranks: rank 0 holds expert 5 twice; 2, 3, 4 only on rank 1."""
PLACED_4 = "parallel.placement=[[7, 0, 1], [2, 7, 3], [4, 5, 7], [6, 0, 2]]"


def _placed(ranks: int, *more: str) -> list[str]:
    placement = PLACED_2 if ranks == 2 else PLACED_4
    return [
        "parallel.dispatch=all2all",
        f"parallel.ep_size={ranks}",
        "parallel.redundant_experts=4",
        placement,
        *more,
    ]


def _unplaced(overrides: list[str]) -> list[str]:
    return [o for o in overrides if not o.startswith("parallel.")]


def test_two_ranks(load_layer, tmp_path):
    """EP=2, 4 redundant experts placed unevenly: static and random replicas, torch masked and
    Triton contiguous; rank 0 has no tokens, and (bias) receives none either."""
    tokens = 20
    x = torch.randn(tokens, HIDDEN, generator=torch.Generator().manual_seed(31))
    only_rank_1 = {7: -100.0, 1: -100.0}  # the experts only rank 0 holds are never chosen
    cases = [
        (_placed(2), False, {}),
        (_placed(2, "parallel.replica_choice=random", "experts.layout=masked"), False, {}),
        (_placed(2), False, only_rank_1),
        (_placed(2, "parallel.replica_choice=random", "experts.gemm_backend=triton",
                 "experts.layout=contiguous", *FP8), False, {}),
    ]  # fmt: skip
    results = _run(load_layer, tmp_path, 2, cases, x, [0, 0, tokens])
    for (overrides, _, bias), outputs in zip(cases, results, strict=True):
        assert outputs[0].shape == (0, HIDDEN)
        expected = _one_rank(load_layer, x, _unplaced(overrides), bias)
        assert _error(torch.cat(outputs), expected) <= 1e-5, overrides


def test_four_ranks(load_layer, tmp_path):
    """EP=4, 4 redundant experts placed unevenly, rank 1 without tokens: torch static, Triton
    fp8 random."""
    tokens = 14
    x = torch.randn(tokens, HIDDEN, generator=torch.Generator().manual_seed(32))
    cases = [
        (_placed(4, "experts.layout=contiguous"), False, {}),
        (_placed(4, "parallel.replica_choice=random", "experts.gemm_backend=triton",
                 "experts.layout=contiguous", *FP8), False, {}),
    ]  # fmt: skip
    results = _run(load_layer, tmp_path, 4, cases, x, [0, 5, 5, 11, tokens])
    for (overrides, _, _), outputs in zip(cases, results, strict=True):
        expected = _one_rank(load_layer, x, _unplaced(overrides))
        assert _error(torch.cat(outputs), expected) <= 1e-5, overrides


@pytest.mark.parametrize(
    "overrides",
    [
        ["parallel.redundant_experts=3"],
        ["parallel.redundant_experts=3", "parallel.replica_choice=random"],
        ["parallel.redundant_experts=2", "parallel.placement=[[3, 1, 2, 0, 4, 5, 7, 6, 3, 3]]"],
        ["parallel.redundant_experts=3", "parallel.replica_choice=random",
         "experts.gemm_backend=triton", "experts.layout=contiguous", *FP8],
    ],
    ids=["static", "random", "permuted", "triton-random-fp8"],
)  # fmt: skip
def test_one_rank(load_layer, overrides):
    """Replicas in one layer: the same function as the layer without them."""
    x = torch.randn(17, HIDDEN, generator=torch.Generator().manual_seed(33))
    placed = load_layer(SPEC, *overrides).MoELayer().random_(11)
    assert placed.w13.shape[0] == 8 + int(overrides[0].split("=")[1])
    expected = _one_rank(load_layer, x, _unplaced(overrides))
    assert _error(placed(x), expected) <= 1e-5


def test_random_replicas_spread():
    """The random choice sends an expert's tokens to each of its replicas, about equally, and
    the same positions to the same replicas."""
    from moec.runtime.placement import random_replicas

    ids = torch.zeros(4096, 1, dtype=torch.int32)
    table, count = torch.tensor([[4, 9, 11]], dtype=torch.int32), torch.tensor([3])
    chosen = random_replicas(ids, table, count)
    share = torch.stack([(chosen == p).float().mean() for p in (4, 9, 11)])
    assert (share - 1 / 3).abs().max() < 0.03
    assert torch.equal(chosen, random_replicas(ids, table, count))


def test_loads_replicas_from_their_experts(load_layer, tmp_path):
    """load_weights fills each physical expert from its logical expert's tensors."""
    from safetensors.torch import save_file

    source = load_layer(SPEC).MoELayer().random_(5)
    gen = torch.Generator().manual_seed(34)
    tensors = {"gate.weight": source.gate_weight.clone(), "gate.e_score_correction_bias":
               source.gate_bias.clone()}  # fmt: skip
    for e in range(8):
        gate, up = source.w13[e].chunk(2)
        tensors |= {f"experts.{e}.gate_proj.weight": gate.clone(),
                    f"experts.{e}.up_proj.weight": up.clone(),
                    f"experts.{e}.down_proj.weight": source.w2[e].clone()}  # fmt: skip
    gate, up = source.shared_w13.chunk(2)
    tensors |= {"shared_experts.gate_proj.weight": gate.clone(),
                "shared_experts.up_proj.weight": up.clone(),
                "shared_experts.down_proj.weight": source.shared_w2.clone()}  # fmt: skip
    save_file(tensors, str(tmp_path / "model.safetensors"))
    overrides = [
        "parallel.redundant_experts=2",
        "parallel.placement=[[3, 1, 2, 0, 4, 5, 7, 6, 3, 6]]",
    ]
    layer = load_layer(SPEC, *overrides).MoELayer().load_weights(str(tmp_path))
    for physical, logical in enumerate([3, 1, 2, 0, 4, 5, 7, 6, 3, 6]):
        assert torch.equal(layer.w13[physical], source.w13[logical])
        assert torch.equal(layer.w2[physical], source.w2[logical])
    x = torch.randn(9, HIDDEN, generator=gen)
    assert _error(layer(x), source(x)) <= 1e-5


@pytest.mark.parametrize(
    "overrides",
    [
        ["parallel.dispatch=all2all", "experts.gemm_backend=triton"],
        ["parallel.dispatch=deepep_normal", "experts.gemm_backend=deep_gemm"],
        ["parallel.dispatch=deepep_low_latency", "experts.layout=masked",
         "parallel.max_tokens_per_rank=128", "target.max_num_tokens=128"],
    ],
    ids=["all2all-triton", "deepep-normal", "deepep-low-latency"],
)  # fmt: skip
def test_every_dispatch_takes_physical_ids(overrides):
    """DeepSeek-V3 on 8 ranks with 32 redundant experts: whatever the dispatch, it reads the
    place stage's physical ids and owns 36 physical experts per rank; the package renders."""
    from moec.codegen import render_package
    from moec.plan import Environment, plan_loaded
    from moec.spec import load_spec

    env = Environment(frozenset({"triton", "deep_gemm", "deep_ep"}))
    loaded = load_spec(
        str(EXAMPLES / "deepseek-v3-fp8.toml"),
        ["parallel.ep_size=8", "parallel.redundant_experts=32", *overrides],
    )
    plan = plan_loaded(loaded, env)
    (edge,) = [e for p, e in plan.inputs("dispatch") if e.input == "topk_ids"]
    assert (edge.tensor, plan.layer.local_experts) == ("physical_ids", 36)
    assert plan.stage("dispatch").experts == 36
    stages = render_package(loaded, env)["stages.py"].decode()
    assert "placement.static_replicas(topk_ids, replica_of)" in stages
