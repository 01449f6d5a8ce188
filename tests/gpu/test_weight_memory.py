"""How much GPU memory setting a layer's weights takes beyond the layer itself: the experts are
written into their rows of the stacked parameters one by one, so no stacked copy of all of them
is made (a bf16 DeepSeek-V3 layer is 21 GB: with stacked copies, random_ held it three times
and a checkpoint load twice, and two such layers did not fit an 80 GB card).

The smaller layer of specs.py in bf16 (100 MB of experts); the bounds leave 8 MB for the router,
the shared expert and the allocator's rounding, far below the 100 MB of one stacked copy."""

from __future__ import annotations

import pytest
import torch

from .specs import SMALL

BF16 = ["name=gpu_small_bf16", "quant.scheme=bf16", "experts.gemm_backend=torch"]
SLACK = 8 << 20
EXPERTS, HIDDEN, INTER = 32, 1024, 512


@pytest.fixture
def empty_layer(load_layer):
    """(a layer of the smaller spec on the GPU with no weights set, its parameters' bytes)."""
    package = load_layer(SMALL, *BF16)
    torch.cuda.empty_cache()
    layer = package.MoELayer(device="cuda")
    size = sum(p.numel() * p.element_size() for p in layer.parameters())
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    return layer, size


def test_random_weights_hold_one_copy_beside_the_layer(empty_layer):
    layer, size = empty_layer
    start = torch.cuda.memory_allocated()
    layer.random_(0)
    torch.cuda.synchronize()
    assert torch.cuda.max_memory_allocated() - start <= size + SLACK
    assert layer.w13.float().abs().sum() > 0  # every expert's rows were written
    assert bool((layer.w13.flatten(1).abs().amax(dim=1) > 0).all())


def test_checkpoint_load_holds_one_expert_beside_the_layer(empty_layer):
    """A checkpoint in host memory (HF names): the GPU holds the layer and one expert at a
    time (the stacked copy moved whole doubled it)."""
    layer, _ = empty_layer
    generator = torch.Generator().manual_seed(3)

    def weight(rows, cols):
        return (torch.randn(rows, cols, generator=generator) / cols**0.5).bfloat16()

    checkpoint = {
        "gate.weight": weight(EXPERTS, HIDDEN),
        "gate.e_score_correction_bias": torch.zeros(EXPERTS),
    }
    for prefix in [f"experts.{e}" for e in range(EXPERTS)] + ["shared_experts"]:
        checkpoint[f"{prefix}.gate_proj.weight"] = weight(INTER, HIDDEN)
        checkpoint[f"{prefix}.up_proj.weight"] = weight(INTER, HIDDEN)
        checkpoint[f"{prefix}.down_proj.weight"] = weight(HIDDEN, INTER)
    start = torch.cuda.memory_allocated()
    layer.load_weights(checkpoint)
    torch.cuda.synchronize()
    assert torch.cuda.max_memory_allocated() - start <= SLACK
    expected = torch.cat(
        [checkpoint["experts.7.gate_proj.weight"], checkpoint["experts.7.up_proj.weight"]]
    )
    assert torch.equal(layer.w13[7].cpu(), expected)
    assert torch.equal(layer.w2[31].cpu(), checkpoint["experts.31.down_proj.weight"])
