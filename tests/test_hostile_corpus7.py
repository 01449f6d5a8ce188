"""A seventh hostile corpus, of what already behaves and a later change could break: TOML
values of no key's type (dates, times, inline tables) and keys of odd case are one line naming
the key; `-o` a dangling link, a link into a built package, /dev/stdout or a device is refused
with nothing written; a placement array of duplicate, float, bool or nested ids is named by its
element; a HF config.json value of the wrong type is named by its config key; a description of
terminal escapes stays escaped in every explain format; the generated layer takes stride-0,
offset and subclassed inputs as their values and refuses other dtypes and ranks by name; a
hash-routed layer's token ids of another dtype, a wrapping int64 or another device are refused,
and strided ids route as their values (torch backend); load_weights refuses complex, oversized,
duplicated and misnamed tensors in one WeightError and takes float checkpoints of any width."""

from __future__ import annotations

import json
import math

import pytest
import torch
from clihelp import cli, refused, snapshot
from conftest import EXAMPLES
from test_spec_hf import DEEPSEEK_V3

TINY = EXAMPLES / "tiny-cpu.toml"

# --- TOML values of no key's type ------------------------------------------------------------


@pytest.mark.parametrize(
    "key, says",
    [
        ("model.hidden_size", "should be a valid integer"),
        ("parallel.nodes", "should be a valid integer"),
        ("experts.gemm_backend", "is not a known value (one of 'auto', 'torch', 'triton' or"),
        ("target.dtype", "is not a known value (one of 'bfloat16', 'float16' or 'float32')"),
        ("quant.weight_block", "should be a valid list (an array, e.g. [128, 128])"),
        ("parallel.placement", "is neither a string nor an array"),
    ],
)
@pytest.mark.parametrize("value", ["1979-05-27", "07:32:00"])
def test_a_toml_date_or_time_is_named_with_its_key(key, says, value, capsys):
    err = refused(capsys, "validate", TINY, "--set", f"{key}={value}")
    assert f"(--set): {key} = {value}: {says}" in err


@pytest.mark.parametrize("value", ["0x100", "+256", "2_5_6", "0o400", "0b100000000"])
def test_toml_integer_spellings_are_the_integer(value, capsys):
    """TOML's hex, octal, binary, signed and underscored integers are 256."""
    code, out, err = cli(capsys, "validate", TINY, "--set", f"model.hidden_size={value}")
    assert (code, out, err) == (0, "ok\n", "")


def test_spaces_around_a_set_key_and_value_are_toml_spaces(capsys):
    code, out, err = cli(capsys, "validate", TINY, "--set", " model.hidden_size = 512 ")
    assert (code, out, err) == (0, "ok\n", "")


@pytest.mark.parametrize(
    "item, says",
    [
        ("MODEL.hidden_size=1", "MODEL = {hidden_size = 1}: unknown key in the top level (did you mean model?)"),
        ("Model.Hidden_Size=1", "Model = {Hidden_Size = 1}: unknown key in the top level (did you mean model?)"),
        ("model.Hidden_size=1", "model.Hidden_size = 1: unknown key in [model] (did you mean hidden_size?)"),
        ("router.N_GROUP=1", "router.N_GROUP = 1: unknown key in [router] (did you mean n_group?)"),
        ("Name=x", 'Name = "x": unknown key in the top level (did you mean name?)'),
    ],
)  # fmt: skip
def test_a_key_of_odd_case_is_an_unknown_key(item, says, capsys):
    err = refused(capsys, "validate", TINY, "--set", item)
    assert says in err


@pytest.mark.parametrize(
    "item, says",
    [
        ("activation=silu", 'activation = "silu": must be a table ([activation] with its keys)'),
        ("quant=fp8_block", 'quant = "fp8_block": must be a table ([quant] with its keys)'),
        ("model.hidden_size.x=1", "model.hidden_size.x = 1: hidden_size is not a table"),
        ("router.scoring_func=softmax # c", 'router.scoring_func = "softmax # c": is not a known'),
        ("target.device=cuda:1", 'target.device = "cuda:1": is not a known value'),
        ("target.arch=SM90", 'target.arch = "SM90": is not a known value'),
    ],
)
def test_a_value_in_the_wrong_place_is_one_line(item, says, capsys):
    err = refused(capsys, "validate", TINY, "--set", item)
    assert says in err


def test_two_spellings_of_one_table_are_each_named(tmp_path, capsys):
    spec = tmp_path / "case.toml"
    spec.write_text(
        'name = "x"\n[MODEL]\nhidden_size = 256\n[Model]\nx = 1\n[model]\nhidden_size = 256\n'
        "moe_intermediate_size = 128\nn_routed_experts = 16\nnum_experts_per_tok = 4\n"
        '[target]\ndevice = "cpu"\n'
    )
    err = refused(capsys, "validate", spec, lines=2)
    assert f"{spec}:2: MODEL = {{hidden_size = 256}}: unknown key in the top level" in err
    assert f"{spec}:4: Model = {{x = 1}}: unknown key in the top level (did you mean model?)" in err


# --- -o that moec does not write through -----------------------------------------------------


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(DEEPSEEK_V3))
    return path


def test_init_does_not_write_through_a_dangling_link(tmp_path, config, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "dang.toml").symlink_to("nowhere.toml")
    before = snapshot(tmp_path)
    err = refused(capsys, "init", "--from-hf", config, "-o", "dang.toml")
    assert "dang.toml: is a symbolic link; moec does not write through it" in err
    assert snapshot(tmp_path) == before
    assert not (tmp_path / "nowhere.toml").exists()


@pytest.mark.parametrize(
    "argv",
    [
        ("schema", "-o", "pk/s.json"),
        ("init", "--from-hf", "CONFIG", "-o", "pk/x.toml"),
        ("explain", TINY, "-o", "pk/plan.txt"),
    ],
    ids=["schema", "init", "explain"],
)
def test_an_out_path_through_a_link_to_a_built_package_is_refused(
    argv, tmp_path, config, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    assert cli(capsys, "build", TINY, "-o", "bo")[0] == 0
    (tmp_path / "pk").symlink_to("bo/tiny_cpu")
    before = snapshot(tmp_path)
    argv = [config if arg == "CONFIG" else arg for arg in argv]
    err = refused(capsys, *argv)
    assert f"-o: is inside {tmp_path / 'pk'}, a package moec built (an -o outside it)" in err
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize(
    "path, says",
    [
        ("/dev/stdout", "is a symbolic link; moec does not write through it"),
        ("/proc/self/fd/1", "is a symbolic link; moec does not write through it"),
        ("/dev/null", "is a device, not a regular file"),
        ("/dev/full", "is a device, not a regular file"),
    ],
)
@pytest.mark.parametrize("command", ["init", "explain", "schema"])
def test_an_out_path_to_a_stream_or_device_is_refused(command, path, says, config, capsys):
    argv = {"init": ("--from-hf", config), "explain": (TINY,), "schema": ()}[command]
    err = refused(capsys, command, *argv, "-o", path)
    assert f"{path}: {says}" in err


# --- placement arrays --------------------------------------------------------------------------

EP2 = ("--set", "parallel.dispatch=all2all", "--set", "parallel.ep_size=2")
RANK0 = "0,1,2,3,4,5,6"
RANK1 = "8,9,10,11,12,13,14,15"


@pytest.mark.parametrize(
    "placement, says",
    [
        (f"[[{RANK0},-1],[{RANK1}]]", "parallel.placement.0.7 = -1: should be greater than or equal to 0"),
        (f"[[{RANK0},7.0],[{RANK1}]]", "parallel.placement.0.7 = 7.0: should be a valid integer"),
        (f"[[{RANK0},true],[{RANK1}]]", "parallel.placement.0.7 = true: should be a valid integer"),
        ("[[[0]],[1]]", "parallel.placement.0.0 = [0]: should be a valid integer"),
        (f"[[{RANK0},7],[{RANK1},99999999999999999999]]", "parallel.placement.1.8 = 99999999999999999999: should be less than or equal to 2147483647"),
        (f"[[{RANK0},7],[8,9,10,11,12,13,14,14]]", "parallel.placement: leaves experts 15 without a replica"),
        (f"[[{RANK0},7],[8,9,10,11,12,13,14,16]]", "parallel.placement: names experts 16, beyond the 16 routed experts"),
        ("[]", "parallel.placement: places no experts, the layer has 16 physical experts on 2 ranks"),
        ('"/dev/zero"', 'parallel.placement = "/dev/zero": /dev/zero: a device, not a regular file'),
        ('"."', 'parallel.placement = ".": cannot read .: Is a directory'),
    ],
)  # fmt: skip
def test_a_bad_placement_array_is_named_by_its_element(placement, says, capsys):
    err = refused(
        capsys, "validate", TINY, *EP2, "--set", f"parallel.placement={placement}", lines=None
    )
    assert says in err
    assert all(line.startswith(f"{TINY} (--set): parallel.placement") for line in err.splitlines())


def test_a_placement_with_replicas_is_taken(capsys):
    placement = f"[[{RANK0},7,0],[{RANK1},15]]"
    code, out, err = cli(
        capsys, "validate", TINY, *EP2, "--set", "parallel.redundant_experts=2",
        "--set", f"parallel.placement={placement}",
    )  # fmt: skip
    assert (code, out, err) == (0, "ok\n", "")


# --- HF config.json values of the wrong type ---------------------------------------------------


@pytest.mark.parametrize(
    "key, value, says",
    [
        ("hidden_size", 1e308, "hidden_size = 1e+308: is a number, not an integer"),
        ("n_routed_experts", math.nan, "n_routed_experts = nan: is a non-finite number, not an integer"),
        ("num_experts_per_tok", "8", 'num_experts_per_tok = "8": is a string, not an integer'),
        ("routed_scaling_factor", math.inf, "routed_scaling_factor = inf: is a non-finite number"),
        ("n_group", [8], "n_group = [8]: is a list of integers, not an integer"),
        ("norm_topk_prob", "true", 'norm_topk_prob = "true": is a string, not a boolean'),
        ("quantization_config", [], "quantization_config = []: is a list, not a JSON object"),
        ("model_type", " deepseek_v3", 'model_type = " deepseek_v3": is not a DeepSeek-family MoE config'),
        ("hidden_act", "SiLU", 'hidden_act = "SiLU": is not a gated activation moec knows'),
        ("torch_dtype", "bf16", 'torch_dtype = "bf16": is not a dtype a moec layer runs in'),
    ],
)  # fmt: skip
def test_a_config_value_of_the_wrong_type_names_its_config_key(
    key, value, says, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**DEEPSEEK_V3, key: value}))
    before = snapshot(tmp_path)
    err = refused(capsys, "init", "--from-hf", path, "-o", "spec.toml")
    assert err.startswith(f"{path}: {says}")
    assert snapshot(tmp_path) == before


# --- a description of terminal escapes ---------------------------------------------------------

ESCAPES = 'description="\\u001b[31mRED\\u202eX\\u0007"'


@pytest.mark.parametrize("form", ["text", "json", "dot", "mermaid", "svg"])
def test_a_description_of_escapes_reaches_no_terminal_raw(form, capsys):
    code, out, err = cli(capsys, "explain", TINY, "--set", ESCAPES, "--format", form)
    assert (code, err) == (0, "")
    assert not any(char in out for char in "\x1b\x07\u202e")


def test_a_description_of_escapes_is_an_escaped_literal_in_the_package(tmp_path, capsys):
    code, _, _ = cli(capsys, "build", TINY, "--set", ESCAPES, "-o", tmp_path)
    assert code == 0
    package = tmp_path / "tiny_cpu"
    assert 'DESCRIPTION = "\\x1b[31mRED\\u202eX\\x07"\n' in (package / "__init__.py").read_text()
    for module in package.glob("*.py"):
        assert not any(char in module.read_text() for char in "\x1b\x07\u202e"), module


# --- the layer's inputs --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(load_layer):
    package = load_layer(TINY)
    layer = package.MoELayer().random_(1)
    x = torch.randn(4, 256, generator=torch.Generator().manual_seed(0)).bfloat16()
    return layer, x, layer(x)


class _Sub(torch.Tensor):
    pass


@pytest.mark.parametrize(
    "make",
    [
        lambda x: torch.nn.Parameter(x.clone(), requires_grad=False),
        lambda x: x.as_subclass(_Sub),
        lambda x: x.t().contiguous().t(),
        lambda x: torch.cat([x, x])[4:],
        lambda x: torch.cat([torch.zeros(1, dtype=x.dtype), x.flatten()])[1:].view(4, 256),
        lambda x: x.clone().requires_grad_(True),
    ],
    ids=["parameter", "subclass", "column-major", "offset view", "odd storage offset", "grad"],
)
def test_an_input_of_the_same_values_in_another_form_gives_the_same_output(tiny, make):
    layer, x, expected = tiny
    out = layer(make(x))
    assert torch.equal(out, expected) and not out.requires_grad


def test_a_stride_zero_input_is_its_rows(tiny):
    layer, x, _ = tiny
    assert torch.equal(layer(x[:1].expand(4, 256)), layer(x[:1].repeat(4, 1)))


def test_zero_rows_give_zero_and_a_huge_row_leaves_the_others(tiny):
    layer, x, _ = tiny
    assert layer(torch.zeros(3, 256, dtype=torch.bfloat16)).abs().max().item() == 0.0
    huge = torch.full((1, 256), 1e30, dtype=torch.bfloat16)
    assert torch.equal(layer(torch.cat([huge, x[:1]]))[1], layer(x[:1])[0])


@pytest.mark.parametrize(
    "make, says",
    [
        (lambda x: x.to(torch.int32), "x must be torch.bfloat16, got torch.int32"),
        (lambda x: x.double(), "x must be torch.bfloat16, got torch.float64"),
        (lambda x: x[0], "x must be [T, 256], got [256]"),
        (lambda x: x[None], "x must be [T, 256], got [1, 4, 256]"),
        (lambda x: x[0, 0], "x must be [T, 256], got []"),
        (lambda x: x[:, :0], "x must be [T, 256], got [4, 0]"),
        (lambda x: torch.empty(4, 256, dtype=x.dtype, device="meta"), "x is on meta"),
    ],
    ids=["int32", "float64", "1-d", "3-d", "0-d", "no columns", "meta"],
)
def test_an_input_of_another_dtype_rank_or_device_is_named(tiny, make, says):
    layer, x, _ = tiny
    with pytest.raises(ValueError) as raised:
        layer(make(x))
    assert str(raised.value).startswith(f"tiny_cpu: {says}")


# --- a hash-routed layer's token ids (torch backend) --------------------------------------------

HASH = [
    "router.topk_method=hash", "model.vocab_size=64", "router.n_group=1", "router.topk_group=1",
    "router.scoring_func=sqrtsoftplus",
]  # fmt: skip


@pytest.fixture(scope="module")
def hashed(load_layer):
    layer = load_layer(TINY, *HASH).MoELayer().random_(1)
    x = torch.randn(4, 256, generator=torch.Generator().manual_seed(1)).bfloat16()
    ids = torch.tensor([1, 2, 3, 4])
    return layer, x, ids, layer(x, ids)


@pytest.mark.parametrize(
    "make, error, says",
    [
        (lambda ids: ids + 2**32, ValueError, "token id 4294967297 is outside the hash table's 64 ids"),
        (lambda ids: ids - 5, ValueError, "token id -4 is outside the hash table's 64 ids"),
        (lambda ids: ids.float(), ValueError, "token_ids must be [4] int64 or int32 ids (one per row of x), got torch.float32 [4]"),
        (lambda ids: ids.to(torch.uint8), ValueError, "got torch.uint8 [4]"),
        (lambda ids: ids.to(torch.int16), ValueError, "got torch.int16 [4]"),
        (lambda ids: ids.bool(), ValueError, "got torch.bool [4]"),
        (lambda ids: ids[:3], ValueError, "got torch.int64 [3]"),
        (lambda ids: ids.tolist(), TypeError, "token_ids must be a torch.Tensor, got list"),
        (lambda ids: ids.numpy(), TypeError, "token_ids must be a torch.Tensor, got ndarray"),
        (lambda ids: ids.to("meta"), ValueError, "token_ids are on meta, x on cpu"),
        (lambda ids: None, ValueError, "forward(x, token_ids) takes the token id of each row of x"),
    ],
    ids=["wraps int32", "negative", "float", "uint8", "int16", "bool", "short", "list", "numpy", "meta", "none"],
)  # fmt: skip
def test_token_ids_the_table_cannot_take_are_named(hashed, make, error, says):
    layer, x, ids, expected = hashed
    with pytest.raises(error) as raised:
        layer(x, make(ids))
    assert says in str(raised.value)
    assert torch.equal(layer(x, ids), expected)


@pytest.mark.parametrize(
    "make",
    [
        lambda ids: ids.int(),
        lambda ids: torch.stack([ids, torch.zeros_like(ids)], 1)[:, 0],
        lambda ids: torch.tensor([9, 1, 9, 2, 9, 3, 9, 4])[1::2],
    ],
    ids=["int32", "column of a matrix", "every other"],
)
def test_token_ids_in_another_form_route_as_their_values(hashed, make):
    layer, x, ids, expected = hashed
    given = make(ids)
    assert torch.equal(given, ids.to(given.dtype))
    assert torch.equal(layer(x, given), expected)
    assert torch.equal(layer(x, token_ids=ids), expected)


def test_one_expanded_token_id_is_the_same_id_for_every_row(hashed):
    layer, x, _, _ = hashed
    assert torch.equal(layer(x, torch.tensor([5]).expand(4)), layer(x, torch.tensor([5] * 4)))


def test_no_rows_take_no_ids_but_still_need_them(hashed):
    layer, x, ids, _ = hashed
    assert layer(x[:0], ids[:0]).shape == (0, 256)
    with pytest.raises(ValueError, match="takes the token id of each row"):
        layer(x[:0])
    with pytest.raises(ValueError, match=r"got torch.float32 \[0\]"):
        layer(x[:0], torch.empty(0))


# --- load_weights of hostile checkpoints -------------------------------------------------------

H, INTER, E = 256, 128, 16


@pytest.fixture(scope="module")
def checkpoint():
    generator = torch.Generator().manual_seed(0)

    def weight(*shape):
        return (torch.randn(*shape, generator=generator) * 0.05).bfloat16()

    names = {"gate.weight": weight(E, H), "gate.e_score_correction_bias": torch.zeros(E)}
    for e in range(E):
        names[f"experts.{e}.gate_proj.weight"] = weight(INTER, H)
        names[f"experts.{e}.up_proj.weight"] = weight(INTER, H)
        names[f"experts.{e}.down_proj.weight"] = weight(H, INTER)
    names["shared_experts.gate_proj.weight"] = weight(INTER, H)
    names["shared_experts.up_proj.weight"] = weight(INTER, H)
    names["shared_experts.down_proj.weight"] = weight(H, INTER)
    return names


@pytest.fixture(scope="module")
def loaded(load_layer, checkpoint):
    package = load_layer(TINY)
    x = torch.randn(3, H, generator=torch.Generator().manual_seed(2)).bfloat16()
    return package, x, package.MoELayer().load_weights(checkpoint)(x)


@pytest.mark.parametrize(
    "convert",
    [
        lambda t: t.float(),
        lambda t: t.half() if t.dim() == 1 else t.float().half().float().bfloat16(),
        lambda t: t.double(),
        lambda t: t.t().contiguous().t() if t.dim() == 2 else t,
        lambda t: t.clone().requires_grad_(True),
    ],
    ids=["fp32", "fp16 bias", "fp64", "column-major", "requires grad"],
)
def test_a_float_checkpoint_of_any_width_loads_the_same_layer(loaded, checkpoint, convert):
    package, x, expected = loaded
    layer = package.MoELayer().load_weights({k: convert(v) for k, v in checkpoint.items()})
    assert torch.equal(layer(x), expected)


def test_a_checkpoint_given_as_a_generator_of_pairs_loads(loaded, checkpoint):
    package, x, expected = loaded
    layer = package.MoELayer().load_weights(pair for pair in checkpoint.items())
    assert torch.equal(layer(x), expected)


@pytest.mark.parametrize(
    "change, says",
    [
        ({"gate.e_score_correction_bias": torch.zeros(E, dtype=torch.complex64)}, "gate.e_score_correction_bias: torch.complex64 [16]: weights are floating point"),
        ({"gate.e_score_correction_bias": torch.zeros(E, dtype=torch.int64)}, "gate.e_score_correction_bias: torch.int64 [16]: weights are floating point"),
        ({"gate.e_score_correction_bias": torch.full((E,), 1e300, dtype=torch.float64)}, "gate.e_score_correction_bias: values beyond fp32 (the router computes in fp32)"),
        ({"experts.1.down_proj.weight": torch.full((H, INTER), 1e300, dtype=torch.float64)}, "experts.1.down_proj.weight: 32768 of its 32768 values are beyond what bf16 holds"),
        ({"experts.0.gate_proj.weight": torch.full((INTER, H), math.inf, dtype=torch.bfloat16)}, "experts.0.gate_proj.weight: 32768 of its 32768 values are not finite"),
        ({"experts.16.gate_proj.weight": torch.zeros(INTER, H, dtype=torch.bfloat16)}, "experts.16.gate_proj.weight: unexpected (expert id >= 16)"),
        ({"experts.-1.gate_proj.weight": torch.zeros(INTER, H, dtype=torch.bfloat16)}, "experts.-1.gate_proj.weight: unexpected"),
        ({"gate.bias": torch.ones(E)}, "gate.bias: a second value of a weight the checkpoint already holds"),
        ({"shared_expert.gate_proj.weight": torch.zeros(INTER, H, dtype=torch.bfloat16)}, "shared_expert.gate_proj.weight: a second value"),
        ({"experts.0.gate_proj.weight_scale_inv": torch.ones(1, 2)}, "experts.0.gate_proj.weight_scale_inv: unexpected for a fp8_block checkpoint of float weights"),
        ({"gate.weight": torch.zeros(E * H, dtype=torch.bfloat16)}, "gate.weight: shape [4096], expected [16, 256]"),
        ({"gate.weight": torch.zeros(E, H, dtype=torch.bfloat16, device="meta")}, "gate.weight: on the meta device, it holds no values"),
        ({5: torch.zeros(1)}, "the name 5 is a int, not a string"),
    ],
    ids=["complex", "int64", "past fp32", "past bf16", "inf", "expert 16", "expert -1", "v4 bias beside", "shared alias beside", "scale of a float", "flat", "meta", "int name"],
)  # fmt: skip
def test_a_hostile_tensor_is_one_weight_error_and_no_weights(loaded, checkpoint, change, says):
    package, x, _ = loaded
    layer = package.MoELayer()
    with pytest.raises(Exception) as raised:
        layer.load_weights({**checkpoint, **change})
    assert type(raised.value).__name__ == "WeightError"
    assert says in str(raised.value)
    assert str(raised.value).endswith("the layer is unchanged: no parameter was written")
    assert not layer.weights_set


@pytest.mark.parametrize(
    "name",
    ["experts.+1.gate_proj.weight", "experts. 1.gate_proj.weight", "experts.1_0.gate_proj.weight"],
)
def test_an_expert_id_python_reads_but_no_checkpoint_writes_is_unexpected(loaded, checkpoint, name):
    """int() takes "+1", " 1" and "1_0"; a checkpoint's names do not."""
    package, _, _ = loaded
    given = dict(checkpoint)
    given[name] = given.pop("experts.1.gate_proj.weight")
    with pytest.raises(Exception) as raised:
        package.MoELayer().load_weights(given)
    assert f"{name}: unexpected" in str(raised.value)
    assert "experts.1.gate_proj.weight: missing" in str(raised.value)


@pytest.mark.parametrize(
    "prefix, says",
    [
        (None, "prefix None: a string, e.g. 'model.layers.3.mlp.'"),
        (3, "prefix 3: a string"),
        ("model.layers.3.mlp.", 'no tensor of the layer is under the prefix "model.layers.3.mlp."'),
    ],
)
def test_a_prefix_that_names_no_weights_is_named(loaded, checkpoint, prefix, says):
    package, _, _ = loaded
    with pytest.raises(Exception) as raised:
        package.MoELayer().load_weights(checkpoint, prefix=prefix)
    assert says in str(raised.value)


def test_a_prefix_without_a_dot_is_taken_as_written(loaded, checkpoint):
    package, x, expected = loaded
    given = {f"mlp{name}": tensor for name, tensor in checkpoint.items()}
    assert torch.equal(package.MoELayer().load_weights(given, prefix="mlp")(x), expected)


# --- init's --set and --from-hf forms ----------------------------------------------------------


@pytest.mark.parametrize(
    "item, says",
    [
        ("quant.scheme=nonsense", 'quant.scheme = "nonsense": is not a known value'),
        ("bogus.x=1", "bogus = {x = 1}: unknown key in the top level"),
        ("model.hidden_size=1.5", "model.hidden_size = 1.5: should be a valid integer"),
    ],
)
def test_an_init_set_that_makes_no_spec_writes_nothing(item, says, tmp_path, config, capsys):
    out = tmp_path / "spec.toml"
    before = snapshot(tmp_path)
    err = refused(capsys, "init", "--from-hf", config, "--set", item, "-o", out)
    assert err == f"{config} (--set): {says}" + err.split(says, 1)[1]
    assert snapshot(tmp_path) == before


def test_a_folder_or_a_link_of_a_config_reads_as_the_config(tmp_path, config, capsys):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "config.json").write_bytes(config.read_bytes())
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "config.json").symlink_to("../a/config.json")
    outputs = set()
    for given in (config, tmp_path / "a", f"{tmp_path / 'a'}/", tmp_path / "c"):
        code, out, err = cli(capsys, "init", "--from-hf", given)
        assert (code, err) == (0, "")
        outputs.add(out.split("\n", 2)[2])  # past the schema line and init's header
    assert len(outputs) == 1


def test_a_config_json_that_is_a_folder_is_named(tmp_path, capsys):
    (tmp_path / "b" / "config.json").mkdir(parents=True)
    err = refused(capsys, "init", "--from-hf", tmp_path / "b")
    assert (
        err
        == f"{tmp_path / 'b' / 'config.json'}: --from-hf: cannot read: Is a directory (a HF config.json)\n"
    )
