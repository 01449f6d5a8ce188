"""What a third differential fuzzer of `moec init --from-hf` against transformers 5.25 found, one
test per bug (each config its minimal reproducer).

Found wrong before this file:
- A swiglu_limit of 0 where the block clamps (DeepSeek-V4's, GLM-5-Next's) got a spec of plain
  silu and no word of it: transformers' block clamps at 0 and its experts output 0. init now
  refuses it as patch_model does, naming the key; `--set activation.kind=silu` takes no clamp.
- A config whose model has no decoder layer (num_hidden_layers = 0) got a spec where every layer
  is MoE (DeepSeek-V4, Hunyuan, MiniMax-M2); one with a count of layers that is no count (a
  string, a float, a boolean, a negative number in num_hidden_layers, first_k_dense_replace or
  num_dense_layers, which transformers' strict config classes refuse) was read as the default.
- DeepSeek-V4's mlp_layer_types with fewer entries than num_hidden_layers (transformers'
  validate_layer_type refuses it) was read as far as it went.
- A composite model (Kimi-K2.5) took text_config's dtype where the outer config writes another,
  which from_pretrained's dtype "auto" loads the weights in.
"""

from __future__ import annotations

import hf_oracle
import pytest
from test_hf_families5 import _config, _mla
from test_hf_more_families import CONFIGS
from test_spec_hf import init, write_config

from moec.spec.loader import load_spec


def _v4(**keys) -> dict:
    return {**hf_oracle.deepseek_v4(layers=2).to_dict(), **keys}


def _family(model_type: str, **keys) -> dict:
    return {**CONFIGS[model_type], "model_type": model_type, **keys}


def _glm5_next_text(**keys) -> dict:
    return {**CONFIGS["glm5_next"]["text_config"], "model_type": "glm5_next_text", **keys}


def _refused(tmp_path, capsys, config) -> str:
    spec = tmp_path / "spec.toml"
    code, out, err = init(capsys, "--from-hf", str(write_config(tmp_path, config)), "-o", str(spec))
    assert (code, out) == (2, "") and "Traceback" not in err
    assert not spec.exists()
    return err


def _accepted(tmp_path, capsys, config, *more: str):
    spec = tmp_path / "spec.toml"
    args = ("--from-hf", str(write_config(tmp_path, config)), "-o", str(spec), *more)
    code, _, err = init(capsys, *args)
    assert code == 0, err
    return load_spec(spec).spec


# --- a clamp at 0 ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "key"),
    [(_v4(swiglu_limit=0.0), "swiglu_limit"), (_glm5_next_text(swiglu_limit=0.0), "swiglu_limit")],
    ids=["deepseek_v4", "glm5_next_text"],
)
def test_a_clamp_at_zero_is_refused_as_patch_model_refuses_it(config, key, tmp_path, capsys):
    """transformers' block clamps gate and up at 0 (its experts output 0); moec reads 0 as no
    clamp, so the spec would be silently another layer."""
    _config(config)  # transformers builds it
    err = _refused(tmp_path, capsys, config)
    assert f"{key} = {config[key]!r}: makes transformers' {config['model_type']} MoE block" in err
    assert "--set activation.kind=silu" in err
    spec = _accepted(tmp_path, capsys, config, "--set", "activation.kind=silu")
    assert spec.activation.kind == "silu"


def test_a_positive_clamp_is_still_read(tmp_path, capsys):
    spec = _accepted(tmp_path, capsys, _v4(swiglu_limit=0.5))
    assert (spec.activation.kind, spec.activation.swiglu_limit) == ("silu_clamped", 0.5)


# --- counts of layers -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "config",
    [
        _v4(num_hidden_layers=0, mlp_layer_types=[]),
        _family("hunyuan_v1_moe"),
        _family("minimax_m2"),
    ],
    ids=["deepseek_v4", "hunyuan_v1_moe", "minimax_m2"],
)
def test_a_model_without_layers_is_refused(config, tmp_path, capsys):
    config = {**config, "num_hidden_layers": 0}
    err = _refused(tmp_path, capsys, config)
    assert "num_hidden_layers = 0: leaves the model no MoE layer" in err
    assert err.count("\n") == 1, err  # that one problem


@pytest.mark.parametrize(
    ("keys", "shown", "why"),
    [
        ({"first_k_dense_replace": "1"}, 'first_k_dense_replace = "1"', "is a string"),
        ({"first_k_dense_replace": 1.5}, "first_k_dense_replace = 1.5", "is a number"),
        ({"first_k_dense_replace": True}, "first_k_dense_replace = true", "is a boolean"),
        ({"first_k_dense_replace": -1}, "first_k_dense_replace = -1", "is negative"),
        ({"num_hidden_layers": -2}, "num_hidden_layers = -2", "is negative"),
        ({"num_hidden_layers": [2]}, "num_hidden_layers = [2]", "is a list"),
    ],
)
def test_a_count_of_layers_that_is_no_count_is_refused(keys, shown, why, tmp_path, capsys):
    err = _refused(tmp_path, capsys, _mla("deepseek_v3", **keys))
    assert f"{shown}: {why}" in err
    assert err.count("\n") == 1, err


def test_afmoe_num_dense_layers_of_another_type_is_refused(tmp_path, capsys):
    err = _refused(tmp_path, capsys, _family("afmoe", num_dense_layers=[]))
    assert "num_dense_layers = []: is a list, not an integer" in err


def test_deepseek_v4_num_hidden_layers_of_another_type_is_one_problem(tmp_path, capsys):
    err = _refused(tmp_path, capsys, _v4(num_hidden_layers="2"))
    assert err.count("\n") == 1 and 'num_hidden_layers = "2": is a string' in err


@pytest.mark.parametrize("types", [[], ["moe"]])
def test_deepseek_v4_layer_types_fewer_than_its_layers_are_refused(types, tmp_path, capsys):
    config = _v4(mlp_layer_types=types)
    with pytest.raises(Exception, match="must equal `len.mlp_layer_types.`"):
        _config(config)  # transformers refuses it too
    err = _refused(tmp_path, capsys, config)
    assert f"has {len(types)} entries, fewer than the model's num_hidden_layers = 2" in err


def test_deepseek_v4_layer_types_past_its_layers_are_cut_as_transformers_cuts_them(
    tmp_path, capsys
):
    """transformers keeps the first num_hidden_layers entries: the third is no layer."""
    config = _v4(mlp_layer_types=["moe", "moe", "hash_moe"])
    assert _config(config).mlp_layer_types == ["moe", "moe"]
    spec = _accepted(tmp_path, capsys, config)
    assert spec.router.topk_method != "hash"


# --- a composite model's dtype --------------------------------------------------------------


def test_a_composite_models_dtype_is_the_outer_configs(tmp_path, capsys):
    """from_pretrained's dtype "auto" reads the outer config's dtype: a Kimi-K2.5 made in fp32,
    cast to bf16 and saved writes dtype bfloat16 outside and float32 in text_config, and its
    weights load as bf16."""
    from test_spec_hf_families import KIMI_K25

    config = {**KIMI_K25, "dtype": "bfloat16", "text_config": {**KIMI_K25["text_config"]}}
    config.pop("torch_dtype")
    config["text_config"]["dtype"] = "float32"
    assert _accepted(tmp_path, capsys, config).target.dtype == "bfloat16"
    config.pop("dtype")  # then the text model's
    assert _accepted(tmp_path, capsys, config).target.dtype == "float32"
