"""The softmax top-k MoE model types of transformers (Mixtral, Qwen3-MoE, OLMoE) and two more
copies of DeepSeek-V3's block (MiniCPM-5, Beam) end to end against transformers' own block, and
the other MoE model types refused by name, each with the reason (they fell through to "is not a DeepSeek-family MoE config", or patch_model's "has no
DeepSeek MoE block").

Each tiny random model is saved with `save_pretrained` (every MoE tensor random, as in
tests/hf_oracle.py); `moec init --from-hf` reads its config.json, the layer's `load_weights`
its safetensors (Mixtral's under block_sparse_moe.experts.<e>.w1/w2/w3, as transformers writes
them), and `patch_model` replaces every MoE block of the model loaded back.

Tolerances, float32 (u = 2**-24), as in test_hf_more_families.py: one block, 2u (H + I + K +
S) of its largest output; logits, 2u N of the largest logit (`summed_terms`).
"""

from __future__ import annotations

import re

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
_DIMS = dict(
    vocab_size=64,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=2,
    max_position_embeddings=64,
    num_experts_per_tok=2,
)


def _mixtral():
    from transformers import MixtralConfig

    return MixtralConfig(**_DIMS, intermediate_size=32, num_local_experts=8)


def _qwen3_moe():
    """Renormalized (norm_topk_prob), layer 0 dense (mlp_only_layers)."""
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(
        **_DIMS,
        head_dim=32,
        intermediate_size=96,
        moe_intermediate_size=32,
        num_experts=8,
        norm_topk_prob=True,
        mlp_only_layers=[0],
    )


def _olmoe():
    """The top-k weights left unnormalized (norm_topk_prob false, OLMoE's default)."""
    from transformers import OlmoeConfig

    return OlmoeConfig(**_DIMS, intermediate_size=32, num_experts=8)


_IDS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)
_V3_COPY = dict(**_DIMS, **_IDS, head_dim=32, intermediate_size=96, moe_intermediate_size=32)


def _minicpm5_moe():
    """DeepSeek-V3's block: grouped noaux_tc, one shared expert, layer 0 dense."""
    from transformers import MiniCPM5MoeConfig

    return MiniCPM5MoeConfig(
        **_V3_COPY, n_routed_experts=8, n_group=4, topk_group=2, first_k_dense_replace=1
    )


def _beam():
    """DeepSeek-V3's router without a shared expert, the experts' sum scaled (2.5)."""
    from transformers import BeamConfig

    return BeamConfig(
        **_V3_COPY, num_experts=8, n_group=4, topk_group=2, mlp_layer_types=["dense", "sparse"]
    )


MODELS = {
    "mixtral": _mixtral,
    "qwen3_moe": _qwen3_moe,
    "olmoe": _olmoe,
    "minicpm5_moe": _minicpm5_moe,
    "beam": _beam,
}


@pytest.fixture(scope="module", params=sorted(MODELS))
def saved(request, tmp_path_factory):
    return hf_oracle.saved_folder(tmp_path_factory, request.param, MODELS[request.param]())


def _load(folder):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def test_init_load_weights_and_patch_model_give_transformers(saved, cache_dir):
    """init on config.json, load_weights from model.safetensors: one block as transformers';
    patch_model on the whole model: logits within the float32 bound, the same greedy tokens."""
    reference = _load(saved)
    spec = hf_oracle.init_spec(saved, "--set", TORCH)
    dims = load_spec(spec).spec.model
    names = hf_oracle.moe_names(reference)
    source, prefix = _checkpoint(saved, names[0])
    layer = moec.load(spec, cache_dir=cache_dir).MoELayer(device="cpu").load_weights(source, prefix)
    x = torch.randn(11, dims.hidden_size, generator=torch.Generator().manual_seed(1))
    expected = hf_oracle.oracle(reference.get_submodule(names[0]), x)
    error = (layer(x) - expected).abs().max().item()
    assert error <= _block_bound(dims) * expected.abs().max().item()

    model = _load(saved)
    patch_model(model, overrides=[TORCH], cache_dir=cache_dir)
    assert {type(model.get_submodule(name)).__name__ for name in names} == {"MoecMoE"}
    tokens = hf_oracle.tokens(3)
    with torch.no_grad():
        expected, logits = reference(input_ids=tokens).logits, model(input_ids=tokens).logits
    bound = 2 * U32 * summed_terms(model, dims, names[0], tokens.shape[1])
    assert (logits - expected).abs().max().item() <= bound * expected.abs().max().item()
    kwargs = dict(attention_mask=torch.ones_like(tokens), max_new_tokens=3, do_sample=False)
    assert torch.equal(model.generate(tokens, **kwargs), reference.generate(tokens, **kwargs))


def test_keys_a_top_k_router_does_not_read_are_not_followed(tmp_path, capsys):
    """Mixtral always renormalizes and has no shared expert or groups: DeepSeek's keys in its
    config.json (which transformers' MixtralTopKRouter never reads) change nothing."""
    from test_spec_hf import init, write_config

    config = {
        "model_type": "mixtral",
        "hidden_size": 64,
        "intermediate_size": 32,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "norm_topk_prob": False,
        "n_shared_experts": 2,
        "n_group": 4,
        "scoring_func": "sigmoid",
    }
    spec_path = tmp_path / "spec.toml"
    code, _, err = init(
        capsys, "--from-hf", str(write_config(tmp_path, config)), "-o", str(spec_path)
    )
    assert (code, err) == (0, "")
    spec = load_spec(spec_path).spec
    assert (spec.model.n_routed_experts, spec.model.moe_intermediate_size) == (8, 32)
    assert spec.model.n_shared_experts == 0
    assert (spec.router.scoring_func, spec.router.topk_method) == ("softmax", "greedy")
    assert (spec.router.norm_topk_prob, spec.router.n_group) == (True, 1)


REFUSED = {
    "qwen2_moe": "shared_expert_gate",
    "qwen3_next": "shared_expert_gate",
    "qwen3_5_moe": "shared_expert_gate",
    "llama4_text": "sigmoid of the router logit",
    "gpt_oss": "swiglu_alpha",
    "phimoe": "sparsemixer",
    "dbrx": "moe_normalize_expert_weights",
    "jetmoe": "JetMoeMoA",
    "switch_transformers": "expert_capacity",
    # lfm2_moe, granitemoe, jamba, qwen3_vl_moe: computed; Qwen3-Omni's thinker too
    "qwen3_omni_moe": "holds two MoE text models",
}


@pytest.mark.parametrize("model_type", sorted(REFUSED))
def test_other_moe_model_types_are_refused_by_name(model_type, tmp_path, capsys):
    from test_spec_hf import init, write_config

    config = {"model_type": model_type, "hidden_size": 64, "num_experts_per_tok": 2}
    config_path = write_config(tmp_path, config)
    code, out, err = init(capsys, "--from-hf", str(config_path))
    assert (code, out) == (2, "")
    assert "Traceback" not in err and "DeepSeek-family" not in err
    assert f"model_type = {model_type!r}".replace("'", '"') in err
    assert f"an MoE moec does not compute: {model_type} " in err
    assert REFUSED[model_type] in err


def test_patch_model_names_why_a_qwen2_moe_is_refused():
    """A Qwen2-MoE's block is not replaced: the error says why, before anything changes."""
    from transformers import AutoModelForCausalLM, Qwen2MoeConfig

    config = Qwen2MoeConfig(
        **_DIMS,
        intermediate_size=96,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
        num_experts=8,
    )
    model = AutoModelForCausalLM.from_config(config)
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    with pytest.raises(MoecError, match="qwen2_moe.*shared_expert_gate"):
        patch_model(model)
    after = model.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[name], after[name]) for name in before)


def test_patch_model_follows_a_block_that_ignores_swiglu_limit(tmp_path, cache_dir):
    """A DeepSeek-V3 config.json that carries swiglu_limit: transformers' DeepseekV3MoE never
    clamps, so the patched model does not either (it clamped, logits half off), and says so."""
    from transformers import AutoModelForCausalLM

    from moec.integrations.transformers import RouterKeysIgnored

    config = hf_oracle.deepseek_v3()
    config.swiglu_limit = 1.0  # inside the pre-activations' range: a clamp would act
    hf_oracle.save_model(config, tmp_path)
    reference, model = (
        AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval() for _ in "ab"
    )
    with pytest.warns(RouterKeysIgnored, match="swiglu_limit = 1.0 in the config, but "):
        patch_model(model, overrides=[TORCH], cache_dir=cache_dir)
    tokens = hf_oracle.tokens(3)
    with torch.no_grad():
        expected, logits = reference(input_ids=tokens).logits, model(input_ids=tokens).logits
    # a spec that clamps, as SGLang's runner does with this config (init's own spec follows
    # the block since tests/test_hf_families4.py: silu)
    clamped = ["--set", "activation.kind=silu_clamped", "--set", "activation.swiglu_limit=1.0"]
    spec = hf_oracle.init_spec(tmp_path, "--set", TORCH, *clamped)
    first = hf_oracle.moe_names(reference)[0]
    bound = 2 * U32 * summed_terms(model, load_spec(spec).spec.model, first, tokens.shape[1])
    assert (logits - expected).abs().max().item() <= bound * expected.abs().max().item()

    fresh = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    message = (
        r'activation.kind = "silu_clamped": does not match the model: config.json has '
        r"swiglu_limit = 1.0, but transformers' DeepseekV3MoE ignores it and never clamps"
    )
    with pytest.raises(MoecError, match=message):
        patch_model(fresh, spec, cache_dir=cache_dir)
    assert type(fresh.get_submodule(first)).__name__ == "DeepseekV3MoE"  # left unchanged


@pytest.mark.parametrize("key", ["expert_swiglu_limit_list", "share_expert_swiglu_limit_list"])
def test_per_layer_swiglu_limits_are_refused_by_name(key, tmp_path, capsys):
    """Ling's (bailing_hybrid) per-layer clamps were dropped: the layer computed silu."""
    from test_spec_hf import init, write_config

    config = {
        "model_type": "bailing_hybrid",
        "hidden_size": 64,
        "moe_intermediate_size": 32,
        "num_experts": 8,
        "num_experts_per_token": 2,
        "num_expert_group": 1,
        "topk_group": 1,
        key: [0, 7.0],
    }
    code, out, err = init(capsys, "--from-hf", str(write_config(tmp_path, config)))
    assert (code, out) == (2, "") and "Traceback" not in err
    assert f"{key} = [0, 7.0]: clamps the SwiGLU with a limit per layer" in err
    zeros = {**config, key: [0, 0.0]}
    code, _, err = init(capsys, "--from-hf", str(write_config(tmp_path, zeros)))
    assert (code, err) == (0, "")


def test_a_model_asked_for_its_router_logits_is_refused_unchanged():
    """OLMoE with output_router_logits: after patching, transformers' auxiliary loss failed on
    the empty tuple of router logits (IndexError); now patch_model refuses first, by name."""
    from transformers import AutoModelForCausalLM, OlmoeConfig

    config = OlmoeConfig(**_DIMS, intermediate_size=32, num_experts=8, output_router_logits=True)
    model = AutoModelForCausalLM.from_config(config)
    with pytest.raises(MoecError, match=r"model.config.output_router_logits = true: asks for"):
        patch_model(model)
    names = hf_oracle.moe_names(model)
    assert {type(model.get_submodule(name)).__name__ for name in names} == {"OlmoeSparseMoeBlock"}


_NO_TEXT_MOE = re.compile(
    r".*_(vision|vision_model|vision_encoder|audio|audio_encoder|encoder)"
    r"|granite_docling(_text)?|qwen3_omni_moe_talker_code_predictor|vitpose_backbone"
)
"""Model types that share a modeling file with an MoE and hold no text MoE layer: vision and
audio encoders (Dots3-Note's and ViTPose's MoE are image encoders'), Granite-Docling (its
"router" picks a connector path) and Qwen3-Omni's code predictor (a dense MLP)."""
_MOE_CLASS = re.compile(
    r"^class \w*(Router|SparseMoeBlock|SparseMoEBlock|MoE|Moe|MoELayer)\(", re.M
)


def test_every_moe_model_type_of_transformers_is_computed_or_refused_by_name():
    """Each model type whose modeling file defines an MoE block or router is one init computes
    (hf_families) or refuses with the reason (hf_refused); none falls through to "is not a
    DeepSeek-family MoE config"."""
    from pathlib import Path

    import transformers
    from transformers.models.auto.configuration_auto import (
        CONFIG_MAPPING_NAMES,
        model_type_to_module_name,
    )

    from moec.spec import hf_families, hf_refused

    models = Path(transformers.__file__).parent / "models"
    with_moe = [
        model_type
        for model_type in sorted(CONFIG_MAPPING_NAMES)
        if not _NO_TEXT_MOE.fullmatch(model_type)
        and any(
            _MOE_CLASS.search(path.read_text())
            for path in (models / model_type_to_module_name(model_type)).glob("modeling_*.py")
        )
    ]
    named = set(hf_families.KNOWN_TYPES) | set(hf_refused.REFUSED_TYPES)
    assert "qwen2_moe" in with_moe and "deepseek_v3" in with_moe
    assert [model_type for model_type in with_moe if model_type not in named] == []


def test_a_clamp_at_zero_is_refused_where_transformers_clamps_at_zero():
    """DeepSeek-V4 with swiglu_limit 0: transformers' block clamps at 0 (its experts output 0),
    moec read 0 as no clamp and the patched model computed otherwise; now refused by name."""
    from transformers import AutoModelForCausalLM

    config = hf_oracle.deepseek_v4()
    config.swiglu_limit = 0.0
    model = AutoModelForCausalLM.from_config(config)
    with pytest.raises(MoecError, match=r"model.config.swiglu_limit = 0.0: makes transformers'"):
        patch_model(model)
    names = hf_oracle.moe_names(model)
    assert {type(model.get_submodule(name)).__name__ for name in names} == {
        "DeepseekV4SparseMoeBlock"
    }
