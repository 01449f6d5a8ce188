"""The load counter on 2 gloo ranks. Expert-parallel, with redundant experts placed unevenly:
each rank counts the tokens it routed per logical expert (whatever replica they went to) and
the load file sums the ranks; tensor-parallel, every rank routes every token and the file holds
them once. Reset starts again from zero, and `moec eplb` takes the file. The histogram it must
equal is computed here by transformers' DeepseekV3TopkRouter on the layer's router weights;
torch and Triton (interpreted) alike."""

from __future__ import annotations

import json
from pathlib import Path

import dist_worker
import torch
import torch.multiprocessing as mp
from test_distributed import HIDDEN, SPEC
from test_placement_layer import PLACED_2

from moec.cli import main
from moec.spec import parse_spec

EP_2 = ["parallel.dispatch=all2all", "parallel.ep_size=2", "parallel.redundant_experts=4",
        PLACED_2, "parallel.record_load=true"]  # fmt: skip
CASES = [
    ([*EP_2, "experts.layout=contiguous"], False),
    ([*EP_2, "parallel.replica_choice=random", "experts.gemm_backend=triton",
      "experts.layout=contiguous"], False),
    (["parallel.tp_size=2", "parallel.record_load=true"], True),
]  # fmt: skip
"""(overrides, replicated: every rank runs every token)."""


def _router(weight: torch.Tensor, bias: torch.Tensor):
    """transformers' DeepSeek-V3 router with SPEC's settings and the layer's weights."""
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

    config = DeepseekV3Config(
        hidden_size=HIDDEN, n_routed_experts=8, num_experts_per_tok=3, n_group=4, topk_group=2,
        norm_topk_prob=True, routed_scaling_factor=2.0,
    )  # fmt: skip
    router = DeepseekV3TopkRouter(config)
    router.weight.data.copy_(weight)
    router.e_score_correction_bias.copy_(bias)
    return router


def _histogram(router, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        _, _, ids = router(x)
    return torch.bincount(ids.flatten(), minlength=8)


def test_counts_per_rank_and_the_load_file(load_layer, tmp_path, capsys):
    """Three forwards of different tokens (rank 0 has none in the second), per case."""
    gen = torch.Generator().manual_seed(36)
    batches = [
        (torch.randn(tokens, HIDDEN, generator=gen), split)
        for tokens, split in [(20, [0, 13, 20]), (7, [0, 0, 7]), (11, [0, 6, 11])]
    ]
    jobs = []
    for overrides, replicated in CASES:
        package = load_layer(SPEC, *overrides)
        jobs.append((str(Path(package.__file__).parent), package.__name__, replicated))
    out = str(tmp_path / "out")
    mp.start_processes(
        dist_worker.run_recorded,
        args=(2, str(tmp_path / "init"), jobs, batches, out),
        nprocs=2,
        start_method="spawn",
    )
    per_rank = [torch.load(f"{out}.{rank}") for rank in range(2)]
    for index, ((overrides, replicated), ranks) in enumerate(
        zip(CASES, zip(*per_rank, strict=True), strict=True)
    ):
        router = _router(*ranks[0][:2])
        everything = sum(_histogram(router, x) for x, _ in batches)
        assert int(everything.sum()) == (20 + 7 + 11) * 3
        for rank, (_, _, counts, load, after_reset, after_one) in enumerate(ranks):
            mine = [x if replicated else x[split[rank] : split[rank + 1]] for x, split in batches]
            expected = sum(_histogram(router, x) for x in mine)
            assert counts.dtype == torch.int64 and torch.equal(counts, expected), overrides
            assert torch.equal(after_reset, torch.zeros(8, dtype=torch.int64)), overrides
            assert torch.equal(after_one, _histogram(router, mine[0])), overrides
            assert load == everything.tolist(), overrides  # every rank gets the file's load
        if not replicated:
            assert torch.equal(ranks[0][2] + ranks[1][2], everything)
        load_file = Path(f"{out}.{index}.json")
        assert json.loads(load_file.read_text())["load"] == everything.tolist(), overrides
        placement = tmp_path / f"placement-{index}.json"
        argv = ["eplb", str(load_file), "-o", str(placement), "--ranks", "2", "--redundant", "4"]
        assert main(argv) == 0, capsys.readouterr().err
        spec = SPEC + '[parallel]\ndispatch = "all2all"\nep_size = 2\nredundant_experts = 4\n'
        spec += f'placement = "{placement.name}"\n'
        placed = parse_spec(spec, "<spec>", folder=tmp_path).spec.parallel.placement
        assert placed == json.loads(placement.read_text())["physical_to_logical"]
