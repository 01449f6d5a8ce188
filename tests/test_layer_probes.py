"""The generated layer under hostile use of nn.Module's API: load_state_dict into a layer on
the meta device (refused unless assign=True, which fills it), assign=True of tensors the
layer could not keep as its parameters (expanded, strided, overlapping: refused before any is
taken), and torch.compile after a compiled call raised the layer's own error (the checks run
inside the custom op, so Dynamo never skips forward). Each on the torch package (tiny-cpu) and,
where its router differs, the Triton one (tiny-cpu-triton: its post-load hook counts parts)."""

from __future__ import annotations

import pytest
import torch
from conftest import EXAMPLES
from torch import nn

import moec

HIDDEN = 256
SPECS = {"torch": EXAMPLES / "tiny-cpu.toml", "triton": EXAMPLES / "tiny-cpu-triton.toml"}


@pytest.fixture(scope="module", params=sorted(SPECS))
def package(request, cache_dir):
    return moec.load(SPECS[request.param], cache_dir=cache_dir)


@pytest.fixture(scope="module")
def x() -> torch.Tensor:
    return torch.randn(5, HIDDEN, generator=torch.Generator().manual_seed(3)).bfloat16()


@pytest.fixture(scope="module")
def state(package) -> dict[str, torch.Tensor]:
    return package.MoELayer().random_(4).state_dict()


def _parameters(layer) -> dict[str, torch.Tensor]:
    return {name: tensor for name, tensor in layer.named_parameters()}


# --- a layer on the meta device ----------------------------------------------------------


def test_a_copy_into_a_meta_layer_is_refused(package, state):
    layer = package.MoELayer(device="meta")
    with pytest.raises(ValueError, match="on the meta device, which holds no values to copy"):
        layer.load_state_dict(state)
    assert not layer.weights_set
    assert all(tensor.is_meta for tensor in layer.parameters())


def test_a_parents_copy_into_a_meta_layer_is_one_error(package, state):
    """Through a parent module: torch's RuntimeError carrying the layer's message (not an
    error of the post-load hook reading meta values), nothing set."""
    parent = nn.ModuleDict({"mlp": package.MoELayer(device="meta")})
    with pytest.raises(RuntimeError, match="on the meta device, which holds no values to copy"):
        parent.load_state_dict({f"mlp.{name}": tensor for name, tensor in state.items()})
    assert not parent["mlp"].weights_set


def test_assign_fills_a_meta_layer(package, state, x):
    expected = package.MoELayer().random_(4)(x)
    layer = package.MoELayer(device="meta")
    layer.load_state_dict({name: tensor.clone() for name, tensor in state.items()}, assign=True)
    assert layer.weights_set
    assert torch.equal(layer(x), expected)


def test_a_partial_assign_leaves_a_meta_layer_without_weights(package, state, x):
    layer = package.MoELayer(device="meta")
    some = dict(list(state.items())[:1])
    layer.load_state_dict({name: tensor.clone() for name, tensor in some.items()}, False, True)
    assert not layer.weights_set
    with pytest.raises(ValueError, match="has no weights yet"):
        layer(x)


# --- assign=True of tensors the layer cannot keep ----------------------------------------


def _expanded(state: dict) -> dict:
    name = next(n for n, t in state.items() if t.dim() >= 2 and t.shape[0] > 1)
    tensor = state[name]
    return {**state, name: tensor[:1].expand_as(tensor)}, name


def _strided(state: dict) -> dict:
    name = next(n for n, t in state.items() if t.dim() >= 2 and t.shape[-1] > 1)
    tensor = state[name]
    wide = torch.cat([tensor, tensor], dim=-1)
    return {**state, name: wide[..., : tensor.shape[-1]]}, name


def _overlapping(state: dict) -> dict:
    """Every tensor a view of one buffer, the second starting inside the first."""
    sizes = [t.numel() * t.element_size() for t in state.values()]
    buffer = torch.zeros(sum(sizes), dtype=torch.uint8)
    offset, views = 0, {}
    for index, ((name, tensor), size) in enumerate(zip(state.items(), sizes, strict=True)):
        start = offset - sizes[0] // 2 if index == 1 else offset
        start -= start % tensor.element_size()
        view = buffer[start : start + size].view(tensor.dtype).view(tensor.shape)
        views[name] = view.copy_(tensor) if index != 1 else view
        offset = start + size
    return views, next(iter(state))


@pytest.mark.parametrize(
    ("make", "fragment"),
    [
        (_expanded, "is an expanded tensor"),
        (_strided, "is not contiguous"),
        (_overlapping, "share memory"),
    ],
)
def test_assign_of_tensors_the_layer_cannot_keep_is_refused(package, state, x, make, fragment):
    layer = package.MoELayer().random_(4)
    before = _parameters(layer)
    expected = layer(x)
    given, name = make(state)
    with pytest.raises(ValueError, match=fragment) as raised:
        layer.load_state_dict(given, assign=True)
    assert name in str(raised.value) and "the layer is unchanged" in str(raised.value)
    assert all(layer_t is before[n] for n, layer_t in _parameters(layer).items())
    assert torch.equal(layer(x), expected)
    # and the weights can still be made in place
    assert torch.equal(layer.random_(4)(x), expected)


def test_a_parents_assign_of_an_expanded_tensor_is_one_error(package, state):
    given, name = _expanded(state)
    parent = nn.ModuleDict({"mlp": package.MoELayer()})
    with pytest.raises(RuntimeError, match=f"mlp.{name} is an expanded tensor"):
        parent.load_state_dict({f"mlp.{n}": t for n, t in given.items()}, assign=True)
    assert not parent["mlp"].weights_set


def test_assign_of_copies_is_taken(package, state, x):
    """The check refuses only what it must: contiguous tensors of their own are assigned
    (the parameters are then those tensors), also the layer's own."""
    layer = package.MoELayer()
    copies = {name: tensor.clone() for name, tensor in state.items()}
    layer.load_state_dict(copies, assign=True)
    name = next(iter(_parameters(layer)))
    assert layer.get_parameter(name).data_ptr() == copies[name].data_ptr()
    layer.load_state_dict(layer.state_dict(), assign=True)
    assert torch.equal(layer(x), package.MoELayer().random_(4)(x))


# --- torch.compile after the layer's own error -------------------------------------------


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_a_compiled_error_does_not_stop_a_later_fullgraph(package, x, fresh_dynamo):
    layer = package.MoELayer()
    compiled = torch.compile(layer, backend="aot_eager")
    with pytest.raises(ValueError, match="has no weights yet"):
        compiled(x)
    layer.random_(4)
    with pytest.raises(ValueError, match="x must be torch.bfloat16, got torch.float32"):
        compiled(x.float())
    expected = layer(x)
    assert torch.equal(compiled(x), expected)
    assert torch.equal(torch.compile(layer, fullgraph=True, backend="aot_eager")(x), expected)
