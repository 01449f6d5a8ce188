"""Router and layer corners of the DeepSeek-style families end to end, the keys transformers'
blocks ignore (patch_model follows the block), and bfloat16 layers of the newer families.

Each tiny random model (2-3 layers) is saved with `save_pretrained`, every MoE tensor random
(DeepSeek-V4's hash table K distinct experts per token, as in tests/hf_oracle.py); `moec init
--from-hf` reads its config.json, `load_weights` its safetensors, and `patch_model` replaces
every MoE block of the model loaded back. The corners: groups of two experts, every group
kept, a top-k that fills the kept groups exactly, top-1 and top-all, 24-wide experts, a scaling
of 0.5, a DeepSeek-V3.2 whose mlp_layer_types puts a dense layer between two MoE ones;
DeepSeek-V4's routed layers at top-1 and top-all, with sigmoid scores, and its hash-routed
layers at top-2.

Keys the model type's transformers block never reads (DeepSeek-V3's scoring_func and
topk_method, DeepSeek-V4's norm_topk_prob, groups and n_shared_experts, AFMoE's groups and
route_norm, MiniMax-M2's and Hunyuan's routed_scaling_factor, HY-V3's norm_topk_prob):
patch_model's spec from the config follows the block, says which key it did not follow
(RouterKeysIgnored), and the patched model computes what it did.

Tolerances, float32 (u = 2**-24), as in test_hf_more_families.py: one block, 2u (H + I + K +
S) of its largest output; logits, 2u N of the largest logit (`summed_terms`). bfloat16, as in
test_oracle.py: the layer in bf16 against transformers' block in float32 on the same bf16
inputs and bf16-rounded expert weights (the router's kept in float32, as the layer keeps it):
a few bf16 ulps (2**-6) of the largest output.
"""

from __future__ import annotations

from types import SimpleNamespace

import hf_oracle
import pytest
import torch
from test_hf_families5 import (
    _config,
    _glm4_moe,
    _kimi_k25,
    _mla,
    check_patched_model,
    load,
    save,
)
from test_hf_more_families import CONFIGS, _checkpoint, summed_terms
from test_integration_families import _block_bound, _checkpoint_prefix

import moec
from moec.integrations.transformers import RouterKeysIgnored, patch_model
from moec.spec import load_spec

U32 = 2.0**-24
TORCH = "experts.gemm_backend=torch"
_V32 = dict(index_topk=4, index_head_dim=16, index_n_heads=2)


def _v4(hash_layers: int = 0, **keys) -> dict:
    config = hf_oracle.deepseek_v4(layers=2, hash_layers=hash_layers).to_dict()
    return {**config, **keys}


CORNERS = {
    "v3 six groups of two, top-1, two shared experts": _mla(
        "deepseek_v3",
        n_routed_experts=12,
        n_group=6,
        topk_group=3,
        num_experts_per_tok=1,
        n_shared_experts=2,
        routed_scaling_factor=0.5,
        moe_intermediate_size=24,
    ),
    "v3 every expert chosen, unnormalized": _mla(
        "deepseek_v3", n_group=1, topk_group=1, num_experts_per_tok=16, norm_topk_prob=False
    ),
    "v3 every layer MoE, no shared expert, 24 wide": _mla(
        "deepseek_v3", first_k_dense_replace=0, n_shared_experts=0, moe_intermediate_size=24
    ),
    "v32 every group kept, two shared experts": _mla(
        "deepseek_v32",
        n_group=4,
        topk_group=4,
        num_experts_per_tok=10,
        n_shared_experts=2,
        routed_scaling_factor=0.5,
        **_V32,
    ),
    "v32 a dense layer between two MoE ones": _mla(
        "deepseek_v32", layers=3, mlp_layer_types=["sparse", "dense", "sparse"], **_V32
    ),
    "glm4_moe eight groups of two": _glm4_moe(n_group=8, topk_group=3, num_experts_per_tok=5),
    "glm4_moe top-k fills the kept groups": _glm4_moe(
        n_group=2, topk_group=1, num_experts_per_tok=8, n_shared_experts=0
    ),
    "kimi_k25 top-1 unnormalized, twelve experts in four groups": _kimi_k25(
        n_routed_experts=12,
        n_group=4,
        topk_group=3,
        num_experts_per_tok=1,
        norm_topk_prob=False,
        n_shared_experts=2,
        moe_intermediate_size=16,
    ),
    "v2 group_limited_greedy, six groups of two": _mla(
        "deepseek_v2",
        topk_method="group_limited_greedy",
        n_routed_experts=12,
        n_group=6,
        topk_group=3,
        num_experts_per_tok=4,
        norm_topk_prob=False,
        n_shared_experts=2,
        routed_scaling_factor=0.5,
    ),
    "v4 top-1": _v4(num_experts_per_tok=1),
    "v4 every expert chosen, unscaled": _v4(num_experts_per_tok=16, routed_scaling_factor=1.0),
    "v4 sigmoid scores": _v4(scoring_func="sigmoid"),
}


def _save(keys: dict, folder) -> None:
    """hf_oracle.save_model for DeepSeek-V4 (its hash table), families5's save otherwise."""
    if keys["model_type"] == "deepseek_v4":
        hf_oracle.save_model(_config(keys), folder)
    else:
        save(keys, folder)


def _source(folder, name: str):
    """(the block's tensors in the saved file, their prefix): under mlp. or ffn. (DeepSeek's
    and Kimi-K2.5's names), else as test_hf_more_families finds them (block_sparse_moe.)."""
    try:
        return folder / "model.safetensors", _checkpoint_prefix(folder, name)
    except AssertionError:
        return _checkpoint(folder, name)


@pytest.mark.parametrize("corner", sorted(CORNERS))
def test_router_corners_match_transformers(corner, tmp_path, cache_dir):
    """init on config.json, patch_model with that spec: logits within the float32 bound;
    load_weights from the saved file with the same spec: the first block as transformers'."""
    _save(CORNERS[corner], tmp_path)
    check_patched_model(tmp_path, cache_dir)
    reference = load(tmp_path)
    name = hf_oracle.moe_names(reference)[0]
    spec = tmp_path / "spec.toml"
    dims = load_spec(spec).spec.model
    package = moec.load(spec, cache_dir=cache_dir)
    layer = package.MoELayer(device="cpu").load_weights(*_source(tmp_path, name))
    x = torch.randn(11, dims.hidden_size, generator=torch.Generator().manual_seed(1))
    expected = hf_oracle.oracle(reference.get_submodule(name), x)
    error = (layer(x) - expected).abs().max().item()
    assert error <= _block_bound(dims) * expected.abs().max().item()


def test_v4_hash_layers_at_top_2_match_transformers(tmp_path, cache_dir):
    """Two hash_moe layers choosing two experts each, sigmoid scores, unscaled: the layer from
    init's spec, fed the token ids, as transformers' DeepseekV4HashRouter block."""
    keys = _v4(2, num_experts_per_tok=2, scoring_func="sigmoid", routed_scaling_factor=1.0)
    hf_oracle.save_model(_config(keys), tmp_path)
    spec = hf_oracle.init_spec(tmp_path, "--set", TORCH)
    loaded = load_spec(spec).spec
    assert (loaded.router.topk_method, loaded.model.num_experts_per_tok) == ("hash", 2)
    reference = load(tmp_path)
    block = reference.model.layers[1].mlp
    assert block.is_hash
    package = moec.load(spec, cache_dir=cache_dir)
    layer = package.MoELayer(device="cpu").load_weights(*_source(tmp_path, "model.layers.1.mlp"))
    x = torch.randn(13, 64, generator=torch.Generator().manual_seed(3))
    ids = torch.randint(0, 64, (13,), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        expected = block(x.unsqueeze(0), input_ids=ids.unsqueeze(0)).squeeze(0)
    error = (layer(x, ids) - expected).abs().max().item()
    assert error <= _block_bound(loaded.model) * expected.abs().max().item()


# --- keys the block ignores: patch_model follows the block, and says so ----------------------


def _more(model_type: str, **keys) -> dict:
    return {**CONFIGS[model_type], "model_type": model_type, **keys}


IGNORED = {
    "v3 softmax scores": (
        _mla("deepseek_v3", scoring_func="softmax"),
        'scoring_func = "softmax" in the config, but DeepseekV3TopkRouter always scores',
    ),
    "v3 greedy": (
        _mla("deepseek_v3", topk_method="greedy"),
        'topk_method = "greedy" in the config, but DeepseekV3TopkRouter always chooses as',
    ),
    "v4 unnormalized": (
        _v4(norm_topk_prob=False),
        "norm_topk_prob = false in the config, but DeepseekV4TopKRouter always renormalizes",
    ),
    "v4 groups": (
        _v4(n_group=4, topk_group=2),
        "n_group = 4 in the config, but DeepseekV4TopKRouter chooses among all experts",
    ),
    "v4 no shared expert": (
        _v4(n_shared_experts=0),
        "n_shared_experts = 0 in the config, but DeepseekV4TopKRouter holds one shared expert",
    ),
    "v4 two shared experts": (
        _v4(n_shared_experts=2),
        "n_shared_experts = 2 in the config, but DeepseekV4TopKRouter holds one shared expert",
    ),
    "v4 greedy": (
        _v4(topk_method="greedy"),
        'topk_method = "greedy" in the config, but DeepseekV4TopKRouter always chooses as',
    ),
    "afmoe groups": (
        _more("afmoe", n_group=2, topk_group=1),
        "n_group = 2 in the config, but AfmoeTokenChoiceRouter chooses among all experts",
    ),
    "afmoe route_norm false": (
        _more("afmoe", route_norm=False),
        "norm_topk_prob = false in the config, but AfmoeTokenChoiceRouter always renormalizes",
    ),
    "minimax_m2 scaled": (
        _more("minimax_m2", routed_scaling_factor=0.5),
        "routed_scaling_factor = 0.5 in the config, but MiniMaxM2TopKRouter never scales",
    ),
    "hy_v3 unnormalized": (
        _more("hy_v3", norm_topk_prob=False),
        "norm_topk_prob = false in the config, but HYV3TopKRouter always renormalizes",
    ),
    "hunyuan scaled": (
        _more("hunyuan_v1_moe", routed_scaling_factor=0.5),
        "routed_scaling_factor = 0.5 in the config, but HunYuanMoEV1Gate never scales",
    ),
}
"""id -> (the config's keys, what the warning says of the key the block ignores)."""


@pytest.mark.parametrize("case", sorted(IGNORED))
def test_patch_model_follows_a_block_that_ignores_a_key(case, tmp_path, cache_dir):
    keys, message = IGNORED[case]
    _save(keys, tmp_path)
    reference, model = load(tmp_path), load(tmp_path)
    names = hf_oracle.moe_names(model)
    with pytest.warns(RouterKeysIgnored) as caught:
        patch_model(model, overrides=[TORCH], cache_dir=cache_dir)
    assert len(caught) == 1 and message in str(caught[0].message)
    assert {type(model.get_submodule(name)).__name__ for name in names} == {"MoecMoE"}
    tokens = hf_oracle.tokens(3)
    with torch.no_grad():
        expected, logits = reference(input_ids=tokens).logits, model(input_ids=tokens).logits
    text = model.config.get_text_config()
    width = reference.get_submodule(names[0]).experts.down_proj.shape[-1]
    dims = SimpleNamespace(
        hidden_size=text.hidden_size,
        moe_intermediate_size=width,
        num_experts_per_tok=text.num_experts_per_tok,
    )
    bound = 2 * U32 * summed_terms(model, dims, names[0], tokens.shape[1])
    assert (logits - expected).abs().max().item() <= bound * expected.abs().max().item()


# --- bfloat16 layers of the newer families ---------------------------------------------------

BF16 = {
    "deepseek_v32": _mla("deepseek_v32", **_V32),
    "glm4_moe": _glm4_moe(),
    "kimi_k25": _kimi_k25(),
    "deepseek_v4": _v4(),
    "deepseek_v4 hash_moe": _v4(2),
    "minimax_m2": _more("minimax_m2"),
}


@pytest.mark.parametrize("model", sorted(BF16))
def test_bfloat16_layer_within_bf16_rounding(model, tmp_path, cache_dir):
    keys = BF16[model]
    _save(keys, tmp_path)
    spec = hf_oracle.init_spec(tmp_path, "--set", TORCH, "--set", "target.dtype=bfloat16")
    reference = load(tmp_path)
    name = hf_oracle.moe_names(reference)[0]
    block = reference.get_submodule(name)
    with torch.no_grad():  # the experts' weights as the bf16 layer holds them
        for param_name, param in block.named_parameters():
            if not param_name.startswith("gate."):
                param.copy_(param.bfloat16().float())
    package = moec.load(spec, cache_dir=cache_dir)
    layer = package.MoELayer(device="cpu").load_weights(*_source(tmp_path, name))
    x = torch.randn(37, 64, generator=torch.Generator().manual_seed(2)).bfloat16()
    with torch.no_grad():
        if model.endswith("hash_moe"):
            ids = torch.randint(0, 64, (37,), generator=torch.Generator().manual_seed(4))
            expected = block(x.float().unsqueeze(0), input_ids=ids.unsqueeze(0)).squeeze(0)
            out = layer(x, ids)
        else:
            expected = hf_oracle.oracle(block, x.float())
            out = layer(x)
    assert out.dtype == torch.bfloat16
    error = (out.float() - expected).abs().max() / expected.abs().max()
    assert error.item() <= 2**-6
