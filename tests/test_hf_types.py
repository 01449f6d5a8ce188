"""Issue 9, point 5: `moec init --from-hf` checks the type of every config.json value, naming
the config key, and never coerces or repairs one; a file that is no config is exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from clihelp import assert_refused, cli, snapshot
from test_spec_hf import DEEPSEEK_V2_LITE, DEEPSEEK_V3, write_config

from moec.spec import load_spec

FP8 = DEEPSEEK_V3["quantization_config"]


def init_refused(capsys, tmp_path: Path, config, *fragments: str, extra=()) -> str:
    """init on `config` (a dict, or the text of a file): exit 2 naming `fragments`, one line,
    no spec written and the config left as it was."""
    if isinstance(config, (str, bytes)):
        path = tmp_path / "config.json"
        path.write_bytes(config.encode() if isinstance(config, str) else config)
    else:
        path = write_config(tmp_path, config)
    before = snapshot(tmp_path)
    code, out, err = cli(capsys, "init", "--from-hf", path, "-o", tmp_path / "spec.toml", *extra)
    assert_refused(code, out, err, *fragments, lines=None)
    assert err.startswith(str(path))
    assert snapshot(tmp_path) == before
    return err


WRONG_TYPES = {
    "hidden_size string": ({"hidden_size": "7168"}, 'hidden_size = "7168": is a string'),
    "hidden_size float": (
        {"hidden_size": 7168.0},
        "hidden_size = 7168.0: is a number, not an integer",
    ),
    "hidden_size bool": ({"hidden_size": True}, "hidden_size = true: is a boolean"),
    "hidden_size list": ({"hidden_size": [7168]}, "hidden_size = [7168]: is a list"),
    "hidden_size object": ({"hidden_size": {"v": 1}}, "hidden_size = {v = 1}: is a JSON object"),
    "intermediate string": ({"moe_intermediate_size": "2k"}, "moe_intermediate_size"),
    "experts string": ({"n_routed_experts": "256"}, 'n_routed_experts = "256"'),
    "top-k float": ({"num_experts_per_tok": 8.5}, "num_experts_per_tok = 8.5"),
    "shared string": ({"n_shared_experts": "1"}, 'n_shared_experts = "1"'),
    "n_group string": ({"n_group": "8"}, 'n_group = "8"'),
    "n_group bool": ({"n_group": True}, "n_group = true: is a boolean"),
    "topk_group false": ({"topk_group": False}, "topk_group = false"),
    "norm string false": ({"norm_topk_prob": "false"}, 'norm_topk_prob = "false": is a string'),
    "norm string true": ({"norm_topk_prob": "true"}, "norm_topk_prob"),
    "norm integer": ({"norm_topk_prob": 1}, "norm_topk_prob = 1: is a number, not a boolean"),
    "scaling string": ({"routed_scaling_factor": "2.5"}, 'routed_scaling_factor = "2.5"'),
    "scaling list": ({"routed_scaling_factor": [2.5]}, "routed_scaling_factor = [2.5]"),
    "scaling nan": ({"routed_scaling_factor": float("nan")}, "routed_scaling_factor = nan"),
    "scaling inf": ({"routed_scaling_factor": float("inf")}, "non-finite"),
    "scoring number": ({"scoring_func": 1}, "scoring_func = 1: is a number, not a string"),
    "method list": ({"topk_method": ["noaux_tc"]}, "topk_method"),
    "hidden_act number": ({"hidden_act": 1}, "hidden_act = 1"),
    # swiglu_limit is read where the model type's MoE block clamps (GLM-5-Next's, DeepSeek-V4's);
    # transformers' DeepseekV3MoE never reads it, and init no longer does for deepseek_v3
    "swiglu_limit string": (
        {"model_type": "glm5_next_text", "swiglu_limit": "10"},
        'swiglu_limit = "10"',
    ),
    "dtype number": ({"torch_dtype": 16}, "torch_dtype = 16"),
    "dtype unknown": ({"torch_dtype": "float8_e4m3fn"}, 'torch_dtype = "float8_e4m3fn"'),
    "name_or_path number": ({"_name_or_path": 5}, "_name_or_path = 5"),
    "model_type number": ({"model_type": 3}, "model_type = 3"),
    "quant list": ({"quantization_config": ["fp8"]}, "quantization_config"),
    "quant empty": ({"quantization_config": {}}, "quantization_config.quant_method: is missing"),
    "quant method number": (
        {"quantization_config": {**FP8, "quant_method": 8}},
        "quantization_config.quant_method = 8",
    ),
    "block string": (
        {"quantization_config": {**FP8, "weight_block_size": "128"}},
        "quantization_config.weight_block_size",
    ),
    "block floats": (
        {"quantization_config": {**FP8, "weight_block_size": [128.0, 128]}},
        "weight_block_size = [128.0, 128]: is a list, not a list of integers",
    ),
    "block bools": (
        {"quantization_config": {**FP8, "weight_block_size": [True, 128]}},
        "weight_block_size",
    ),
    "activation_scheme number": (
        {"quantization_config": {"quant_method": "fp8", "activation_scheme": 1}},
        "quantization_config.activation_scheme = 1",
    ),
}


@pytest.mark.parametrize("case", WRONG_TYPES)
def test_a_value_of_the_wrong_type_names_its_key(case, tmp_path, capsys):
    change, fragment = WRONG_TYPES[case]
    init_refused(capsys, tmp_path, {**DEEPSEEK_V3, **change}, fragment)


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"n_group": 0}, "router.n_group = 0"),  # not repaired to 1
        ({"topk_group": 0}, "router.topk_group = 0"),
        ({"n_shared_experts": -1}, "model.n_shared_experts = -1"),
        ({"hidden_size": 2**70}, "model.hidden_size = 1180591620717411303424"),
        ({"routed_scaling_factor": 0}, "router.routed_scaling_factor = 0"),
        (  # a model type whose block clamps (deepseek_v3's never reads swiglu_limit)
            {"model_type": "glm5_next_text", "swiglu_limit": -3.0},
            "activation.swiglu_limit = -3.0",
        ),
        (
            {"quantization_config": {**FP8, "activation_scheme": "static"}},
            'quant.activation_scheme = "static"',  # kept as written, not dropped
        ),
    ],
    ids=lambda value: json.dumps(value) if isinstance(value, dict) else None,
)
def test_a_value_out_of_range_is_reported_as_written(change, fragment, tmp_path, capsys):
    init_refused(capsys, tmp_path, {**DEEPSEEK_V3, **change}, fragment)


@pytest.mark.parametrize(
    "key",
    [
        "model_type",
        "hidden_size",
        "moe_intermediate_size",
        "n_routed_experts",
        "num_experts_per_tok",
    ],
)
@pytest.mark.parametrize("how", ["absent", "null"])
def test_a_required_key_missing_or_null(key, how, tmp_path, capsys):
    config = {k: v for k, v in DEEPSEEK_V3.items() if k != key}
    if how == "null":
        config[key] = None
    init_refused(capsys, tmp_path, config, f"{key}: is missing from config.json")


def test_every_wrong_value_is_reported_at_once(tmp_path, capsys):
    config = {**DEEPSEEK_V3, "hidden_size": "7168", "norm_topk_prob": "no", "n_group": 2.0}
    err = init_refused(capsys, tmp_path, config, "hidden_size", "norm_topk_prob", "n_group")
    assert len(err.strip().splitlines()) == 3


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ("", "not JSON"),
        ("{not json", "not JSON"),
        ('{"hidden_size": 7168,}', "not JSON"),
        ("[1, 2]", "is not a JSON object"),
        ('"deepseek_v3"', "is not a JSON object"),
        ("null", "is not a JSON object"),
        ("7168", "is not a JSON object"),
        (b"\xff\xfe{}", "not UTF-8"),
        ("\ufeff{}", "starts with a UTF-8 byte order mark (BOM)"),
        (
            '{"model_type": "deepseek_v3", "model_type": "llama"}',
            'the key "model_type" appears twice',
        ),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ],
    ids=[
        "empty",
        "broken",
        "trailing comma",
        "list",
        "string",
        "null",
        "number",
        "UTF-16",
        "BOM",
        "duplicate key",
        "deep",
    ],
)
def test_a_file_that_is_no_config(content, fragment, tmp_path, capsys):
    init_refused(capsys, tmp_path, content, fragment)


def test_a_value_nested_deeply_is_shown_short(tmp_path, capsys):
    """Nested well past what a message shows, and within what JSON parses in any thread (a
    pytest-xdist worker has less of the stack left than the main thread)."""
    config = {key: value for key, value in DEEPSEEK_V3.items() if key != "n_shared_experts"}
    text = json.dumps(config)[:-1] + ', "n_shared_experts": ' + "[" * 200 + "]" * 200 + "}"
    err = init_refused(capsys, tmp_path, text, "n_shared_experts = [[[[[...]]]]]: is a list")
    assert len(err) < 300


def test_a_folder_without_config_json(tmp_path, capsys):
    (tmp_path / "model.safetensors").write_bytes(b"")
    code, out, err = cli(capsys, "init", "--from-hf", tmp_path)
    assert_refused(code, out, err, f"{tmp_path}: --from-hf: is a folder without a config.json")


def test_a_folder_with_config_json(tmp_path, capsys):
    write_config(tmp_path, DEEPSEEK_V3)
    code, out, _ = cli(capsys, "init", "--from-hf", tmp_path)
    assert code == 0 and 'name = "deepseek_v3"' in out


def test_values_are_copied_as_written(tmp_path, capsys):
    """false stays false, 1 stays 1, a v2 default fills only what is absent."""
    config = {**DEEPSEEK_V2_LITE, "norm_topk_prob": False, "n_group": 1, "topk_group": 1}
    spec_path = tmp_path / "spec.toml"
    assert cli(capsys, "init", "--from-hf", write_config(tmp_path, config), "-o", spec_path)[0] == 0
    router = load_spec(spec_path).spec.router
    assert (router.norm_topk_prob, router.n_group, router.topk_group) == (False, 1, 1)


def test_a_set_key_replaces_a_wrong_value(tmp_path, capsys):
    config = {**DEEPSEEK_V3, "hidden_size": "7168", "torch_dtype": "float8_e4m3fn"}
    spec_path = tmp_path / "spec.toml"
    argv = ["init", "--from-hf", write_config(tmp_path, config), "-o", spec_path]
    argv += ["--set", "model.hidden_size=7168", "--set", "target.dtype=bfloat16"]
    code, _, err = cli(capsys, *argv)
    assert (code, err) == (0, "")
    assert load_spec(spec_path).spec.model.hidden_size == 7168
