"""What a hostile tester of the generated layer found, one test per bug (examples/tiny-cpu.toml
and its Triton twin under the interpreter).

Found wrong before this file:
- Under torch.autocast the torch backend's router ran in bf16: other experts chosen, the
  output off by 10% (relative norm). The forward now computes with autocast off: the stages'
  dtypes are the build's.
- The custom op behind torch.compile read the weights of the layer its op_id names, not the
  parameters the graph passes: a compiled torch.func.functional_call ran the layer's own
  weights, and a saved torch.export program loaded in another process ran whichever layer held
  that op_id there. The op now computes with the tensors it is given, beside the workspace of
  the layer of that op_id or, where it is gone, of another layer of the package (and refuses
  clearly where there is none).
- random_ under torch.set_default_dtype(torch.float64) drew its bias in float64 and refused it;
  .to("hpu") on a torch without it raised a raw ModuleNotFoundError.
- A compiled call with an x the checks refuse (a list) made Dynamo skip forward from then on: a
  later fullgraph compile failed inside the stages. The refusal now runs outside the graph.
- A parameter replaced by one of another shape or dtype (or None) failed inside a stage at the
  next forward; it is now refused when set.
- A layer that records its expert load declared its op free of mutation: under aot_eager a
  reset before a compiled forward wiped the forward's counts, and under inductor a read before
  the forward saw them. The counts are now an argument the op mutates.
- The op's fake kept x's strides where the forward's output is row-major: inductor failed on
  a column-major x.
- The Triton gate's counters were never zeroed again when weights were set: whatever an
  interrupted call left there made every later one-token forward wrong.
- A layer made under torch.inference_mode, loaded outside it, had its first parameters
  overwritten before torch refused the rest: now refused before anything is written.
- A layer made on the meta device and loaded with load_state_dict(assign=True) kept its
  buffers on meta: a one-token Triton forward, or a recording layer's forward, failed inside.
"""

from __future__ import annotations

import os

import pytest
import torch
from conftest import EXAMPLES
from torch.func import functional_call

TINY = EXAMPLES / "tiny-cpu.toml"
TRITON = EXAMPLES / "tiny-cpu-triton.toml"
HIDDEN = 256


def _x(tokens: int, seed: int = 5) -> torch.Tensor:
    return torch.randn(tokens, HIDDEN, generator=torch.Generator().manual_seed(seed)).bfloat16()


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture(scope="module")
def package(load_layer):
    return load_layer(TINY)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_changes_nothing(package, dtype):
    layer, x = package.MoELayer().random_(1), _x(6)
    expected = layer(x)
    with torch.autocast("cpu", dtype=dtype):
        assert torch.equal(layer(x), expected)


def test_a_compiled_functional_call_runs_the_parameters_given(package):
    layer, other, x = package.MoELayer().random_(1), package.MoELayer().random_(2), _x(6)
    theirs = dict(other.named_parameters())
    expected = other(x)
    assert not torch.equal(expected, layer(x))
    for backend in ("eager", "aot_eager"):
        torch._dynamo.reset()
        compiled = torch.compile(lambda v: functional_call(layer, theirs, (v,)), backend=backend)
        assert torch.equal(compiled(x), expected), backend
    assert torch.equal(layer(x), package.MoELayer().random_(1)(x))  # its own weights kept


def test_an_exported_program_runs_its_own_weights(package, tmp_path):
    layer, x = package.MoELayer().random_(1), _x(6)
    path = tmp_path / "layer.pt2"
    torch.export.save(torch.export.export(layer, (x,)), path)
    expected = layer(x)
    del layer
    unrelated = package.MoELayer().random_(3)  # lives beside the loaded program
    out = torch.export.load(path).module()(x)
    assert torch.equal(out, expected) and not torch.equal(out, unrelated(x))


def test_without_any_layer_the_op_is_refused_by_name(load_layer):
    package = load_layer(TINY, "name=tiny_alone")  # a package of its own: no other layer
    layer, x = package.MoELayer().random_(1), _x(4)
    params, op_id = list(layer.parameters()), layer.op_id
    del layer
    with pytest.raises(RuntimeError, match="this process has none: make one"):
        package.layer.moe_forward(x, params, op_id)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_recorded_load_under_compile(load_layer, backend):
    package = load_layer(TINY, "parallel.record_load=true")
    layer, x = package.MoELayer().random_(2), _x(5)

    def forward(v):
        layer.reset_expert_load()
        before = layer.expert_load()
        out = layer(v)
        return out, before, layer.expert_load()

    out, before, after = torch.compile(forward, backend=backend, fullgraph=True)(x)
    routed = 5 * package.SPEC["model"]["num_experts_per_tok"]
    assert int(before.sum()) == 0 and int(after.sum()) == routed
    assert int(layer.expert_load().sum()) == routed
    assert torch.equal(out, layer(x))


def test_inductor_takes_a_column_major_x(package):
    layer, x = package.MoELayer().random_(1), _x(8)
    column_major = x.t().contiguous().t()
    compiled = torch.compile(lambda v: layer(v) * 2.0, fullgraph=True)
    assert torch.equal(compiled(column_major), layer(x) * 2.0)


def test_a_layer_made_under_inference_mode_is_unchanged_by_a_refused_load(package):
    with torch.inference_mode():
        layer = package.MoELayer().random_(4)
    x = _x(6)
    with torch.inference_mode():
        expected = layer(x)
    source = package.MoELayer().random_(3)
    for load in (
        lambda: layer.random_(3),
        lambda: layer.load_state_dict(source.state_dict()),
    ):
        with pytest.raises(ValueError, match="made under torch.inference_mode"):
            load()
        with torch.inference_mode():
            assert torch.equal(layer(x), expected)
    with torch.inference_mode():  # there, it loads
        layer.random_(3)
        assert torch.equal(layer(x), source(x))


@pytest.fixture
def interpreted(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert os.environ["TRITON_INTERPRET"] == "1"


def test_gate_counters_are_zero_again_when_weights_are_set(load_layer, interpreted):
    package = load_layer(TRITON)
    x = _x(1, seed=3)
    expected = package.MoELayer().random_(1)(x)
    layer = package.MoELayer().random_(1)
    layer.gate_counters.fill_(7)  # what an interrupted call may leave
    layer.random_(1)
    assert int(layer.gate_counters.abs().sum()) == 0 and torch.equal(layer(x), expected)
    layer.gate_counters.fill_(7)
    layer.load_state_dict(package.MoELayer().random_(1).state_dict())
    assert torch.equal(layer(x), expected)


def test_a_meta_layer_loaded_by_assign_gets_its_buffers(load_layer, interpreted):
    package = load_layer(TRITON)
    source, x = package.MoELayer().random_(1), _x(1, seed=3)
    layer = package.MoELayer(device="meta")
    layer.load_state_dict({k: v.clone() for k, v in source.state_dict().items()}, assign=True)
    assert {buffer.device.type for buffer in layer.buffers()} == {"cpu"}
    assert torch.equal(layer(x), source(x))


def test_a_meta_recording_layer_loaded_by_assign_counts(load_layer, tmp_path):
    package = load_layer(TINY, "parallel.record_load=true")
    source, x = package.MoELayer().random_(1), _x(4)
    layer = package.MoELayer(device="meta")
    layer.load_state_dict({k: v.clone() for k, v in source.state_dict().items()}, assign=True)
    assert torch.equal(layer(x), source(x))
    assert torch.equal(layer.expert_load(), source.expert_load())


def test_a_layer_with_buffers_on_meta_is_refused_by_name(load_layer, interpreted):
    package = load_layer(TRITON)
    layer = package.MoELayer().random_(1)
    layer._buffers["gate_counters"] = torch.empty_like(layer.gate_counters, device="meta")
    with pytest.raises(ValueError, match="meta"):
        layer(_x(1))


def test_random_weights_whatever_the_default_dtype(package):
    """random_ drew in torch's default dtype: under float64 its bias was refused as built."""
    x = _x(4)
    expected = package.MoELayer().random_(1)(x)
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        layer = package.MoELayer().random_(1)
    finally:
        torch.set_default_dtype(before)
    assert torch.equal(layer(x), expected)


def test_a_move_to_a_device_torch_lacks_is_refused_by_name(package):
    layer, x = package.MoELayer().random_(1), _x(4)
    expected = layer(x)
    with pytest.raises(ValueError, match="cannot move the layer: .*; it is unchanged"):
        layer.to("hpu")
    assert torch.equal(layer(x), expected)


@pytest.mark.parametrize("first", [[1.0], "x", None])
def test_a_refused_compiled_call_leaves_later_fullgraph_compiles_whole(package, first):
    """An x the checks refuse raised while Dynamo traced forward, which then skipped forward
    (for every layer of the package): a later fullgraph compile traced the stages and failed."""
    layer, x = package.MoELayer().random_(1), _x(4)
    expected = layer(x)
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        torch.compile(layer, backend="aot_eager")(first)
    assert torch.equal(torch.compile(layer, backend="aot_eager", fullgraph=True)(x), expected)


@pytest.mark.parametrize(
    ("name", "make", "error", "match"),
    [
        (
            "gate_weight",
            lambda t: t[:8].clone(),
            ValueError,
            r"gate_weight must be .* got .* \[8, ",
        ),
        ("w13", lambda t: t.to(torch.bfloat16), ValueError, "w13 must be torch.float8_e4m3fn"),
        ("w2", lambda t: t.transpose(1, 2).contiguous().transpose(1, 2), ValueError, "contiguous"),
        ("w2", None, TypeError, "w2 must be a parameter"),
    ],
)
def test_a_replaced_parameter_is_checked_when_set(package, name, make, error, match):
    """`layer.w13 = nn.Parameter(...)` of another shape or dtype, or None, failed inside a
    stage at the next forward (torch's own error): refused when set, the layer unchanged."""
    layer, x = package.MoELayer().random_(1), _x(4)
    expected, own = layer(x), getattr(layer, name)
    value = None if make is None else torch.nn.Parameter(make(own.detach()), requires_grad=False)
    with pytest.raises(error, match=match):
        setattr(layer, name, value)
    assert getattr(layer, name) is own and torch.equal(layer(x), expected)
    setattr(layer, name, torch.nn.Parameter(own.detach().clone(), requires_grad=False))
    assert torch.equal(layer(x), expected)  # one of its shape and dtype is taken
