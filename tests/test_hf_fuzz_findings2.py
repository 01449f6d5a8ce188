"""What a second differential fuzzer of `moec init --from-hf` / patch_model against transformers
5.24 found, one test per bug (each config its minimal reproducer).

Found wrong before this file:
- A config whose block clamps its SwiGLU (DeepSeek-V4's, GLM-5-Next's; any under patch_model,
  which reads the clamp as the config writes it) got silu_clamped whatever `hidden_act` said:
  transformers computes gelu(clamp(gate)) * clamp(up) for "gelu", so the layer was silently
  wrong. A hidden_act other than silu is now refused there too; "swish", transformers' other
  name of silu, is read as silu.
- `moec init` wrote the routing keys as the config says where transformers' block never reads
  them (DeepSeek-V4's norm_topk_prob, n_group, n_shared_experts; DeepSeek-V3's scoring_func and
  topk_method; AFMoE's, MiniMax-M2's, HY-V3's, Hunyuan's): the layer computed something else
  than the model, or was refused, or its spec did not load the checkpoint. init now follows the
  block (hf_blocks, as patch_model does), with a comment naming the config's value.
- DeepSeek-V4's `mlp_bias = true` (biases on the shared expert) got a spec whose layer could not
  load the checkpoint; it is refused by key, as for DeepSeek-V2.
- A config naming a key only by the alias transformers reads through `attribute_map`
  (`num_local_experts`, DeepSeek-V2's `num_experts`, DeepSeek-V4's `intermediate_size`) was
  refused as missing the key.
"""

from __future__ import annotations

import json

import hf_oracle
import pytest
from test_hf_families5 import _config, _mla, check_patched_model, check_saved_block, save
from test_hf_more_families import CONFIGS
from test_spec_hf import init, write_config

from moec.errors import MoecError
from moec.integrations.transformers import patch_model


def _v4(**keys) -> dict:
    return {**hf_oracle.deepseek_v4(layers=2).to_dict(), **keys}


def _save(keys: dict, folder) -> None:
    if keys["model_type"] == "deepseek_v4":  # its MoE sits under .ffn.: hf_oracle randomizes it
        hf_oracle.save_model(_config(keys), folder)
    else:
        save(keys, folder)


def _refused(tmp_path, capsys, config) -> str:
    code, out, err = init(capsys, "--from-hf", str(write_config(tmp_path, config)))
    assert (code, out) == (2, "") and "Traceback" not in err
    return err


# --- hidden_act under a clamp ---------------------------------------------------------------


@pytest.mark.parametrize(
    "config",
    [
        _v4(hidden_act="gelu"),
        {
            **CONFIGS["glm5_next"]["text_config"],
            "model_type": "glm5_next_text",
            "hidden_act": "relu",
        },
    ],
    ids=["deepseek_v4", "glm5_next_text"],
)
def test_another_activation_under_a_clamp_is_refused(config, tmp_path, capsys):
    err = _refused(tmp_path, capsys, config)
    assert f'hidden_act = "{config["hidden_act"]}": is not a gated activation moec knows' in err


def test_patch_model_refuses_a_clamped_gelu():
    """patch_model reads the clamp as the config writes it: a DeepSeek-V3 model with a
    swiglu_limit and gelu experts was patched with silu (its logits off by 17%)."""
    from transformers import AutoModelForCausalLM

    config = _config(_mla("deepseek_v3", hidden_act="gelu", swiglu_limit=1.0))
    with pytest.raises(MoecError) as error:
        patch_model(AutoModelForCausalLM.from_config(config))
    assert 'hidden_act = "gelu": is not a gated activation moec knows' in error.value.report()


def test_swish_is_silu(tmp_path, cache_dir):
    """transformers' ACT2FN["swish"] is SiLU: the model is patched, its logits as before."""
    save(_mla("deepseek_v3", hidden_act="swish"), tmp_path)
    check_patched_model(tmp_path, cache_dir)
    check_saved_block(tmp_path, cache_dir)


# --- routing keys the block never reads -----------------------------------------------------


@pytest.mark.parametrize(
    "keys, note",
    [
        (_v4(norm_topk_prob=False), "norm_topk_prob = false is not followed"),
        (_v4(n_group=4, topk_group=2), "n_group = 4 is not followed"),
        (_v4(n_shared_experts=2), "n_shared_experts = 2 is not followed"),
        (_v4(topk_method="greedy"), 'topk_method = "greedy" is not followed'),
        (_mla("deepseek_v3", scoring_func="softmax"), 'scoring_func = "softmax" is not followed'),
        (
            _mla("deepseek_v32", topk_method="group_limited_greedy"),
            'topk_method = "group_limited_greedy" is not followed',
        ),
        (
            {**CONFIGS["minimax_m2"], "model_type": "minimax_m2", "routed_scaling_factor": 0.5},
            "routed_scaling_factor = 0.5 is not followed",
        ),
        (
            {**CONFIGS["afmoe"], "model_type": "afmoe", "route_norm": False},
            "route_norm = false is not followed",
        ),
        (
            {**CONFIGS["hy_v3"], "model_type": "hy_v3", "n_group": 2, "topk_group": 1},
            "n_group = 2 is not followed",
        ),
    ],
    ids=[
        "v4-unnormalized",
        "v4-groups",
        "v4-two-shared",
        "v4-greedy",
        "v3-softmax",
        "v32-group-limited",
        "minimax_m2-scaled",
        "afmoe-route_norm",
        "hy_v3-groups",
    ],
)
def test_init_follows_the_block_where_it_ignores_a_key(keys, note, tmp_path, cache_dir):
    """The spec init writes patches the model with no warning (patch_model refuses a spec that
    computes otherwise than the block), and loads its saved block as transformers computes it."""
    _save(keys, tmp_path)
    text = check_patched_model(tmp_path, cache_dir)
    assert note in text
    check_saved_block(tmp_path, cache_dir)


# --- refused by key -------------------------------------------------------------------------


def test_v4_shared_expert_biases_are_refused_by_key(tmp_path, capsys):
    err = _refused(tmp_path, capsys, _v4(mlp_bias=True))
    assert "mlp_bias = true: gives the shared experts' projections biases" in err


# --- names transformers reads through attribute_map -----------------------------------------


@pytest.mark.parametrize(
    "keys, key, alias",
    [
        (_mla("deepseek_v3"), "n_routed_experts", "num_local_experts"),
        (_mla("glm4_moe"), "n_routed_experts", "num_local_experts"),
        (_mla("deepseek_v32"), "n_routed_experts", "num_experts"),
        (_v4(), "moe_intermediate_size", "intermediate_size"),
        (_v4(), "n_routed_experts", "num_local_experts"),
    ],
    ids=["v3", "glm4_moe", "v32-num_experts", "v4-intermediate_size", "v4-num_local_experts"],
)
def test_a_key_written_under_its_alias_is_read(keys, key, alias, tmp_path, cache_dir):
    _save(keys, tmp_path)
    path = tmp_path / "config.json"
    written = json.loads(path.read_text())
    written[alias] = written.pop(key)
    path.write_text(json.dumps(written))
    check_patched_model(tmp_path, cache_dir)
    check_saved_block(tmp_path, cache_dir)
