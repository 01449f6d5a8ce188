"""Config variants of the DeepSeek-style families end to end, and the configs that leave a model
no MoE layer, refused by key.

Each tiny random model (2-3 layers, a dense first layer where the config has one) is saved with
`save_pretrained`; `moec init --from-hf` reads its config.json (some with the optional keys
taken out, so transformers' defaults apply on both sides) and `patch_model` replaces every MoE
block of the model loaded back with that spec, warnings as errors.

Found wrong before this file: a config whose first_k_dense_replace reached num_hidden_layers
(or whose mlp_layer_types held no "sparse") got a spec, and patch_model then said only "has no
DeepSeek MoE block"; a DeepSeek-V2 config with topk_method "greedy" and n_group 4 was refused
("greedy top-k does not use expert groups") though transformers' router, as DeepSeek's, reads
the groups only for group_limited_greedy; topk_method "noaux_tc" on DeepSeek-V2 (which
transformers' router cannot compute) was refused as a scoring_func problem.

Tolerances, float32 (u = 2**-24), as in test_hf_more_families.py: logits within 2u N of the
largest logit, N bounding the terms of every sum from the first MoE block to a logit.
"""

from __future__ import annotations

import json
import warnings

import hf_oracle
import pytest
import torch
from test_hf_more_families import summed_terms

from moec.errors import MoecError
from moec.integrations.transformers import patch_model
from moec.spec import load_spec

U32 = 2.0**-24
TORCH = "experts.gemm_backend=torch"
_V3_MOE = dict(
    moe_intermediate_size=32,
    n_routed_experts=16,
    num_experts_per_tok=4,
    n_shared_experts=1,
    n_group=4,
    topk_group=2,
    norm_topk_prob=True,
    routed_scaling_factor=2.5,
)
_V32 = dict(index_topk=4, index_head_dim=16, index_n_heads=2)
_V2_DEFAULTS = ("topk_method", "n_group", "topk_group", "norm_topk_prob", "scoring_func")
_V2_DEFAULTS += ("routed_scaling_factor", "n_shared_experts", "moe_layer_freq")
_V3_DEFAULTS = ("n_group", "topk_group", "norm_topk_prob", "routed_scaling_factor")
_V3_DEFAULTS += ("n_shared_experts", "topk_method", "scoring_func")


def _mla(model_type: str, layers: int = 2, **keys) -> dict:
    """The config keys of a tiny multi-head-latent-attention model, layer 0 dense."""
    return {**hf_oracle._common(layers=layers), **_V3_MOE, "model_type": model_type, **keys}


def _glm4_moe(**keys) -> dict:
    common = {**hf_oracle._common(), "num_key_value_heads": 1, "head_dim": 32}
    return {**common, **_V3_MOE, "model_type": "glm4_moe", **keys}


def _kimi_k25(**keys) -> dict:
    text = _mla("kimi_k2", **keys)
    vision = dict(num_hidden_layers=1, hidden_size=32, intermediate_size=32, num_attention_heads=2)
    return dict(
        model_type="kimi_k25", text_config=text, vision_config=vision, projection_hidden_size=32
    )


VARIANTS = {
    "v3 norm_topk_prob false": (_mla("deepseek_v3", norm_topk_prob=False), ()),
    "v3 ungrouped, unscaled": (
        _mla("deepseek_v3", n_group=1, topk_group=1, routed_scaling_factor=1.0),
        (),
    ),
    "v3 no shared expert": (_mla("deepseek_v3", n_shared_experts=0), ()),
    "v3 two shared experts, every layer MoE": (
        _mla("deepseek_v3", n_shared_experts=2, first_k_dense_replace=0),
        (),
    ),
    # transformers' defaults on both sides: n_group 8, topk_group 4, scaling 2.5, one shared
    "v3 optional keys left out": (
        _mla("deepseek_v3", n_group=8, topk_group=4, n_shared_experts=1),
        _V3_DEFAULTS,
    ),
    "v2 greedy, its groups unused": (
        _mla("deepseek_v2", topk_method="greedy", norm_topk_prob=False, n_shared_experts=2),
        (),
    ),
    "v2 group_limited_greedy": (
        _mla("deepseek_v2", topk_method="group_limited_greedy", norm_topk_prob=False),
        (),
    ),
    "v2 group_limited_greedy, one group": (
        _mla(
            "deepseek_v2",
            topk_method="group_limited_greedy",
            n_group=1,
            topk_group=1,
            norm_topk_prob=False,
        ),
        (),
    ),
    # transformers' DeepseekV2 reads first_k_dense_replace only: every layer from 0 on is MoE
    "v2 moe_layer_freq 2": (
        _mla(
            "deepseek_v2",
            layers=3,
            topk_method="greedy",
            norm_topk_prob=False,
            moe_layer_freq=2,
            first_k_dense_replace=0,
        ),
        (),
    ),
    "v2 no shared expert, unscaled": (
        _mla(
            "deepseek_v2",
            topk_method="greedy",
            norm_topk_prob=False,
            n_shared_experts=0,
            routed_scaling_factor=1.0,
        ),
        (),
    ),
    # transformers' defaults: softmax, greedy, unnormalized, scaling 1.0, two shared experts
    "v2 optional keys left out": (
        _mla(
            "deepseek_v2",
            topk_method="greedy",
            n_group=None,
            topk_group=None,
            norm_topk_prob=False,
            routed_scaling_factor=1.0,
            n_shared_experts=2,
        ),
        _V2_DEFAULTS,
    ),
    "v32 norm_topk_prob false, ungrouped": (
        _mla("deepseek_v32", norm_topk_prob=False, n_group=1, topk_group=1, **_V32),
        (),
    ),
    "glm4_moe two shared experts, unnormalized, unscaled": (
        _glm4_moe(n_shared_experts=2, norm_topk_prob=False, routed_scaling_factor=1.0),
        (),
    ),
    "kimi_k25 ungrouped, unnormalized": (
        _kimi_k25(n_group=1, topk_group=1, norm_topk_prob=False),
        (),
    ),
}
"""id -> (the config's keys, the keys taken out of the saved config.json)."""


def _model_class(model_type: str):
    import transformers

    if model_type == "kimi_k25":
        return transformers.AutoModelForImageTextToText
    return transformers.AutoModelForCausalLM


def _config(keys: dict):
    from transformers import AutoConfig

    keys = dict(keys)
    return AutoConfig.for_model(keys.pop("model_type"), **keys)


def save(keys: dict, folder, left_out=()) -> None:
    """The tiny model, every MoE tensor random (as hf_oracle.save_model), saved; `left_out`
    taken out of its config.json (of text_config's, for a wrapper)."""
    config = _config(keys)
    torch.manual_seed(0)
    model = _model_class(config.model_type).from_config(config, dtype=torch.float32)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, tensor in list(model.named_parameters()) + list(model.named_buffers()):
            if ".mlp." in name and tensor.is_floating_point() and tensor.numel():
                fan_in = tensor.shape[-1] if tensor.dim() > 1 else 1
                scale = 1.0 / fan_in**0.5 if tensor.dim() > 1 else 0.05
                tensor.copy_(torch.randn(tensor.shape, generator=generator) * scale)
    model.eval().save_pretrained(folder)
    if left_out:
        path = folder / "config.json"
        written = json.loads(path.read_text())
        holder = written.get("text_config", written)
        for key in left_out:
            holder.pop(key, None)
        path.write_text(json.dumps(written))


def load(folder):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(folder)
    return _model_class(config.model_type).from_pretrained(folder, dtype=torch.float32).eval()


def check_patched_model(folder, cache_dir, *init_args: str) -> str:
    """init on config.json, patch_model with that spec (warnings as errors) on the model loaded
    back: every MoE block replaced, logits within the float32 bound. Returns the spec's text."""
    spec = hf_oracle.init_spec(folder, "--set", TORCH, *init_args)
    reference, model = load(folder), load(folder)
    names = hf_oracle.moe_names(model)
    assert names
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        patch_model(model, spec, cache_dir=cache_dir)
    assert {type(model.get_submodule(name)).__name__ for name in names} == {"MoecMoE"}
    tokens = hf_oracle.tokens(3)
    with torch.no_grad():
        expected, logits = reference(input_ids=tokens).logits, model(input_ids=tokens).logits
    dims = load_spec(spec).spec.model
    bound = 2 * U32 * summed_terms(model, dims, names[0], tokens.shape[1])
    assert (logits - expected).abs().max().item() <= bound * expected.abs().max().item()
    return open(spec).read()


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_config_variants_match_transformers(variant, tmp_path, cache_dir):
    keys, left_out = VARIANTS[variant]
    save(keys, tmp_path, left_out)
    text = check_patched_model(tmp_path, cache_dir)
    if variant == "v2 greedy, its groups unused":  # n_group 4, topk_group 2 in the config
        assert "# n_group = 4 and topk_group = 2 are not followed" in text
        assert load_spec(tmp_path / "spec.toml").spec.router.n_group == 1


def _refused(tmp_path, capsys, config) -> str:
    from test_spec_hf import init, write_config

    code, out, err = init(capsys, "--from-hf", str(write_config(tmp_path, config)))
    assert (code, out) == (2, "") and "Traceback" not in err
    return err


_ALL_DENSE = "leaves the model no MoE layer"


@pytest.mark.parametrize(
    ("config", "fragment"),
    [
        (
            _mla("deepseek_v3", layers=3, first_k_dense_replace=3),
            f"first_k_dense_replace = 3: {_ALL_DENSE}: the first 3 layers are dense, and the "
            "model has num_hidden_layers = 3",
        ),
        (  # transformers' DeepseekV3Config default: first_k_dense_replace 3
            {
                key: value
                for key, value in _mla("deepseek_v3", layers=3).items()
                if key != "first_k_dense_replace"
            },
            f"first_k_dense_replace: absent, so transformers' default 3, which {_ALL_DENSE}",
        ),
        (
            {**_mla("deepseek_v32", **_V32), "mlp_layer_types": ["dense", "dense"]},
            f'mlp_layer_types = ["dense", "dense"]: {_ALL_DENSE}: no layer is "sparse"',
        ),
        (
            _glm4_moe(first_k_dense_replace=5),
            f"first_k_dense_replace = 5: {_ALL_DENSE}: the first 5 layers are dense",
        ),
        (
            _kimi_k25(first_k_dense_replace=2),
            f"text_config.first_k_dense_replace = 2: {_ALL_DENSE}",
        ),
        (
            _mla("deepseek_v2", topk_method="noaux_tc"),
            'topk_method = "noaux_tc": is none of the two ways DeepSeek-V2\'s router chooses',
        ),
        (
            _mla("deepseek_v3", hidden_act="gelu"),
            'hidden_act = "gelu": is not a gated activation moec knows',
        ),
    ],
    ids=[
        "v3 all dense",
        "v3 all dense by default",
        "v32 all dense",
        "glm4_moe all dense",
        "kimi_k25 all dense",
        "v2 noaux_tc",
        "v3 gelu",
    ],
)
def test_configs_moec_does_not_compute_are_refused_by_key(config, fragment, tmp_path, capsys):
    assert fragment in _refused(tmp_path, capsys, config)


def test_patch_model_says_which_key_leaves_no_moe_layer():
    """patch_model on a model without MoE blocks said only "has no DeepSeek MoE block"; now it
    also names the config key that leaves none."""
    from transformers import AutoModelForCausalLM

    config = _config(_mla("deepseek_v3", layers=2, first_k_dense_replace=2))
    with pytest.raises(MoecError) as error:
        patch_model(AutoModelForCausalLM.from_config(config))
    report = error.value.report()
    assert "model: has no DeepSeek MoE block to replace" in report
    assert f"model.config.first_k_dense_replace = 2: {_ALL_DENSE}" in report
