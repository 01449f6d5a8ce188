"""Tensor- and expert-parallel layers on a 2-rank gloo group equal the single-rank layer.

Random weights are drawn per global expert and sliced per rank, so a 2-rank layer and the
1-rank layer built from the same seed are the same function. float32 throughout: the results
differ only by summation order (relative error <= 1e-5).
"""

from __future__ import annotations

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


def _run(load_layer, tmp_path, overrides, split):
    package = load_layer(SPEC, *overrides)
    folder = str(__import__("pathlib").Path(package.__file__).parent)
    x = torch.randn(split[-1], 256, generator=torch.Generator().manual_seed(12))
    out_file = str(tmp_path / "out")
    mp.start_processes(
        dist_worker.run_rank,
        args=(2, str(tmp_path / "init"), folder, package.__name__ + "_rank", x, split, out_file),
        nprocs=2,
        start_method="spawn",
    )
    outputs = [torch.load(f"{out_file}.{rank}") for rank in range(2)]
    return x, outputs


@pytest.mark.parametrize(
    "scheme", [["quant.scheme=bf16"], ["quant.scheme=fp8_block", "quant.checkpoint=bf16"]]
)
def test_expert_parallel_all2all_equals_one_rank(load_layer, tmp_path, scheme):
    ep = ["parallel.dispatch=all2all", "parallel.ep_size=2", *scheme]
    split = [0, 13, 13 + 7]  # uneven token counts per rank
    x, (first, second) = _run(load_layer, tmp_path, ep, split)
    single = load_layer(SPEC, *scheme).MoELayer().random_(11)
    expected = single(x)
    out = torch.cat([first, second])
    assert ((out - expected).abs().max() / expected.abs().max()).item() <= 1e-5


def test_expert_parallel_rank_without_tokens(load_layer, tmp_path):
    ep = ["parallel.dispatch=all2all", "parallel.ep_size=2"]
    x, (first, second) = _run(load_layer, tmp_path, ep, [0, 0, 9])
    expected = load_layer(SPEC).MoELayer().random_(11)(x)
    assert first.shape == (0, 256)
    assert ((second - expected).abs().max() / expected.abs().max()).item() <= 1e-5


def test_tensor_parallel_equals_one_rank(load_layer, tmp_path):
    tp = ["parallel.tp_size=2", "quant.scheme=fp8_block", "quant.checkpoint=bf16"]
    split = [0, 11, 22]
    package = load_layer(SPEC, *tp)
    folder = str(__import__("pathlib").Path(package.__file__).parent)
    x = torch.randn(11, 256, generator=torch.Generator().manual_seed(13))
    both = torch.cat([x, x])  # every TP rank sees the same tokens
    out_file = str(tmp_path / "out")
    mp.start_processes(
        dist_worker.run_rank,
        args=(2, str(tmp_path / "init"), folder, package.__name__ + "_rank", both, split, out_file),
        nprocs=2,
        start_method="spawn",
    )
    first, second = (torch.load(f"{out_file}.{rank}") for rank in range(2))
    expected = (
        load_layer(SPEC, "quant.scheme=fp8_block", "quant.checkpoint=bf16")
        .MoELayer()
        .random_(11)(x)
    )
    assert torch.equal(first, second)
    # TP ranks quantize their own halves of the intermediate: 1x128 groups that do not cross
    # the split, so the same values are quantized the same way; only summation order differs.
    assert ((first - expected).abs().max() / expected.abs().max()).item() <= 1e-5
