"""Issue 28, points 5 and 7, a further hostile round: the generated layer's moves and
conversions (those that should work do; a change of dtype is refused at the conversion, and a
parent module's conversion moves the layer without changing its dtypes), load_state_dict checked
before the first copy, arguments of the Python API (moec.build / moec.load / load_spec /
patch_model / MoELayer) and of `python -m <pkg>.check` refused with one message naming them,
and tuned tables checked against the target's launch limits at build."""

from __future__ import annotations

import copy
import importlib
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from clihelp import assert_refused, cli
from conftest import EXAMPLES
from torch import nn

import moec
from moec.errors import MoecError
from moec.plan import Environment, make_plan, tables
from moec.plan.tuning import TUNED_DIR
from moec.spec import load_spec

TINY = EXAMPLES / "tiny-cpu.toml"  # fp8 block-scaled experts, the torch backend
HIDDEN = 256


@pytest.fixture(scope="module")
def package(cache_dir):
    return moec.load(TINY, cache_dir=cache_dir)


@pytest.fixture(scope="module")
def x() -> torch.Tensor:
    return torch.randn(3, HIDDEN, generator=torch.Generator().manual_seed(7)).bfloat16()


@pytest.fixture(scope="module")
def expected(package, x) -> torch.Tensor:
    return package.MoELayer().random_(1)(x)


def _dtypes(layer) -> dict[str, torch.dtype]:
    return {name: tensor.dtype for name, tensor in layer.state_dict().items()}


# --- moves and conversions that work ------------------------------------------------------


MOVES = {
    'to("cpu")': lambda layer, x: layer.to("cpu"),
    "to(torch.device)": lambda layer, x: layer.to(torch.device("cpu")),
    "to(x)": lambda layer, x: layer.to(x),
    "to(its own dtype)": lambda layer, x: layer.to(torch.bfloat16),
    'to("cpu", its dtype)': lambda layer, x: layer.to("cpu", torch.bfloat16),
    "to(non_blocking)": lambda layer, x: layer.to("cpu", non_blocking=True),
    "cpu()": lambda layer, x: layer.cpu(),
    "requires_grad_(False)": lambda layer, x: layer.requires_grad_(False),
    "eval()": lambda layer, x: layer.eval(),
    "train()": lambda layer, x: layer.train(),
    "share_memory()": lambda layer, x: layer.share_memory(),
    "deepcopy": lambda layer, x: copy.deepcopy(layer),
}


@pytest.mark.parametrize("move", MOVES)
def test_a_move_that_keeps_the_dtypes_works(package, x, expected, move):
    layer = package.MoELayer().random_(1)
    dtypes = _dtypes(layer)
    moved = MOVES[move](layer, x)
    assert isinstance(moved, package.MoELayer)
    assert _dtypes(moved) == dtypes
    assert torch.equal(moved(x), expected)


@pytest.mark.parametrize(
    "convert", [lambda m: m.to(torch.bfloat16), lambda m: m.half(), lambda m: m.double()]
)
def test_a_parent_conversion_moves_the_layer_and_keeps_its_dtypes(package, x, expected, convert):
    """model.half() reaches the layer through _apply, not its .half(): its kernels take the
    dtypes it was built for, which it keeps (x must still be the build's dtype)."""
    model = nn.Sequential(nn.Identity(), package.MoELayer().random_(1))
    dtypes = _dtypes(model[1])
    convert(model)
    assert _dtypes(model[1]) == dtypes
    assert torch.equal(model[1](x), expected)


def test_type_is_refused_like_half(package, x, expected):
    layer = package.MoELayer().random_(1)
    with pytest.raises(TypeError, match=r"\.type\(torch.float16\) would convert \w+ from"):
        layer.type(torch.float16)
    assert torch.equal(layer(x), expected)


def test_to_empty_unsets_the_weights(package, x):
    layer = package.MoELayer().random_(1).to_empty(device="cpu")
    with pytest.raises(ValueError, match="no weights yet"):
        layer(x)


# --- load_state_dict ----------------------------------------------------------------------


def test_a_state_dict_round_trip_sets_the_weights(package, x, expected):
    fresh = package.MoELayer()
    fresh.load_state_dict(package.MoELayer().random_(1).state_dict())
    assert torch.equal(fresh(x), expected)


def test_a_parent_state_dict_load_sets_the_weights(package, x, expected):
    saved = nn.Sequential(package.MoELayer().random_(1)).state_dict()
    model = nn.Sequential(package.MoELayer())
    model.load_state_dict(saved)
    assert torch.equal(model[0](x), expected)


def _renamed(state):
    state["w2_extra"] = state.pop("w2")


def _reshaped(state):
    state["w2_scale"] = torch.ones(3)


def _float(state):
    state["w13"] = state["w13"].float()


def _number(state):
    state["gate_bias"] = 0.0


BAD_STATES = {
    "a name missing and one unknown": (_renamed, ValueError, "missing w2; unexpected w2_extra"),
    "a shape": (_reshaped, ValueError, "w2_scale is [3], the layer's [16, 2, 1]"),
    "a dtype": (_float, TypeError, "w13 is torch.float32, the layer's torch.float8_e4m3fn"),
    "not a tensor": (_number, TypeError, "gate_bias is float, not a torch.Tensor"),
}


@pytest.mark.parametrize("case", BAD_STATES)
def test_a_bad_state_dict_leaves_the_layer_unchanged(package, x, case):
    change, error, fragment = BAD_STATES[case]
    state = package.MoELayer().random_(1).state_dict()
    change(state)
    layer = package.MoELayer().random_(5)
    before = {name: tensor.clone() for name, tensor in layer.state_dict().items()}
    with pytest.raises(error, match=re.escape(fragment)) as raised:
        layer.load_state_dict(state)
    assert "the layer is unchanged" in str(raised.value)
    assert all(torch.equal(before[k], v) for k, v in layer.state_dict().items())


def test_a_parent_load_of_another_dtype_copies_nothing_of_the_layer(package):
    saved = nn.Sequential(package.MoELayer().random_(1)).state_dict()
    saved["0.w13"] = saved["0.w13"].float()
    model = nn.Sequential(package.MoELayer().random_(5))
    before = model[0].w2.clone()
    with pytest.raises(RuntimeError, match="0.w13 is torch.float32, the layer's"):
        model.load_state_dict(saved)
    assert torch.equal(model[0].w2, before)


def test_load_state_dict_of_no_mapping_is_a_type_error(package):
    with pytest.raises(TypeError, match="load_state_dict takes a mapping of names to tensors"):
        package.MoELayer().load_state_dict([("w2", torch.zeros(1))])


# --- MoELayer arguments -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "fragment"),
    [
        ({"device": "gpu"}, ValueError, "device 'gpu': "),
        ({"device": 2.5}, ValueError, "device 2.5: "),
        ({"dtype": "bfloat16"}, TypeError, "dtype must be a torch.dtype, got str"),
        ({"dtype": torch.float16}, ValueError, "was built for torch.bfloat16, not torch.float16"),
    ],
)
def test_a_layer_argument_of_the_wrong_kind_is_named(package, kwargs, error, fragment):
    with pytest.raises(error, match=re.escape(fragment)):
        package.MoELayer(**kwargs)


def test_a_sparse_input_is_refused_by_name(package, x):
    with pytest.raises(TypeError, match="x must be a dense tensor, got layout torch.sparse_coo"):
        package.MoELayer().random_(1)(x.to_sparse())


def test_a_nested_input_is_refused_by_name(package, x):
    nested = torch.nested.nested_tensor([x[0], x[1]], layout=torch.jagged)
    with pytest.raises(TypeError, match="x must be a dense tensor, got a nested tensor"):
        package.MoELayer().random_(1)(nested)


@pytest.mark.parametrize(
    "fill", [lambda layer: layer.random_(0), lambda layer: layer.load_weights({"x": 1})]
)
def test_a_layer_on_meta_refuses_weights_by_name(package, fill):
    with pytest.raises(ValueError, match="on the meta device, which holds no values"):
        fill(package.MoELayer(device="meta"))


def test_the_layers_own_state_dict_given_to_load_weights_names_load_state_dict(package):
    layer = package.MoELayer()
    with pytest.raises(ValueError, match="the layer's own state_dict: load it with load_state"):
        layer.load_weights(package.MoELayer().random_(1).state_dict())
    assert not layer.weights_set


# --- the Python API's arguments ------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "error", "fragment"),
    [
        (lambda out: moec.build(3, out), TypeError, "moec.build: spec must be a path"),
        (lambda out: moec.build(str(TINY).encode(), out), TypeError, "got bytes"),
        (lambda out: moec.build({"name": "x"}, out), TypeError, "got dict"),
        (lambda out: moec.build(TINY, 5), TypeError, "moec.build: out_dir must be a path"),
        (lambda out: moec.build(TINY, [out]), TypeError, "out_dir must be a path (a str or"),
        (
            lambda out: moec.build(TINY, out, "quant.scheme=bf16"),
            TypeError,
            'not one string: "quant.scheme=bf16"',
        ),
        (lambda out: moec.build(TINY, out, [None]), TypeError, "overrides[0] must be a KEY"),
        (lambda out: moec.build(TINY, out, 7), TypeError, "overrides must be a list"),
        (
            lambda out: moec.build(load_spec(TINY), out, ["quant.scheme=bf16"]),
            ValueError,
            "a LoadedSpec holds its own",
        ),
        (lambda out: moec.load(TINY, "x=1", out), TypeError, "moec.load: overrides must be"),
        (lambda out: moec.load(TINY, (), 5), TypeError, "moec.load: cache_dir must be a path"),
        (lambda out: moec.load_spec(None), TypeError, "load_spec: path must be a path"),
        (lambda out: moec.load_spec(TINY, [b"a=1"]), TypeError, "got bytes"),
    ],
)
def test_an_api_argument_of_the_wrong_kind_is_named(call, error, fragment, tmp_path):
    with pytest.raises(error, match=re.escape(fragment)):
        call(tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_none_overrides_are_no_overrides(tmp_path):
    assert moec.build(TINY, tmp_path, None).written


# --- python -m <package>.check ------------------------------------------------------------


@pytest.fixture(scope="module")
def check(package):
    return importlib.import_module(f"{package.__name__}.check")


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--tokens", "\u0661\u0662"], "expects positive token counts"),  # Arabic-Indic 12
        (["--tokens", "5_0"], "expects positive token counts"),
        (["--tokens", "1,,2"], "expects positive token counts"),
        (["--tokens", ",".join(["1"] * 65)], "(at most 64)"),
        (["--tokens", " 5"], "expects positive token counts"),
        (["--seed", "1_000"], "--seed: expects a whole number"),
        (["--seed", "\u00b2"], "--seed: expects a whole number"),
        (["--repeats", "\u00b2"], "--repeats: expects a positive count"),
    ],
)
def test_the_check_takes_ascii_numbers_only(check, capsys, argv, fragment):
    with pytest.raises(SystemExit) as raised:
        check.main(argv)
    err = capsys.readouterr().err
    assert raised.value.code == 2 and fragment in err and "Traceback" not in err, err


# --- patch_model's arguments ----------------------------------------------------------------


@pytest.fixture(scope="module")
def hf_model():
    import hf_oracle

    config = hf_oracle.deepseek_v3(layers=2)
    torch.manual_seed(0)
    return hf_oracle.causal_lm_class(config).from_config(config, dtype=torch.float32).eval()


@pytest.mark.parametrize(
    ("kwargs", "error", "fragment"),
    [
        ({"overrides": "quant.scheme=bf16"}, TypeError, "patch_model: overrides must be a list"),
        ({"overrides": [3]}, TypeError, "patch_model: overrides[0] must be a KEY=VALUE"),
        ({"cache_dir": 5}, TypeError, "patch_model: cache_dir must be a path"),
        ({"spec": 5}, TypeError, "patch_model: spec must be a path"),
        ({"keep_hash_layers": "yes"}, TypeError, "keep_hash_layers must be True or False"),
    ],
)
def test_a_patch_argument_of_the_wrong_kind_is_named(hf_model, kwargs, error, fragment):
    from moec.integrations.transformers import MoecMoE, patch_model

    with pytest.raises(error, match=re.escape(fragment)):
        patch_model(hf_model, **kwargs)
    assert not any(isinstance(module, MoecMoE) for module in hf_model.modules())


@pytest.mark.parametrize(
    ("dtype", "device", "fragment"),
    [
        (torch.float64, "cpu", "is a torch.float64 tensor: moec reads transformers' unquantized"),
        (torch.float32, "meta", "is on meta: moec copies the model's expert weights"),
    ],
)
def test_a_model_whose_experts_moec_cannot_read_is_named(dtype, device, fragment):
    import hf_oracle

    from moec.integrations.transformers import patch_model

    config = hf_oracle.deepseek_v3(layers=2)
    with torch.device(device):
        model = hf_oracle.causal_lm_class(config).from_config(config, dtype=dtype)
    with pytest.raises(MoecError, match=re.escape(fragment)) as raised:
        patch_model(model)
    assert "model.layers.1.mlp.experts.gate_up_proj" in str(raised.value)


# --- user files that are special files ----------------------------------------------------


@pytest.mark.parametrize(
    ("path", "says"),
    [("/dev/null", "a device, not a regular file"), ("fifo", "a fifo, not a regular file")],
)
def test_a_spec_that_is_a_special_file_is_named_as_what_it_is(path, says, tmp_path, capsys):
    if path == "fifo":
        path = tmp_path / "spec.toml"
        os.mkfifo(path)
    assert_refused(*cli(capsys, "validate", path), f"{path}: cannot read the spec: {says}")


def test_weights_that_are_a_fifo_are_named_as_one(package, tmp_path):
    os.mkfifo(tmp_path / "w.safetensors")
    with pytest.raises(ValueError, match="w.safetensors: a fifo, not a regular file"):
        package.MoELayer().load_weights(tmp_path / "w.safetensors")


# --- tuned tables against the target's launch limits ---------------------------------------


V3 = EXAMPLES / "deepseek-v3-fp8.toml"
V3_KEY = "fp8_block/H7168/I2048/E256/K8"


def _shipped_entry() -> list[dict]:
    entries = json.loads((TUNED_DIR / "h200.json").read_text())
    return json.loads(json.dumps(entries[V3_KEY]))


def _table(**gate_up) -> dict:
    buckets = _shipped_entry()
    buckets[0]["gate_up"].update(gate_up)
    return {V3_KEY: buckets}


def _elementwise(kernel: str, **tiles) -> dict:
    entries = json.loads((TUNED_DIR / "h200.json").read_text())
    elementwise = entries[f"elementwise/{V3_KEY}"]
    elementwise[kernel].update(tiles)
    return {V3_KEY: _shipped_entry(), f"elementwise/{V3_KEY}": elementwise}


@pytest.mark.parametrize(
    ("table", "overrides", "says"),
    [
        (_table(BLOCK_K=256), [], "gate_up with BLOCK_K = 256, which does not divide 128"),
        (
            _table(BLOCK_N=65536),
            [],
            "BLOCK_N x BLOCK_K = 65536 x 128, more than the 1048576 elements a Triton block holds",
        ),
        (
            _table(num_stages=64),
            [],
            "with num_stages = 64: 63 tiles of A and W in flight alone take 645120 bytes of "
            "shared memory (fp8_block, BLOCK_M/N/K 16/64/128), more than a program may hold on "
            "sm90 (232448)",
        ),
        (
            _table(num_stages=8, BLOCK_N=256),
            ["target.gpu=nvidia-h200", "target.arch=sm89"],
            "more than a program may hold on sm89 (101376)",
        ),
        (
            _elementwise("permute", BLOCK_H=64),
            [],
            "permute with BLOCK_H = 64, not a multiple of 128: this kernel quantizes",
        ),
        (
            _elementwise("combine", BLOCK_T=4096, BLOCK_H=4096),
            [],
            "combine with BLOCK_T x BLOCK_H = 4096 x 4096, more than the 1048576 elements",
        ),
    ],
)
def test_a_tuned_table_past_the_targets_launch_limits_is_refused_at_build(
    tmp_path, monkeypatch, capsys, table, overrides, says
):
    monkeypatch.setenv("MOEC_TUNING_DIR", str(tmp_path))
    (tmp_path / "nvidia-h200.json").write_text(json.dumps(table))
    argv = ["build", V3, "-o", tmp_path / "out", *[f"--set={o}" for o in overrides]]
    code, out, err = cli(capsys, *argv)
    assert_refused(code, out, err, f"the tuned table {tmp_path / 'nvidia-h200.json'}", says)
    assert "moec tune" in err and not (tmp_path / "out").exists()


def test_the_gemm_tiles_of_a_deep_gemm_layer_are_not_held_to_triton_limits(tmp_path, monkeypatch):
    """DeepGEMM runs the GEMMs: the table's GEMM tiles are not launched, so not refused."""
    (tmp_path / "nvidia-h200.json").write_text(json.dumps(_table(BLOCK_K=256)))
    env = Environment(frozenset({"triton", "deep_gemm"}), tmp_path)
    spec = load_spec(V3, ["experts.gemm_backend=deep_gemm"]).spec
    assert make_plan(spec, env).backends.gemm == "deep_gemm"


def test_every_shipped_table_is_within_the_h200s_launch_limits():
    for name in tables.SHIPPED_TABLES.values():
        entries = json.loads((TUNED_DIR / name).read_text())
        for key, buckets in entries.items():
            if key.startswith(("elementwise/", "backends/")):
                continue
            scheme = key.split("/")[0]
            groups = {} if scheme == "bf16" else {"permute": 128, "act": 128}
            found = tables.TunedTable(
                "nvidia-h200", key, name, buckets, entries.get(f"elementwise/{key}")
            )
            tables.check_launch_limits(found, buckets, "sm90", (scheme,), groups)


def test_numpy_and_path_arguments_still_work(package, x, expected, tmp_path):
    """What the checks take: a numpy seed, a Path spec and out_dir."""
    assert torch.equal(package.MoELayer().random_(np.int32(1))(x), expected)
    assert moec.build(Path(TINY), Path(tmp_path)).package_dir == tmp_path / "tiny_cpu"
