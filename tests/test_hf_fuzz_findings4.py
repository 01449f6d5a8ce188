"""What a fourth differential fuzzer (DeepSeek-V4, V3.2, GLM-4.5 and Kimi-K2.5 tiny models
against transformers 5.25, both backends, patch_model with generate) found, one test per bug.

Found wrong before this file:
- A DeepSeek-V3.2 (or any model reading `mlp_layer_types` first) list with an entry other than
  "dense" and "sparse", or with another length than num_hidden_layers, got a spec: transformers'
  validate_layer_type refuses both, so there is no model to compute the same as.
- A DeepSeek-V4 config scoring with "softmax" got a spec of its hash layers: V4's routers score
  with the activation scoring_func names (ACT2FN), softmax is none, and transformers builds no
  layer of that config.
"""

from __future__ import annotations

import pytest
from test_hf_families5 import _V32, _mla
from test_hf_fuzz_findings3 import _accepted, _refused, _v4
from test_spec_hf import init, write_config


@pytest.mark.parametrize(
    ("types", "message"),
    [
        (["dense", "moe"], 'has the entry "moe", which transformers refuses'),
        (["dense", True], "has the entry true, which transformers refuses"),
        (["sparse", "sparse", "dense"], "has 3 entries and the model num_hidden_layers = 2"),
        (["sparse"], "has 1 entries and the model num_hidden_layers = 2"),
        ("sparse", "is not a list"),
    ],
)
def test_deepseek_v32_layer_types_transformers_refuses_are_refused(
    types, message, tmp_path, capsys
):
    err = _refused(tmp_path, capsys, {**_mla("deepseek_v32", **_V32), "mlp_layer_types": types})
    assert "mlp_layer_types = " in err and message in err


def test_deepseek_v32_layer_types_one_per_layer_are_read(tmp_path, capsys):
    config = {**_mla("deepseek_v32", **_V32), "mlp_layer_types": ["dense", "sparse"]}
    assert _accepted(tmp_path, capsys, config).router.topk_method == "noaux_tc"


@pytest.mark.parametrize("layer_type", ["moe", "hash_moe"])
def test_deepseek_v4_softmax_scoring_is_refused_for_both_layer_types(layer_type, tmp_path, capsys):
    config = _v4(scoring_func="softmax", mlp_layer_types=["hash_moe", "moe"])
    spec = tmp_path / "spec.toml"
    path = str(write_config(tmp_path, config))
    code, _, err = init(capsys, "--from-hf", path, "--layer-type", layer_type, "-o", str(spec))
    assert code == 2 and "Traceback" not in err and not spec.exists()
    assert 'scoring_func = "softmax": is no activation, and deepseek_v4\'s router scores' in err


def test_deepseek_v4_sigmoid_scoring_is_read(tmp_path, capsys):
    config = _v4(scoring_func="sigmoid")
    assert _accepted(tmp_path, capsys, config).router.scoring_func == "sigmoid"


def test_v4_fp4_experts_without_shared_experts_get_no_shared_scheme(tmp_path, capsys):
    """A DeepSeek-V4 fp4 config with n_shared_experts = 0, followed as init's comment offers
    (--set model.n_shared_experts=0): init wrote the fp8 shared scheme of its fp4 experts and
    then refused it (no shared experts to quantize). It now writes none; a --set one stays."""
    fp4 = {  # fp8 128x128 shared experts: 128 wide
        "hidden_size": 256,
        "moe_intermediate_size": 128,
        "n_shared_experts": 0,
        "expert_dtype": "fp4",
        "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]},
    }
    follow = ("--set", "model.n_shared_experts=0")
    spec = _accepted(tmp_path, capsys, _v4(**fp4), *follow)
    assert spec.quant.scheme == "mxfp4" and spec.quant.shared_scheme is None
    assert spec.model.n_shared_experts == 0
    kept = _accepted(tmp_path, capsys, _v4(**fp4)).quant  # the block's one shared expert
    assert kept.shared_scheme == "fp8_block"
    err = _refused_with(tmp_path, capsys, _v4(**fp4), *follow, "--set", "quant.shared_scheme=bf16")
    assert 'quant.shared_scheme = "bf16": there are no shared experts to quantize' in err


def _refused_with(tmp_path, capsys, config, *more: str) -> str:
    spec = tmp_path / "refused.toml"
    args = ("--from-hf", str(write_config(tmp_path, config)), "-o", str(spec), *more)
    code, out, err = init(capsys, *args)
    assert (code, out) == (2, "") and "Traceback" not in err
    return err
