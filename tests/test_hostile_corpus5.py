"""A fifth hostile corpus: `moec build -o -` is refused as eplb's and tune's are (not a folder
named "-"); ... Each is exit 2, one line, nothing written."""

from __future__ import annotations

import math
import os

import pytest
import torch
from clihelp import cli, refused, snapshot
from conftest import EXAMPLES
from torch import nn

TINY = EXAMPLES / "tiny-cpu.toml"


# --- -o - ------------------------------------------------------------------------------------


def test_build_refuses_standard_output_as_its_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    err = refused(capsys, "build", TINY, "-o", "-")
    assert err == (
        'moec build: -o = "-": is standard output, and moec build writes its package to a '
        "folder (a folder's path, or leave -o out for out/)\n"
    )
    assert snapshot(tmp_path) == {}
    assert not os.path.exists("-")


# --- floats that underflow in the kernels' float32 -------------------------------------------

TINY_FLOAT = "is below 1e-06, the smallest a float key takes"
FLOAT_KEYS = {  # the --set that makes the key count, the key
    "router.routed_scaling_factor": (),
    "activation.swiglu_limit": ("activation.kind=silu_clamped",),
    "activation.alpha": ("activation.kind=oai_swiglu",),
    "activation.limit": ("activation.kind=oai_swiglu",),
    "activation.beta": ("activation.kind=situ", "activation.linear_beta=1.0"),
    "activation.linear_beta": ("activation.kind=situ", "activation.beta=1.0"),
    "experts.masked_memory_budget_gib": (),
}


@pytest.mark.parametrize("value", ["1e-300", "5e-324", "1e-7"])
@pytest.mark.parametrize("key", FLOAT_KEYS)
def test_a_positive_float_that_underflows_float32_is_refused_by_key(key, value, capsys):
    """A SiTU beta of 1e-300 is 0 in float32: the layer divided by it, every output nan; a
    scaling factor or clamp of 1e-300 silently zeroed the experts. Each float key takes 1e-6
    (MAX_FLOAT's reciprocal) or more."""
    sets = [arg for item in FLOAT_KEYS[key] for arg in ("--set", item)]
    err = refused(capsys, "validate", TINY, *sets, "--set", f"{key}={value}")
    assert f"{key} = {float(value)!r}: {TINY_FLOAT}" in err
    assert err.rstrip().endswith("(1e-06 or more)")


def test_the_smallest_float_is_taken(capsys):
    code, out, err = cli(capsys, "validate", TINY, "--set", "router.routed_scaling_factor=1e-6")
    assert (code, out, err) == (0, "ok\n", "")


# --- rules that follow from another rule ------------------------------------------------------


def test_fused_shared_experts_without_shared_experts_is_one_problem(capsys):
    """With no shared experts, quant.shared_scheme is None: the fused rule also said
    'quant.shared_scheme = None: fused shared experts need the routed experts' scheme'."""
    err = refused(
        capsys, "validate", TINY, "--set", "model.n_shared_experts=0",
        "--set", "experts.shared_experts=fused",
    )  # fmt: skip
    assert "there are no shared experts to fuse (n_shared_experts = 0)" in err
    assert "None" not in err


# --- load_state_dict of values no layer runs on -----------------------------------------------

HASH = [
    "router.topk_method=hash", "model.vocab_size=64", "router.n_group=1", "router.topk_group=1",
    "router.scoring_func=sqrtsoftplus",
]  # fmt: skip
"""tiny-cpu.toml hash-routed: a tid2eid table [64, 4] in its state dict."""


def _nan_byte(tensor: torch.Tensor) -> None:
    tensor.view(torch.uint8).view(-1)[0] = 0x7F  # float8_e4m3fn's nan


def _set(name: str, value: float):
    def change(values: dict) -> None:
        values[name].view(-1)[0] = value

    return change


def _byte(name: str):
    return lambda values: _nan_byte(values[name])


STATE_VALUES = {  # (overrides, change of a state dict, the problem it is)
    "an fp8 nan in w13": ([], _byte("w13"), "w13: 1 of its 1048576 values are not finite"),
    "a nan router weight": (
        [],
        _set("gate_weight", math.nan),
        "gate_weight: 1 of its 4096 values are not finite (nan or inf)",
    ),
    "an inf bias": ([], _set("gate_bias", math.inf), "gate_bias: 1 of its 16 values are not"),
    "an inf scale": ([], _set("w2_scale", math.inf), "w2_scale: 1 of its 32 values are not"),
    "a zero scale": (
        [],
        _set("shared_w13_scale", 0.0),
        "shared_w13_scale: 1 of its 4 scales are zero or negative (a scale is > 0)",
    ),
    "a negative scale": ([], _set("w13_scale", -1.0), "w13_scale: 1 of its 64 scales are zero"),
    "a scale taking a weight past bf16": (
        [],
        _set("w2_scale", 1e38),
        "w2_scale: expert 0, block (0, 0): its largest weight times its scale exceeds what bf16 "
        "holds (3.39e+38): not a scale of w2",
    ),
    "an mxfp4 scale taking a weight past bf16": (
        ["quant.scheme=mxfp4", "quant.checkpoint=quantized"],
        _set("w13_scale", 2.0**127),
        "w13_scale: expert 0, block (0, 0): its largest weight times its scale exceeds",
    ),
    "an mxfp8 scale of no power of two": (
        ["quant.scheme=mxfp8"],
        _set("w13_scale", 3.0),
        "w13_scale: 1 of its 32768 scales are no power of two (the layer's scales are UE8M0)",
    ),
    "a hash table id past the experts": (
        HASH,
        _set("tid2eid", 16),
        "tid2eid: 1 ids outside the experts 0..15",
    ),
    "a negative hash table id": (HASH, _set("tid2eid", -1), "tid2eid: 1 ids outside the experts"),
}


@pytest.mark.parametrize("case", STATE_VALUES)
def test_a_state_dict_of_values_no_layer_runs_on_is_refused(load_layer, case):
    """load_weights refuses nan, scales <= 0 and hash ids outside the experts; load_state_dict
    copied them: nan outputs, a torch IndexError in the forward (-1 silently the last expert;
    an out-of-bounds read in a Triton kernel). Now it is one ValueError naming the tensor, and
    the layer keeps its weights; a parent module's load_state_dict is refused as well."""
    overrides, change, fragment = STATE_VALUES[case]
    package = load_layer(TINY, *overrides)
    layer = package.MoELayer().random_(0)
    before = {name: tensor.clone() for name, tensor in layer.state_dict().items()}
    values = {name: tensor.clone() for name, tensor in before.items()}
    change(values)
    with pytest.raises(ValueError, match="load_state_dict") as refused:
        layer.load_state_dict(values)
    assert fragment in str(refused.value)
    assert str(refused.value).endswith("; the layer is unchanged")
    parent = nn.Sequential(layer)
    with pytest.raises(RuntimeError) as refused:
        parent.load_state_dict({f"0.{name}": tensor for name, tensor in values.items()})
    assert fragment in str(refused.value) and "nothing of the layer was copied" in str(
        refused.value
    )
    after = layer.state_dict()
    assert all(torch.equal(after[n].view(torch.uint8), before[n].view(torch.uint8)) for n in before)
    assert layer.load_state_dict(before) is not None  # its own values load again


def test_a_large_scale_of_small_values_is_loaded(load_layer):
    """The bound is the product, as load_weights': a scale of 1e36 over e4m3 values of at most
    2**-4 is a weight of at most 6.25e34, within bf16. A state dict changing only the scale is
    checked against the layer's own values."""
    layer = load_layer(TINY).MoELayer().random_(0)
    values = {name: tensor.clone() for name, tensor in layer.state_dict().items()}
    values["w2"][0, :128, :128] = 2.0**-4
    values["w2_scale"][0, 0, 0] = 1e36
    layer.load_state_dict(values)
    assert layer.w2_scale[0, 0, 0] == 1e36
    scale_only = {"w2_scale": values["w2_scale"].clone()}
    scale_only["w2_scale"][0, 1, 0] = 1e36  # over the layer's own values, of up to 448
    with pytest.raises(ValueError, match="w2_scale: expert 0, block \\(1, 0\\): its largest"):
        layer.load_state_dict(scale_only, strict=False)
    assert layer.w2_scale[0, 1, 0] != 1e36


def _other_weights(layer) -> dict:
    """The layer's state dict with every value changed (its router weight doubled)."""
    values = {name: tensor.clone() for name, tensor in layer.state_dict().items()}
    values["gate_weight"] *= 2
    return values


def _same_bytes(a: dict, b: dict) -> bool:
    return all(torch.equal(a[n].view(torch.uint8), b[n].view(torch.uint8)) for n in a)


PARENT_LOADS = {  # a change of the state dict (after gate_weight) -> what the message says
    "a wrong shape": (lambda v: v.__setitem__("w2", v["w2"][:1]), "0.w2 is [1, 256, 128], the"),
    "not a tensor": (lambda v: v.__setitem__("w2_scale", 1.0), "0.w2_scale is float, not a"),
    "a sparse tensor": (
        lambda v: v.__setitem__("gate_bias", v["gate_bias"].to_sparse()),
        "0.gate_bias: a torch.sparse_coo tensor: pass it dense (tensor.to_dense())",
    ),
    "a meta tensor": (
        lambda v: v.__setitem__("w2", v["w2"].to("meta")),
        "0.w2 is a meta tensor (a shape without values)",
    ),
}


@pytest.mark.parametrize("case", PARENT_LOADS)
def test_a_parent_load_that_fails_on_one_tensor_copies_none_of_the_layer(load_layer, case):
    """nn.Module's _load_from_state_dict copies every tensor it can and reports the others:
    a model's load_state_dict with one tensor of the wrong shape (or no tensor, a sparse or a
    meta one) left the layer half replaced (its router from the new state dict, its experts
    the old ones), and running. Now nothing of the layer is copied."""
    change, fragment = PARENT_LOADS[case]
    layer = load_layer(TINY).MoELayer().random_(0)
    before = {name: tensor.clone() for name, tensor in layer.state_dict().items()}
    values = _other_weights(layer)
    change(values)
    with pytest.raises(RuntimeError) as refused:
        nn.Sequential(layer).load_state_dict({f"0.{n}": t for n, t in values.items()})
    assert fragment in str(refused.value)
    assert "nothing of the layer was copied" in str(refused.value)
    assert _same_bytes(before, layer.state_dict())


def test_a_sparse_tensor_in_the_layers_own_load_is_refused_before_any_copy(load_layer):
    """copy_ refuses a sparse tensor after nn.Module copied the tensors before it."""
    layer = load_layer(TINY).MoELayer().random_(0)
    before = {name: tensor.clone() for name, tensor in layer.state_dict().items()}
    values = _other_weights(layer)
    values["gate_bias"] = values["gate_bias"].to_sparse()
    with pytest.raises(ValueError) as refused:
        layer.load_state_dict(values)
    assert str(refused.value) == (
        "tiny_cpu: load_state_dict: gate_bias: a torch.sparse_coo tensor: pass it dense "
        "(tensor.to_dense()); the layer is unchanged"
    )
    assert _same_bytes(before, layer.state_dict())


# --- a dotted key written inside a table ------------------------------------------------------

HIDDEN_LINE = "hidden_size = 256\n"
DOTTED = {  # the spec text's change -> the whole message after the file name and line
    "its own table's name": (
        (HIDDEN_LINE, "model.hidden_size = 256\n"),
        ":7: model.model = {hidden_size = 256}: unknown key in [model]: a dotted key "
        "model.hidden_size written there is read as model.model.hidden_size (write "
        "hidden_size = ... under [model])",
    ),
    "another table's name": (
        ("topk_method", 'quant.scheme = "bf16"\ntopk_method'),
        ':15: router.quant = {scheme = "bf16"}: unknown key in [router]: a dotted key '
        "quant.scheme written there is read as router.quant.scheme (write scheme = ... under "
        "[quant])",
    ),
    "a required key written under another table": (
        (HIDDEN_LINE, "", "topk_method", "model.hidden_size = 256\ntopk_method"),
        ":14: router.model = {hidden_size = 256}: unknown key in [router]: a dotted key "
        "model.hidden_size written there is read as router.model.hidden_size (write "
        "hidden_size = ... under [model])",
    ),
}


@pytest.mark.parametrize("case", DOTTED)
def test_a_dotted_key_inside_a_table_says_where_it_belongs(case, tmp_path, capsys):
    """`model.hidden_size = 256` under [model] is model.model.hidden_size to TOML: it was two
    problems, 'model.hidden_size: is required' and 'model.model = {...}: unknown key in [model]
    (known keys: ...)', neither saying what happened. Now it is one, saying so, at the line of
    the dotted key (it was the table's header line: the locator kept no line for model.model)."""
    changes, message = DOTTED[case]
    text = TINY.read_text()
    for old, new in zip(changes[::2], changes[1::2], strict=True):
        assert old in text
        text = text.replace(old, new, 1)
    path = tmp_path / "spec.toml"
    path.write_text(text)
    assert refused(capsys, "validate", path) == f"{path}{message}\n"


# --- explain -o: a user's file that only starts like a plan -----------------------------------


@pytest.mark.parametrize(
    "first", ["moec 1 plan for the week", "moec v2 plan for tiny_cpu", "moec 0.2.0 plan for x (me)"]
)
def test_explain_keeps_a_users_file_whose_first_line_reads_like_a_plans(first, tmp_path, capsys):
    """explain -o replaced any file whose first line matched 'moec <word> plan for <anything>':
    a user's notes were overwritten. A plan's first line is matched whole now, its spec hash
    included; a plan explain wrote is still replaced."""
    notes = tmp_path / "notes.txt"
    notes.write_text(f"{first}\nmy own lines\n")
    err = refused(capsys, "explain", TINY, "-o", notes)
    assert "exists and was not written by moec" in err
    assert notes.read_text() == f"{first}\nmy own lines\n"
    plan = tmp_path / "plan.txt"
    assert cli(capsys, "explain", TINY, "-o", plan)[0] == 0
    assert cli(capsys, "explain", TINY, "--tokens", "4", "-o", plan)[0] == 0
    assert "T = 4:" in plan.read_text()


# --- --set of a whole table -----------------------------------------------------------------


def test_a_table_set_on_the_command_line_keeps_the_files_other_keys(capsys):
    """--set router={...} put its table in the place of the file's [router]: router={} reset
    the file's routing to the defaults and still validated. A table now sets the keys it holds,
    as the dotted keys would: the file's noaux_tc stays, and refuses the softmax beside it."""
    err = refused(capsys, "validate", TINY, "--set", 'router={scoring_func="softmax"}')
    assert 'router.scoring_func = "softmax": noaux_tc needs sigmoid-family scoring' in err
    assert err == refused(capsys, "validate", TINY, "--set", "router.scoring_func=softmax")
    code, out, _ = cli(capsys, "explain", TINY, "--format", "json", "--set", "router={}")
    plain = cli(capsys, "explain", TINY, "--format", "json")[1]
    assert code == 0 and out == plain
    code, out, _ = cli(
        capsys, "explain", TINY, "--format", "json", "--set", "router={n_group=1, topk_group=1}"
    )
    dotted = cli(
        capsys,
        "explain",
        TINY,
        "--format",
        "json",
        "--set",
        "router.n_group=1",
        "--set",
        "router.topk_group=1",
    )[1]
    assert code == 0 and out == dotted and out != plain


def test_explain_refuses_a_token_count_written_twice(capsys):
    """explain printed the same cost row twice for --tokens 1,4,1; tune refuses it already."""
    err = refused(capsys, "explain", TINY, "--tokens", "1,4,1")
    assert err == 'moec explain: --tokens = "1,4,1": names 1 twice (each token count once)\n'


@pytest.mark.parametrize("value", ["[]", "[[]]", "[[], []]"])
def test_an_empty_placement_is_one_problem(value, capsys):
    """parallel.placement = [] gave three lines for one mistake (0 ranks, 0 physical experts,
    every expert without a replica)."""
    err = refused(capsys, "validate", TINY, "--set", f"parallel.placement={value}")
    assert err.count("\n") == 1
    assert "parallel.placement: places no experts, the layer has 16 physical experts" in err
