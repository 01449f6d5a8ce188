"""A fourth hostile corpus, the generated package (examples/tiny-cpu.toml and its schemes):
pickle.dumps of a layer (torch's legacy storages, which pickle writes, could not rebuild float8,
and a CUDA stream cannot be pickled at all)."""

from __future__ import annotations

import copy
import pickle
import threading

import pytest
import torch
from conftest import EXAMPLES
from torch import nn

TINY = EXAMPLES / "tiny-cpu.toml"  # 16 experts, fp8 block weights from a bf16 checkpoint
HIDDEN = 256
SCHEMES = {  # the overrides of tiny-cpu.toml that give each scheme
    "fp8_block": [],
    "fp8_per_tensor": ["quant.scheme=fp8_per_tensor"],
    "mxfp8": ["quant.scheme=mxfp8"],
    "mxfp4": ["quant.scheme=mxfp4", "quant.checkpoint=quantized", "quant.shared_scheme=mxfp8"],
    "bf16": ["quant.scheme=bf16"],
}


@pytest.fixture(scope="module")
def package(load_layer):
    return load_layer(TINY)


@pytest.fixture(scope="module")
def layer(package):
    return package.MoELayer().random_(1)


@pytest.fixture(scope="module")
def x() -> torch.Tensor:
    return torch.randn(6, HIDDEN, generator=torch.Generator().manual_seed(5)).bfloat16()


def _bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().reshape(-1).view(torch.uint8)


def _same_parameters(layer, twin) -> bool:
    """Same names, classes, dtypes, devices, requires_grad and bytes."""
    ours, theirs = dict(layer.named_parameters()), dict(twin.named_parameters())
    return ours.keys() == theirs.keys() and all(
        type(ours[name]) is type(theirs[name])
        and (ours[name].dtype, ours[name].device, ours[name].requires_grad)
        == (theirs[name].dtype, theirs[name].device, theirs[name].requires_grad)
        and torch.equal(_bytes(ours[name]), _bytes(theirs[name]))
        for name in ours
    )


# --- pickle -------------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_a_pickled_layer_is_the_layer(load_layer, x, scheme):
    """pickle.loads(pickle.dumps(layer)) raised AttributeError ('UntypedStorage' has no
    attribute 'dtype') for a layer of float8 weights; now every scheme round-trips exactly,
    as a layer of its own (its own op_id and storage)."""
    package = load_layer(TINY, *SCHEMES[scheme])
    layer = package.MoELayer().random_(1)
    twin = pickle.loads(pickle.dumps(layer))
    assert _same_parameters(layer, twin) and twin.weights_set
    assert torch.equal(twin(x), layer(x))
    assert twin.op_id != layer.op_id and package.layer._LAYERS[twin.op_id] is twin
    before = layer(x)
    twin.random_(2)
    assert torch.equal(layer(x), before) and not torch.equal(twin(x), before)


def test_pickling_leaves_the_layer_as_it_was(layer, x):
    """The copy carries float8 tensors as uint8 views; the layer's own stay its own."""
    parameters = dict(layer.named_parameters())
    before = layer(x)
    pickle.dumps(layer)
    copy.deepcopy(layer)
    assert all(parameters[name] is p for name, p in layer.named_parameters())
    assert layer.w13.dtype == torch.float8_e4m3fn and isinstance(layer.w13, nn.Parameter)
    assert torch.equal(layer(x), before)


def test_a_layer_saved_before_its_state_carried_bytes_still_loads(package, layer, x):
    """A torch.save of an earlier build holds nn.Module's state, float8 tensors as they are."""
    old_state = nn.Module.__getstate__(layer)
    twin = package.MoELayer.__new__(package.MoELayer)
    twin.__setstate__(dict(old_state))
    assert _same_parameters(layer, twin) and torch.equal(twin(x), layer(x))


def test_a_pickled_copy_runs_its_own_weights_when_compiled(layer, x):
    torch._dynamo.reset()
    twin = pickle.loads(pickle.dumps(layer)).random_(2)
    out = torch.compile(twin, backend="eager", fullgraph=True)(x)
    assert torch.equal(out, twin(x)) and not torch.equal(out, layer(x))


@pytest.mark.parametrize(
    "make_copy",
    [copy.deepcopy, lambda m: pickle.loads(pickle.dumps(m))],
    ids=["deepcopy", "pickle"],
)
def test_a_layer_that_ran_its_side_stream_copies(load_layer, x, make_copy):
    """After a forward on a GPU, the side stream of overlapped shared experts holds a
    torch.cuda.Stream, which pickle refuses (TypeError: cannot pickle 'Stream' object, seen on
    an H200): deepcopy, torch.save and pickle of the layer all failed. A lock stands in for the
    stream here: it cannot be pickled either. The copy makes its own stream on first use."""
    package = load_layer(TINY, "experts.shared_experts=overlapped")
    layer = package.MoELayer().random_(1)
    lock = threading.Lock()
    layer.side_stream.stream = lock
    twin = make_copy(layer)
    assert twin.side_stream.stream is None and layer.side_stream.stream is lock
    assert torch.equal(twin(x), layer(x))
