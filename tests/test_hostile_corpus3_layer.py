"""A third hostile corpus, the generated package (examples/tiny-cpu.toml): copies of a layer
(copy.deepcopy, torch.save / torch.load) under torch.compile run their own weights; a
checkpoint path that is a loop of links is named as one."""

from __future__ import annotations

import copy
import io

import pytest
import torch
from conftest import EXAMPLES

TINY = EXAMPLES / "tiny-cpu.toml"  # 16 experts, fp8 block weights from a bf16 checkpoint
HIDDEN = 256


@pytest.fixture(scope="module")
def package(load_layer):
    return load_layer(TINY)


@pytest.fixture(scope="module")
def layer(package):
    return package.MoELayer().random_(1)


@pytest.fixture(scope="module")
def x() -> torch.Tensor:
    return torch.randn(6, HIDDEN, generator=torch.Generator().manual_seed(5)).bfloat16()


def _saved_and_loaded(layer):
    buffer = io.BytesIO()
    torch.save(layer, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


@pytest.mark.parametrize(
    "make_copy", [copy.deepcopy, _saved_and_loaded], ids=["deepcopy", "torch.load"]
)
def test_a_compiled_copy_runs_its_own_weights(layer, x, make_copy):
    """The custom op finds its layer by op_id: a copy that kept the original's ran the
    original's weights when compiled."""
    torch._dynamo.reset()
    twin = make_copy(layer).random_(2)
    compiled = torch.compile(twin, backend="eager", fullgraph=True)
    out = compiled(x)
    assert torch.equal(out, twin(x)) and not torch.equal(out, layer(x))


def test_a_loop_of_links_is_named_as_one(layer, tmp_path):
    first, second = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    first.symlink_to(second)
    second.symlink_to(first)
    with pytest.raises(ValueError, match="a link to nothing") as raised:
        layer.load_weights(first)
    assert "the layer is unchanged" in str(raised.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without CUDA")
@pytest.mark.parametrize(
    "move", [lambda m: m.cuda(), lambda m: m.to("cuda")], ids=[".cuda()", ".to('cuda')"]
)
def test_a_move_to_cuda_without_cuda_is_one_clear_error(layer, x, move):
    """torch raised its AssertionError 'Torch not compiled with CUDA enabled'."""
    before = layer(x)
    with pytest.raises(ValueError, match="tiny_cpu: cannot move the layer: .*it is unchanged"):
        move(layer)
    assert next(layer.parameters()).device.type == "cpu" and torch.equal(layer(x), before)
