"""The newer DeepSeek-style MoE models end to end, each against transformers' own block:
DeepSeek-V3.2, GLM-4.5 (glm4_moe), Kimi-K2.5 (a DeepSeek-V3 in text_config), DeepSeek-V4's
routed layers, and DeepSeek-V2 configs whose routing keys transformers' router ignores.

A tiny random model of each (tests/hf_oracle.py) is saved with `save_pretrained`; `moec init
--from-hf` reads its config.json, `load_weights` its safetensors (under the names transformers
writes: DeepSeek's own for V4), and `patch_model` replaces every MoE block of a copy loaded back.

Tolerances, float32 (u = 2**-24), as in test_integration_transformers.py: one block, 2u (H + I
+ K + S) of its largest output; logits, 2u N of the largest logit, N the terms of every sum
from the first MoE block to a logit (`summed_terms`, per attention kind).
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import hf_oracle
import pytest
import torch

import moec
from moec.errors import MoecError
from moec.integrations.transformers import RouterKeysIgnored, patch_model

U32 = 2.0**-24
MODELS = {
    "deepseek_v32": hf_oracle.deepseek_v32,
    "glm4_moe": hf_oracle.glm4_moe,
    "kimi_k25": hf_oracle.kimi_k25,
    "deepseek_v4": hf_oracle.deepseek_v4,
}


@pytest.fixture(scope="module", params=sorted(MODELS))
def saved(request, tmp_path_factory):
    return hf_oracle.saved_folder(tmp_path_factory, request.param, MODELS[request.param]())


@pytest.fixture(scope="module")
def saved_v2_keys(tmp_path_factory):
    """A DeepSeek-V2 whose config asks for renormalized sigmoid scores: keys transformers'
    DeepseekV2 router ignores (it always takes the softmax, unnormalized)."""
    config = hf_oracle.deepseek_v2("greedy", layers=3, norm_topk_prob=True, scoring_func="sigmoid")
    return hf_oracle.saved_folder(tmp_path_factory, "v2_keys", config)


def _load(folder):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(folder)
    return hf_oracle.causal_lm_class(config).from_pretrained(folder, dtype=torch.float32).eval()


def _block_bound(config) -> float:
    shared = config.n_shared_experts
    return (
        2
        * U32
        * (config.hidden_size + config.moe_intermediate_size + shared + config.num_experts_per_tok)
    )


def summed_terms(config, seq_len: int) -> int:
    """Terms of all the sums from the first MoE block's input to a logit."""
    hidden = config.hidden_size
    moe = hidden + config.moe_intermediate_size + config.num_experts_per_tok + 1
    heads = config.num_attention_heads
    if config.model_type == "glm4_moe":  # grouped-query attention
        head = config.head_dim
        attention = 2 * hidden + head + 2 * seq_len + heads * head + hidden
    elif config.model_type == "deepseek_v4":
        # hyper-connections: mix hc_mult streams of H, Sinkhorn's row and column sums; attention:
        # norms, q_a / q_b / kv projections, scores, softmax over the window and the compressed
        # entries, the grouped output projection
        hc = config.hc_mult * hidden + 2 * config.hc_mult * config.hc_sinkhorn_iters
        head = config.head_dim
        attention = 3 * hidden + 2 * config.q_lora_rank + 2 * head + 4 * seq_len
        attention += heads * head // config.o_groups + config.o_groups * config.o_lora_rank
        return (
            2 * hc + moe + (config.num_hidden_layers - 1) * (4 * hc + attention + moe) + 2 * hidden
        )
    else:  # multi-head latent attention (V3.2, Kimi-K2.5's V3)
        attention = 3 * hidden + 2 * config.q_lora_rank + 2 * config.kv_lora_rank
        attention += config.qk_nope_head_dim + config.qk_rope_head_dim + 2 * seq_len
        attention += heads * config.v_head_dim + hidden
    later = config.num_hidden_layers - getattr(config, "first_k_dense_replace", 0) - 1
    return moe + later * (attention + moe) + 2 * hidden  # final norm, lm_head


def _extra(folder) -> tuple[str, ...]:
    return ("--layer-type", "moe") if "deepseek_v4" in folder.name else ()


def test_init_and_load_weights_give_transformers_block(saved, cache_dir):
    """init on config.json, load_weights from model.safetensors: one block as transformers'."""
    reference = _load(saved)
    config = reference.config.get_text_config()
    package = moec.load(hf_oracle.init_spec(saved, *_extra(saved)), cache_dir=cache_dir)
    name = hf_oracle.moe_names(reference)[0]
    block = reference.get_submodule(name)
    prefix = _checkpoint_prefix(saved, name)
    layer = package.MoELayer(device="cpu").load_weights(saved / "model.safetensors", prefix)
    x = torch.randn(11, config.hidden_size, generator=torch.Generator().manual_seed(1))
    expected = hf_oracle.oracle(block, x)
    error = (layer(x) - expected).abs().max().item()
    assert error <= _block_bound(config) * expected.abs().max().item()


def _checkpoint_prefix(folder, name: str) -> str:
    """The prefix of the block's tensors in the saved file (transformers writes V4 and Kimi-K2.5
    under their checkpoints' own names)."""
    from safetensors import safe_open

    layer = name.split(".")[-2]
    with safe_open(folder / "model.safetensors", "pt") as handle:
        found = [
            key for key in handle.keys() if re.search(rf"\.{layer}\.(mlp|ffn)\.gate\.weight$", key)
        ]
    assert len(found) == 1, found
    return found[0].removesuffix("gate.weight")


def test_patched_model_equals_transformers(saved, cache_dir):
    """patch_model on the whole model (spec from the config): logits within the float32 bound,
    the same greedy tokens; no transformers block left."""
    reference, model = _load(saved), _load(saved)
    patch_model(model, cache_dir=cache_dir)
    assert not [name for name in model.state_dict() if "gate_up_proj" in name]
    tokens = hf_oracle.tokens(3)
    with torch.no_grad():
        expected, logits = reference(tokens).logits, model(tokens).logits
    bound = 2 * U32 * summed_terms(model.config.get_text_config(), tokens.shape[1])
    assert (logits - expected).abs().max().item() <= bound * expected.abs().max().item()
    kwargs = dict(attention_mask=torch.ones_like(tokens), max_new_tokens=6, do_sample=False)
    assert torch.equal(model.generate(tokens, **kwargs), reference.generate(tokens, **kwargs))


def test_v4_keep_hash_layers_patches_the_routed_ones(tmp_path, cache_dir):
    """keep_hash_layers=True: the hash_moe block stays transformers' own (with its token ids),
    the routed one is replaced; the model computes what it did."""
    hf_oracle.save_model(hf_oracle.deepseek_v4(layers=2, hash_layers=1), tmp_path)
    reference, model = _load(tmp_path), _load(tmp_path)
    patch_model(model, keep_hash_layers=True, cache_dir=cache_dir)
    kinds = [type(model.get_submodule(f"model.layers.{i}.mlp")).__name__ for i in range(2)]
    assert kinds == ["DeepseekV4SparseMoeBlock", "MoecMoE"]
    tokens = hf_oracle.tokens(5)
    with torch.no_grad():
        expected, logits = reference(tokens).logits, model(tokens).logits
    bound = 2 * U32 * summed_terms(model.config, tokens.shape[1])
    assert (logits - expected).abs().max().item() <= bound * expected.abs().max().item()


def test_v2_keys_transformers_ignores_follow_transformers_and_say_so(saved_v2_keys, cache_dir):
    reference, model = _load(saved_v2_keys), _load(saved_v2_keys)
    with pytest.warns(RouterKeysIgnored) as caught:
        patch_model(model, cache_dir=cache_dir)
    assert len(caught) == 1
    message = str(caught[0].message)
    assert (
        'scoring_func = "sigmoid" in the config, but DeepseekV2TopkRouter always scores' in message
    )
    assert "norm_topk_prob = true in the config, but DeepseekV2TopkRouter never" in message
    _assert_v2_logits_match(reference, model)


def _assert_v2_logits_match(reference, model) -> None:
    """The patched V2 model's logits against transformers' own, within fp32's bound."""
    tokens = hf_oracle.tokens(4)
    with torch.no_grad():
        expected, logits = reference(tokens).logits, model(tokens).logits
    config = model.config
    terms = 3 * config.hidden_size + 2 * config.q_lora_rank + 2 * config.kv_lora_rank
    terms += config.qk_nope_head_dim + config.qk_rope_head_dim + 2 * tokens.shape[1]
    terms += config.num_attention_heads * config.v_head_dim + 2 * config.hidden_size
    moe = config.hidden_size + config.moe_intermediate_size + config.num_experts_per_tok + 2
    bound = 2 * U32 * (moe + terms + moe + 2 * config.hidden_size)
    assert (logits - expected).abs().max().item() <= bound * expected.abs().max().item()


def test_v2_init_follows_the_block_and_patches_the_model(saved_v2_keys, cache_dir):
    """init writes what DeepseekV2's block computes (softmax, unnormalized), saying so: the
    spec patches the model it came from."""
    spec = hf_oracle.init_spec(saved_v2_keys)
    text = Path(spec).read_text()
    assert 'scoring_func = "sigmoid" is not followed: transformers\' DeepseekV2TopkRouter' in text
    assert "norm_topk_prob = true is not followed" in text
    reference, model = _load(saved_v2_keys), _load(saved_v2_keys)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RouterKeysIgnored)  # the spec is the block's already
        patch_model(model, spec, cache_dir=cache_dir)
    _assert_v2_logits_match(reference, model)


def test_v2_spec_that_follows_the_config_is_refused_naming_both_keys(saved_v2_keys, cache_dir):
    spec = hf_oracle.init_spec(  # the config's keys: sigmoid, renormalized
        saved_v2_keys,
        "--set",
        'router.scoring_func="sigmoid"',
        "--set",
        "router.norm_topk_prob=true",
    )
    with pytest.raises(MoecError) as error:
        patch_model(_load(saved_v2_keys), spec, cache_dir=cache_dir)
    report = error.value.report()
    assert (
        'router.scoring_func = "sigmoid": does not match the model: config.json has scoring_func'
        ' = "sigmoid", but transformers\' DeepseekV2TopkRouter ignores it and always scores with'
        ' a softmax (scoring_func = "softmax", or patch_model(..., router_keys="config")'
    ) in report
    assert "router.norm_topk_prob = true: does not match the model" in report


def test_v2_router_keys_config_follows_the_config(saved_v2_keys, cache_dir):
    """router_keys="config": the block computes what the config says (sigmoid scores,
    renormalized), which transformers' DeepseekV3 router computes on the same weights with a
    zero correction bias and one group: that block is the oracle."""
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE

    model, patched = _load(saved_v2_keys), _load(saved_v2_keys)
    v2 = model.config
    with warnings.catch_warnings():
        warnings.simplefilter("error", RouterKeysIgnored)  # chosen: nothing to warn about
        patch_model(patched, router_keys="config", cache_dir=cache_dir)

    keys = ("hidden_size", "moe_intermediate_size", "n_routed_experts", "num_experts_per_tok")
    config = DeepseekV3Config(
        **{key: getattr(v2, key) for key in keys},
        n_shared_experts=v2.n_shared_experts,
        n_group=1,
        topk_group=1,
        norm_topk_prob=True,
        routed_scaling_factor=v2.routed_scaling_factor,
    )
    name = hf_oracle.moe_names(model)[0]
    oracle = DeepseekV3MoE(config).eval()
    state = model.get_submodule(name).state_dict()
    state["gate.e_score_correction_bias"] = torch.zeros(v2.n_routed_experts)
    oracle.load_state_dict(state)
    x = torch.randn(13, v2.hidden_size, generator=torch.Generator().manual_seed(2))
    expected = hf_oracle.oracle(oracle, x)
    with torch.no_grad():
        out = patched.get_submodule(name)(x.unsqueeze(0)).squeeze(0)
    assert (out - expected).abs().max().item() <= _block_bound(v2) * expected.abs().max().item()
    assert (hf_oracle.oracle(model.get_submodule(name), x) - expected).abs().max() > 1e-3


def test_router_keys_is_checked():
    with pytest.raises(MoecError, match='router_keys = "sglang": is not a choice'):
        patch_model(torch.nn.Linear(2, 2), router_keys="sglang")
