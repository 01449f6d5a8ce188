"""The Triton router reads only the parts of the router weight that are not all zero
(`MoELayer.router_parts`): one for a weight the checkpoint stores in bf16 (as DeepSeek's
do), three for an fp32 one. Counted whenever the weights are set (load_weights, random_,
load_state_dict), and the layer's output is the three parts' output bit for bit."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "tiny-cpu-triton.toml"
HIDDEN, INTER, EXPERTS = 256, 128, 8


def _checkpoint(gate_dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """tiny-cpu-triton's tensors by their HF names, the router weight in `gate_dtype`."""
    gen = torch.Generator().manual_seed(3)

    def normal(*shape):
        return torch.randn(*shape, generator=gen) / shape[-1] ** 0.5

    tensors = {
        "gate.weight": normal(EXPERTS, HIDDEN).to(gate_dtype),
        "gate.e_score_correction_bias": 0.02 * torch.randn(EXPERTS, generator=gen),
    }
    for name in [f"experts.{e}" for e in range(EXPERTS)] + ["shared_experts"]:
        tensors[f"{name}.gate_proj.weight"] = normal(INTER, HIDDEN).bfloat16()
        tensors[f"{name}.up_proj.weight"] = normal(INTER, HIDDEN).bfloat16()
        tensors[f"{name}.down_proj.weight"] = normal(HIDDEN, INTER).bfloat16()
    return tensors


@pytest.fixture(scope="module")
def package(cache_dir):
    import moec

    return moec.load(str(EXAMPLE), cache_dir=cache_dir)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("router_parts")


def test_the_parts_in_use_follow_the_weights(package):
    layer = package.MoELayer()
    assert layer.router_parts == 3  # before any weights: all of them
    layer.load_weights(_checkpoint(torch.bfloat16))
    assert layer.router_parts == 1
    layer.load_weights(_checkpoint(torch.float32))
    assert layer.router_parts == 3
    assert layer.random_(0).router_parts == 1  # random_ rounds the router weight to bf16
    fp32 = package.MoELayer().load_weights(_checkpoint(torch.float32))
    layer.load_state_dict(fp32.state_dict())  # counted again after a state dict too
    assert layer.router_parts == 3


def test_a_bf16_router_weight_gives_the_three_parts_output(package):
    layer = package.MoELayer().load_weights(_checkpoint(torch.bfloat16))
    x = torch.randn(5, HIDDEN, generator=torch.Generator().manual_seed(1)).bfloat16()
    one = layer(x)
    layer.router_parts = 3  # the second and third parts are zero: the same logits
    assert torch.equal(layer(x), one)


def test_a_failed_load_keeps_the_count(package):
    layer = package.MoELayer().load_weights(_checkpoint(torch.bfloat16))
    bad = _checkpoint(torch.float32)
    del bad["experts.3.up_proj.weight"]
    with pytest.raises(ValueError, match="experts.3.up_proj.weight"):  # the package's WeightError
        layer.load_weights(bad)
    assert layer.router_parts == 1 and not layer.gate_parts[1:].any()
