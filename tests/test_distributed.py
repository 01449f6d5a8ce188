"""Tensor- and expert-parallel layers on 2 and 4 gloo ranks equal the single-rank layer.

Random weights are drawn per global expert and sliced per rank, so a multi-rank layer and the
1-rank layer built from the same seed are the same function. float32 throughout: the results
differ only by summation order (relative error <= 1e-5). The support-matrix tests run every
scheme and layout on 2 ranks in bfloat16; these cover 4 ranks, a rank that sends or receives
no tokens, and one expert taking every token.
"""

from __future__ import annotations

from pathlib import Path

import dist_worker
import pytest
import torch
import torch.multiprocessing as mp

SPEC = """
name = "parallel"
[model]
hidden_size = 256
moe_intermediate_size = 256
n_routed_experts = 8
num_experts_per_tok = 3
n_shared_experts = 1
[router]
scoring_func = "sigmoid"
topk_method = "noaux_tc"
n_group = 4
topk_group = 2
norm_topk_prob = true
routed_scaling_factor = 2.0
[experts]
gemm_backend = "torch"
[target]
device = "cpu"
dtype = "float32"
max_num_tokens = 64
"""
HIDDEN = 256
FP8 = ["quant.scheme=fp8_block", "quant.checkpoint=bf16"]


def _ep(ranks: int) -> list[str]:
    return ["parallel.dispatch=all2all", f"parallel.ep_size={ranks}"]


def _run(load_layer, tmp_path, world, cases, x, split, spec=SPEC):
    """Run every case [(overrides, replicated, bias)] of `spec` on `world` gloo ranks in one
    group; returns, per case, the outputs of each rank."""
    jobs = []
    for overrides, replicated, bias in cases:
        package = load_layer(spec, *overrides)
        jobs.append((str(Path(package.__file__).parent), package.__name__, replicated, bias))
    out_file = str(tmp_path / "out")
    mp.start_processes(
        dist_worker.run_layers,
        args=(world, str(tmp_path / "init"), jobs, x, split, out_file),
        nprocs=world,
        start_method="spawn",
    )
    per_rank = [torch.load(f"{out_file}.{rank}") for rank in range(world)]
    return list(zip(*per_rank, strict=True))


def _one_rank(load_layer, x, overrides, bias=None):
    layer = load_layer(SPEC, *overrides).MoELayer().random_(11)
    dist_worker.edit_bias(layer, bias or {})
    return layer(x)


def _error(out, expected) -> float:
    return ((out - expected).abs().max() / expected.abs().max()).item()


def test_two_ranks(load_layer, tmp_path):
    """EP=2 on uneven token counts (bf16 and fp8 exchanges); a rank with no tokens at all, a
    rank whose experts receive none, one expert taking every token; TP=2."""
    tokens = 20
    x = torch.randn(tokens, HIDDEN, generator=torch.Generator().manual_seed(12))
    starve_rank_1 = {e: -100.0 for e in range(4, 8)}  # rank 1's experts are never chosen
    everyone_to_5 = {5: 100.0}
    cases = [
        (_ep(2), False, {}),
        ([*_ep(2), *FP8], False, {}),
        ([*_ep(2), "experts.layout=masked"], False, starve_rank_1),
        (_ep(2), False, everyone_to_5),
        (["parallel.tp_size=2", *FP8], True, {}),
        # replicas on tensor-parallel ranks: the one placement row, of the one EP rank, on
        # each (rank 1 read a second row, which is not there)
        (["parallel.tp_size=2", "parallel.redundant_experts=2"], True, {}),
    ]
    split = [0, 13, tokens]
    results = _run(load_layer, tmp_path, 2, cases, x, split)
    for (overrides, replicated, bias), outputs in zip(cases, results, strict=True):
        one_rank = [o for o in overrides if not o.startswith("parallel.")]
        expected = _one_rank(load_layer, x, one_rank, bias)
        out = outputs[0] if replicated else torch.cat(outputs)
        if replicated:
            assert torch.equal(outputs[0], outputs[1])
        assert _error(out, expected) <= 1e-5, overrides


def test_rank_without_tokens(load_layer, tmp_path):
    x = torch.randn(9, HIDDEN, generator=torch.Generator().manual_seed(13))
    (outputs,) = _run(load_layer, tmp_path, 2, [(_ep(2), False, {})], x, [0, 0, 9])
    assert outputs[0].shape == (0, HIDDEN)
    assert _error(outputs[1], _one_rank(load_layer, x, [])) <= 1e-5


@pytest.mark.parametrize(
    "overrides",
    [
        ["experts.layout=contiguous"],
        ["experts.layout=masked", *FP8],
        ["experts.gemm_backend=triton", "experts.layout=contiguous", *FP8],
    ],
    ids=["torch-contiguous", "torch-masked-fp8", "triton-contiguous-fp8"],
)
def test_four_ranks(load_layer, tmp_path, overrides):
    tokens = 14
    x = torch.randn(tokens, HIDDEN, generator=torch.Generator().manual_seed(14))
    split = [0, 5, 5, 11, tokens]  # rank 1 has no tokens
    (outputs,) = _run(load_layer, tmp_path, 4, [([*_ep(4), *overrides], False, {})], x, split)
    expected = _one_rank(load_layer, x, overrides)
    assert _error(torch.cat(outputs), expected) <= 1e-5


def _sharded_checkpoint(folder: Path) -> None:
    """The layer of SPEC as an HF checkpoint in three shards (router and shared expert; experts
    0-3; experts 4-7) with model.safetensors.index.json."""
    import json

    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(21)

    def weight(*shape):
        return torch.randn(*shape, generator=gen) * 0.05

    shards = {
        "common.safetensors": {},
        "experts-0-3.safetensors": {},
        "experts-4-7.safetensors": {},
    }
    common = shards["common.safetensors"]
    common["gate.weight"] = weight(8, HIDDEN)
    common["gate.e_score_correction_bias"] = weight(8)
    for proj, shape in (("gate", (256, HIDDEN)), ("up", (256, HIDDEN)), ("down", (HIDDEN, 256))):
        common[f"shared_experts.{proj}_proj.weight"] = weight(*shape)
        for e in range(8):
            shard = shards["experts-0-3.safetensors" if e < 4 else "experts-4-7.safetensors"]
            shard[f"experts.{e}.{proj}_proj.weight"] = weight(*shape)
    weight_map = {}
    for name, tensors in shards.items():
        save_file(tensors, str(folder / name))
        weight_map.update(dict.fromkeys(tensors, name))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))


def test_expert_parallel_ranks_read_only_their_experts(load_layer, tmp_path):
    """load_weights on EP=2: each rank opens the shards of the router, the shared expert and its
    own experts, never the other rank's; together they are the one-rank layer of the same
    checkpoint."""
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    _sharded_checkpoint(checkpoint)
    x = torch.randn(10, HIDDEN, generator=torch.Generator().manual_seed(22))
    package = load_layer(SPEC, *_ep(2))
    mp.start_processes(
        dist_worker.run_loaded,
        args=(2, str(tmp_path / "init"), str(Path(package.__file__).parent), package.__name__,
              str(checkpoint), x),
        nprocs=2,
        start_method="spawn",
    )  # fmt: skip
    (out0, opened0), (out1, opened1) = (torch.load(f"{checkpoint}/out.{r}") for r in (0, 1))
    assert opened0 == ["common.safetensors", "experts-0-3.safetensors"]
    assert opened1 == ["common.safetensors", "experts-4-7.safetensors"]
    expected = load_layer(SPEC).MoELayer().load_weights(str(checkpoint))(x)
    assert _error(out0, expected) <= 1e-5 and _error(out1, expected) <= 1e-5


def test_packed_rows_round_trip():
    """A sent row packs its parts as bytes, each from a 16-byte boundary: unpacked, every part
    (bf16 values, e4m3 values, fp32 scales, int32 ids, fp32 weights; widths that are not
    multiples of 16 bytes) comes back bit for bit, for the rows asked for, in their order."""
    from moec.runtime.all2all import pack_rows, unpack_rows

    gen = torch.Generator().manual_seed(5)
    parts = [
        torch.randn(6, 7, generator=gen).bfloat16(),
        torch.randn(6, 9, generator=gen).to(torch.float8_e4m3fn),
        torch.rand(6, 3, generator=gen),
        torch.randint(0, 100, (6, 5), generator=gen, dtype=torch.int32),
        torch.rand(6, 5, generator=gen),
    ]
    index = torch.tensor([4, 0, 0, 5])
    packed = pack_rows(parts, index)
    assert packed.dtype == torch.uint8 and packed.shape[1] % 16 == 0
    for got, part in zip(unpack_rows(packed, parts), parts, strict=True):
        assert got.dtype == part.dtype
        assert torch.equal(got.view(torch.uint8), part[index].view(torch.uint8))
    assert [p.shape for p in unpack_rows(pack_rows(parts, index[:0]), parts)] == [
        (0, p.shape[1]) for p in parts
    ]


def test_packed_rows_of_a_rank_given_no_tokens():
    """A rank given no tokens packs empty parts, which torch calls contiguous whatever their
    strides (top-k = 1 leaves a [0, 1] weights part with last stride 2, say): they pack to no rows
    instead of failing the byte view."""
    from moec.runtime.all2all import pack_rows, unpack_rows

    parts = [
        torch.empty(8).as_strided((0, 1), (1, 2)),
        torch.empty(8, dtype=torch.int32).as_strided((0, 1), (1, 3)),
        torch.empty(8).bfloat16().as_strided((0, 4), (4, 1)),
    ]
    packed = pack_rows(parts, torch.zeros(0, dtype=torch.long))
    assert packed.shape[0] == 0
    assert [p.shape for p in unpack_rows(packed, parts)] == [(0, 1), (0, 1), (0, 4)]


def test_top_1_rank_without_tokens(load_layer, tmp_path):
    """Expert parallel with top-k = 1 and a rank given no tokens (normal at decode), for every
    backend that runs on the CPU: the empty rank returns no rows, the other its tokens' output."""
    top1 = ["model.num_experts_per_tok=1"]
    x = torch.randn(5, HIDDEN, generator=torch.Generator().manual_seed(17))
    cases = [
        [*top1, "experts.layout=contiguous"],
        [*top1, "experts.layout=masked", *FP8],
        [*top1, "experts.gemm_backend=triton", "experts.layout=contiguous", *FP8],
    ]
    results = _run(load_layer, tmp_path, 2, [(_ep(2) + c, False, {}) for c in cases], x, [0, 0, 5])
    for overrides, outputs in zip(cases, results, strict=True):
        assert outputs[0].shape == (0, HIDDEN), overrides
        assert _error(outputs[1], _one_rank(load_layer, x, overrides)) <= 1e-5, overrides
