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
from test_hf_more_families import _checkpoint, summed_terms
from test_integration_families import _block_bound

import moec
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


IMAGE_TEXT = ("kimi_k25", "qwen3_vl_moe")


def _model_class(model_type: str):
    import transformers

    if model_type == "qwen3_omni_moe_thinker":
        return transformers.Qwen3OmniMoeThinkerForConditionalGeneration
    if model_type in IMAGE_TEXT:
        return transformers.AutoModelForImageTextToText
    return transformers.AutoModelForCausalLM


def _build(model_class, config):
    """The model of `config` (the Qwen3-Omni thinker's class has no from_config)."""
    if hasattr(model_class, "from_config"):
        return model_class.from_config(config, dtype=torch.float32)
    return model_class._from_config(config, dtype=torch.float32)


def _config(keys: dict):
    from transformers import AutoConfig

    keys = dict(keys)
    return AutoConfig.for_model(keys.pop("model_type"), **keys)


def save(keys: dict, folder, left_out=()) -> None:
    """The tiny model, every MoE tensor random (as hf_oracle.save_model), saved; `left_out`
    taken out of its config.json (of text_config's, for a wrapper)."""
    config = _config(keys)
    torch.manual_seed(0)
    model = _build(_model_class(config.model_type), config)
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


# --- model types of transformers that were refused as "not checked", now computed ---------
#
# Param2 (Glm4MoeMoE under its own model type), Qwen3-MoE's block in Qwen3-VL-MoE's text model
# (through text_config) and in Qwen3-Omni-MoE's thinker (through its text_config), a top-k
# router with a shared expert added in full: Cohere2-MoE (softmax of the top-k logits, or their
# sigmoid), Flint (sigmoid) and Lara-Mini (softmax), whose shared expert is sized apart
# (shared_expert_intermediate_size, a multiple of moe_intermediate_size: that many shared
# experts) and named shared_expert (patch_model reads it as shared_experts); Inkling-2 and its
# looped variant (sigmoid noaux_tc, ungrouped, scaled by route_scale; the experts' softcapped
# SwiGLU is moec's situ), MiniMax-M3's text model (sigmoid noaux_tc, a shared expert of
# shared_intermediate_size whose fused gate_up_proj patch_model splits, GPT-OSS's clamped SwiGLU:
# moec's oai_swiglu); dots3 and Laguna (DeepSeek-V3's router; shared experts sized apart: that
# refusal is now by key, where their width is no multiple of moe_intermediate_size).

_DIMS = dict(
    vocab_size=64,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=2,
    max_position_embeddings=64,
    num_experts_per_tok=2,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
    head_dim=32,
)
_QWEN3_TEXT = dict(
    **_DIMS,
    intermediate_size=96,
    moe_intermediate_size=32,
    num_experts=8,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 6, 6]},
)
_QWEN3_VISION = dict(
    depth=1,
    hidden_size=32,
    intermediate_size=32,
    num_heads=2,
    out_hidden_size=64,
    patch_size=16,
    spatial_merge_size=2,
    deepstack_visual_indexes=[0],
)
_OMNI_AUDIO = dict(
    num_mel_bins=16,
    encoder_layers=1,
    encoder_attention_heads=2,
    encoder_ffn_dim=32,
    d_model=32,
    output_dim=64,
    n_window=4,
    downsample_hidden_size=16,
)
_COHERE = dict(
    **_DIMS,
    intermediate_size=32,
    prefix_dense_intermediate_size=96,
    num_experts=8,
    mlp_layer_types=["dense", "sparse"],
)
_SHARED_APART = dict(**_DIMS, intermediate_size=96, moe_intermediate_size=32, num_experts=8)
_INKLING2 = dict(  # softcaps inside the pre-activations' range (about N(0, 1)): they act
    **{**_DIMS, "num_hidden_layers": 3},
    unpadded_vocab_size=64,
    swa_num_attention_heads=2,
    swa_num_key_value_heads=2,
    swa_head_dim=32,
    sliding_window_size=8,
    d_rel=8,
    rel_extent=16,
    moe_intermediate_size=32,
    n_routed_experts=8,
    route_scale=2.0,
    mlp_gate_softcap=1.0,
    mlp_up_softcap=1.5,
    n_layers_per_attn_res_block=1,
)
NEW_TYPES = {
    "param2moe": dict(
        **_DIMS,
        model_type="param2moe",
        intermediate_size=96,
        moe_intermediate_size=32,
        num_experts=8,
        num_shared_experts=2,
        n_group=2,
        topk_group=1,
    ),
    "qwen3_vl_moe": dict(
        model_type="qwen3_vl_moe", text_config=_QWEN3_TEXT, vision_config=_QWEN3_VISION
    ),
    "qwen3_omni_moe_thinker": dict(
        model_type="qwen3_omni_moe_thinker",
        text_config={**_QWEN3_TEXT, "norm_topk_prob": False},
        vision_config=_QWEN3_VISION,
        audio_config=_OMNI_AUDIO,
    ),
    "cohere2_moe softmax": dict(**_COHERE, model_type="cohere2_moe", norm_topk_prob=False),
    "cohere2_moe sigmoid, shared experts summed": dict(
        **_COHERE,
        model_type="cohere2_moe",
        expert_selection_fn="sigmoid",
        num_shared_experts=2,
        shared_expert_combination_strategy="sum",
    ),
    "cohere2_moe sigmoid unnormalized": dict(
        **_COHERE,
        model_type="cohere2_moe",
        expert_selection_fn="sigmoid",
        norm_topk_prob=False,
        num_shared_experts=1,
        shared_expert_combination_strategy="sum",
    ),
    "flint": dict(  # its default mlp_only_layers: [0, 1]
        **{**_SHARED_APART, "num_hidden_layers": 3},
        model_type="flint",
        shared_expert_intermediate_size=64,
        mlp_only_layers=[0],
        norm_topk_prob=False,
    ),
    "inkling2_text": dict(**_INKLING2, model_type="inkling2_text"),
    "inkling2_loop_text": dict(
        **_INKLING2,
        model_type="inkling2_loop_text",
        loop_layer_index_start=1,
        loop_layer_index_end=2,
        loop_num_passes=2,
    ),
    "minimax_m3_vl_text": dict(  # swiglu_limit inside the pre-activations' range: it acts
        **_DIMS,
        model_type="minimax_m3_vl_text",
        intermediate_size=32,
        dense_intermediate_size=96,
        shared_intermediate_size=64,
        num_local_experts=8,
        rotary_dim=16,
        swiglu_limit=1.0,
        index_n_heads=2,
        index_head_dim=16,
        index_block_size=4,
        index_topk_blocks=2,
        mlp_layer_types=["dense", "sparse"],
    ),
    "laguna": dict(
        **_SHARED_APART,
        model_type="laguna",
        shared_expert_intermediate_size=64,
        moe_routed_scaling_factor=2.0,
        mlp_layer_types=["dense", "sparse"],
    ),
    "dots3_note_text": dict(
        **{**_SHARED_APART, "num_experts": None},
        model_type="dots3_note_text",
        n_routed_experts=8,
        shared_experts_intermediate_size=32,
        n_shared_experts=2,
        n_group=2,
        topk_group=1,
        routed_scaling_factor=2.0,
        mlp_layer_types=["dense", "sparse"],
    ),
    "lara_mini": dict(**_SHARED_APART, model_type="lara_mini", shared_expert_intermediate_size=32),
}


SHARED = {
    "param2moe": 2,
    "cohere2_moe sigmoid, shared experts summed": 2,
    "cohere2_moe sigmoid unnormalized": 1,
    "flint": 2,  # shared_expert_intermediate_size 64 over moe_intermediate_size 32
    "lara_mini": 1,
    "minimax_m3_vl_text": 2,
    "laguna": 2,
    "dots3_note_text": 2,  # 2 of 32 over 32
}
"""The spec's n_shared_experts of each model."""


@pytest.mark.parametrize("model", sorted(NEW_TYPES))
def test_model_types_once_not_checked_match_transformers(model, tmp_path, cache_dir):
    save(NEW_TYPES[model], tmp_path)
    spec = load_spec(hf_oracle.init_spec(tmp_path)).spec
    assert spec.model.n_shared_experts == SHARED.get(model, 0)
    if model.startswith("inkling2"):  # the softcapped SwiGLU: moec's situ
        assert (spec.activation.kind, spec.activation.beta) == ("situ", 1.0)
        assert (spec.activation.linear_beta, spec.router.routed_scaling_factor) == (1.5, 2.0)
    if model == "minimax_m3_vl_text":  # GPT-OSS's SwiGLU, clamped: moec's oai_swiglu
        assert (spec.activation.kind, spec.activation.limit) == ("oai_swiglu", 1.0)
    check_patched_model(tmp_path, cache_dir)
    check_saved_block(tmp_path, cache_dir)


def check_saved_block(folder, cache_dir) -> None:
    """load_weights from the file save_pretrained wrote, under the names transformers writes
    for this model (Laguna's bias under experts., Inkling-2's interleaved experts.w13_weight
    under model.llm.), with the spec check_patched_model took: the first MoE block as
    transformers' within the float32 bound."""
    reference = load(folder)
    name = hf_oracle.moe_names(reference)[0]
    source, prefix = _checkpoint(folder, name)
    spec = folder / "spec.toml"
    dims = load_spec(spec).spec.model
    layer = moec.load(spec, cache_dir=cache_dir).MoELayer(device="cpu").load_weights(source, prefix)
    x = torch.randn(11, dims.hidden_size, generator=torch.Generator().manual_seed(1))
    expected = hf_oracle.oracle(reference.get_submodule(name), x)
    error = (layer(x) - expected).abs().max().item()
    assert error <= _block_bound(dims) * expected.abs().max().item()


def test_cohere2_softmax_of_top_k_is_renormalized(tmp_path, capsys):
    """Cohere2-MoE's softmax of the top-k logits sums to 1 whatever norm_topk_prob says."""
    from test_spec_hf import init, write_config

    config = {**_COHERE, "model_type": "cohere2_moe", "norm_topk_prob": False}
    spec_path = tmp_path / "spec.toml"
    code, _, err = init(
        capsys, "--from-hf", str(write_config(tmp_path, config)), "-o", str(spec_path)
    )
    assert (code, err) == (0, "")
    router = load_spec(spec_path).spec.router
    assert (router.scoring_func, router.norm_topk_prob) == ("softmax", True)


def _refused(tmp_path, capsys, config) -> str:
    from test_spec_hf import init, write_config

    code, out, err = init(capsys, "--from-hf", str(write_config(tmp_path, config)))
    assert (code, out) == (2, "") and "Traceback" not in err
    return err


_ALL_DENSE = "leaves the model no MoE layer"


@pytest.mark.parametrize("model_type", ["nemo_speechlm", "nemotron_h_omni"])
def test_models_holding_a_nemotron_h_are_refused_by_name(model_type, tmp_path, capsys):
    """They fell through to "is not a DeepSeek-family MoE config"."""
    config = {"model_type": model_type, "text_config": {"model_type": "nemotron_h"}}
    err = _refused(tmp_path, capsys, config)
    assert f"an MoE moec does not compute: {model_type} holds a nemotron_h text model" in err
    assert "computes its experts as ungated MLPs" in err


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
        (
            {**_COHERE, "model_type": "cohere2_moe", "num_shared_experts": 1},
            'shared_expert_combination_strategy: absent, so transformers\' default "average", '
            "which adds the shared experts as (routed + shared) / 2",
        ),
        (
            {**_SHARED_APART, "model_type": "flint", "shared_expert_intermediate_size": 48},
            "shared_expert_intermediate_size = 48: is no multiple of moe_intermediate_size = 32",
        ),
        (
            {**_SHARED_APART, "model_type": "flint", "shared_expert_intermediate_size": 64},
            "mlp_only_layers: absent, so transformers' default, which leaves the model no MoE "
            "layer: with 2 layers, mlp_only_layers = [0, 1]",
        ),
        (
            {**_QWEN3_TEXT, "model_type": "qwen3_moe", "decoder_sparse_step": 4},
            "decoder_sparse_step = 4: leaves the model no MoE layer",
        ),
        (
            {**_INKLING2, "model_type": "inkling2_text", "scoring_func": "softplus"},
            'scoring_func = "softplus": scores the router logits with another activation',
        ),
        (
            {**_SHARED_APART, "model_type": "laguna", "moe_router_logit_softcapping": 30.0},
            "moe_router_logit_softcapping = 30.0: softcaps the router logits (a tanh) before",
        ),
        (
            {
                **_SHARED_APART,
                "model_type": "dots3_note_text",
                "shared_experts_intermediate_size": 48,
            },
            "shared_experts_intermediate_size = 48: is no multiple of moe_intermediate_size = 32",
        ),
        (
            {"model_type": "muse_spark_text", "hidden_size": 64},
            "projects its experts' input to moe_hidden_size and normalizes it (pre_expert_proj",
        ),
        (
            {"model_type": "nemo_speechlm", "text_config": {"model_type": "nemotron_h"}},
            "holds a nemotron_h text model (text_config), which computes its experts as ungated",
        ),
        (
            {"model_type": "qwen3_omni_moe", "thinker_config": {}},
            "holds two MoE text models, its thinker's",
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
        "cohere2_moe averaged shared experts",
        "flint shared expert no multiple",
        "flint all dense by default",
        "qwen3_moe sparse step past the layers",
        "inkling2 softplus scores",
        "laguna softcapped router logits",
        "dots3 shared experts no multiple",
        "muse_spark projected experts",
        "nemo_speechlm nemotron_h text model",
        "qwen3_omni_moe two MoE models",
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


@pytest.mark.parametrize("wrapper", ["inkling2", "inkling2_loop"])
def test_inkling2_vision_models_read_their_text_config(wrapper, tmp_path, capsys):
    """Inkling-2's vision-language models keep the MoE keys in text_config (its model type
    left out: transformers' text model of the wrapper); softcaps left out: 4 and 25."""
    from test_spec_hf import init, write_config

    text = {"hidden_size": 64, "moe_intermediate_size": 32, "n_routed_experts": 8}
    config = {"model_type": wrapper, "text_config": {**text, "num_experts_per_tok": 2}}
    spec_path = tmp_path / "spec.toml"
    code, _, err = init(
        capsys, "--from-hf", str(write_config(tmp_path, config)), "-o", str(spec_path)
    )
    assert (code, err) == (0, "")
    spec = load_spec(spec_path).spec
    assert (spec.activation.kind, spec.activation.beta, spec.activation.linear_beta) == (
        "situ",
        4.0,
        25.0,
    )
    assert (spec.router.topk_method, spec.router.routed_scaling_factor) == ("noaux_tc", 8.0)


def test_minimax_m3_reads_its_text_config_and_its_swiglu(tmp_path, capsys):
    """MiniMax-M3's released config writes hidden_act "swigluoai" (transformers reads silu and
    computes the SwiGLU from swiglu_alpha and swiglu_limit): not refused; the keys left out
    take transformers' defaults (1.702, 7.0, scaling 2.0, one shared expert)."""
    from test_spec_hf import init, write_config

    text = {"hidden_size": 64, "intermediate_size": 32, "num_local_experts": 8}
    text.update(num_experts_per_tok=2, hidden_act="swigluoai", shared_intermediate_size=32)
    config = {"model_type": "minimax_m3_vl", "text_config": text}
    spec_path = tmp_path / "spec.toml"
    code, _, err = init(
        capsys, "--from-hf", str(write_config(tmp_path, config)), "-o", str(spec_path)
    )
    assert (code, err) == (0, "")
    spec = load_spec(spec_path).spec
    assert (spec.activation.kind, spec.activation.alpha, spec.activation.limit) == (
        "oai_swiglu",
        1.702,
        7.0,
    )
    assert (spec.model.n_shared_experts, spec.router.routed_scaling_factor) == (1, 2.0)
