"""Tiny random transformers DeepSeek models, saved with `save_pretrained`: the independent
oracle the generated layer is checked against.

Every weight (router bias included) is set to random values before saving, so nothing passes
because a tensor happens to be zero. Layer 0 is dense, every later layer MoE; the oracle tests
read layer 1.
"""

from __future__ import annotations

from pathlib import Path

import torch

MOE_LAYER = 1
PREFIX = f"model.layers.{MOE_LAYER}.mlp."


def _common(hidden: int = 64, layers: int = 2, **moe) -> dict:
    return dict(
        vocab_size=64,
        hidden_size=hidden,
        intermediate_size=96,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=2,
        q_lora_rank=16,
        kv_lora_rank=16,
        qk_rope_head_dim=8,
        qk_nope_head_dim=8,
        v_head_dim=8,
        first_k_dense_replace=1,
        max_position_embeddings=64,
        **moe,
    )


def deepseek_v3(
    n_shared: int = 1, hidden: int = 64, intermediate: int = 32, layers: int = 2
) -> object:
    from transformers import DeepseekV3Config

    return DeepseekV3Config(
        **_common(
            hidden,
            layers,
            moe_intermediate_size=intermediate,
            n_routed_experts=16,
            num_experts_per_tok=4,
            n_shared_experts=n_shared,
            n_group=4,
            topk_group=2,
            norm_topk_prob=True,
            routed_scaling_factor=2.5,
        )
    )


def deepseek_v2(topk_method: str, layers: int = 2, **router) -> object:
    """`router`: config keys on top (transformers' V2 router ignores norm_topk_prob and
    scoring_func; moec follows them when asked)."""
    from transformers import DeepseekV2Config

    grouped = topk_method == "group_limited_greedy"
    return DeepseekV2Config(
        **_common(
            layers=layers,
            moe_intermediate_size=32,
            n_routed_experts=16,
            num_experts_per_tok=3,
            n_shared_experts=2,
            n_group=4 if grouped else 1,
            topk_group=2 if grouped else 1,
            topk_method=topk_method,
            routed_scaling_factor=1.5,
            **{"norm_topk_prob": False, **router},
        )
    )


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
"""The MoE keys of the V3-style tiny models (DeepSeek-V3.2, GLM-4.5, Kimi-K2.5)."""


def deepseek_v32(layers: int = 3) -> object:
    from transformers import DeepseekV32Config

    indexer = dict(index_topk=4, index_head_dim=16, index_n_heads=2)
    return DeepseekV32Config(**_common(layers=layers, **indexer, **_V3_MOE))


def glm4_moe(layers: int = 3) -> object:
    from transformers import Glm4MoeConfig

    return Glm4MoeConfig(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        first_k_dense_replace=1,
        max_position_embeddings=64,
        **_V3_MOE,
    )


def kimi_k25(layers: int = 3) -> object:
    """Kimi-K2.5: a small vision tower and a DeepSeek-V3 text model (written as kimi_k2, as the
    released config does; transformers reads it as deepseek_v3)."""
    from transformers.models.kimi_k25 import Kimi_K25Config

    text = _common(layers=layers, model_type="kimi_k2", **_V3_MOE)
    vision = dict(num_hidden_layers=1, hidden_size=32, intermediate_size=32, num_attention_heads=2)
    return Kimi_K25Config(text_config=text, vision_config=vision, projection_hidden_size=32)


def deepseek_v4(layers: int = 2, hash_layers: int = 0) -> object:
    """DeepSeek-V4: every layer MoE (the first `hash_layers` hash-routed), sqrtsoftplus scores,
    SwiGLU clamped at 10, hyper-connections and compressed attention at tiny dims."""
    from transformers import DeepseekV4Config

    return DeepseekV4Config(
        vocab_size=64,
        hidden_size=64,
        moe_intermediate_size=32,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        q_lora_rank=16,
        n_routed_experts=16,
        num_experts_per_tok=4,
        n_shared_experts=1,
        routed_scaling_factor=1.5,
        swiglu_limit=1.0,  # inside the pre-activations' range (about N(0, 1)): the clamp acts
        o_groups=2,
        o_lora_rank=16,
        index_n_heads=2,
        index_head_dim=16,
        index_topk=4,
        sliding_window=8,
        hc_mult=2,
        max_position_embeddings=64,
        mlp_layer_types=["hash_moe"] * hash_layers + ["moe"] * (layers - hash_layers),
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
    )


def causal_lm_class(config) -> type:
    """The transformers class of the whole model: Kimi-K2.5 is an image-text-to-text model."""
    import transformers

    if config.model_type == "kimi_k25":
        return transformers.AutoModelForImageTextToText
    return transformers.AutoModelForCausalLM


def moe_names(model) -> list[str]:
    """The names of the model's MoE blocks, in layer order."""
    return [
        name
        for name, module in model.named_modules()
        if name.endswith(".mlp") and hasattr(module, "experts")
    ]


def save_model(config, folder: Path, seed: int = 0) -> torch.nn.Module:
    """Build the model, randomize every MoE tensor, save it; return the in-memory MoE block."""
    torch.manual_seed(seed)
    model = causal_lm_class(config).from_config(config, torch_dtype=torch.float32)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in list(model.named_parameters()) + list(model.named_buffers()):
            if name.endswith("gate.tid2eid"):  # V4's hash table: K distinct experts per token
                vocab, top_k = tensor.shape
                experts = config.n_routed_experts
                table = torch.rand(vocab, experts, generator=generator).argsort(dim=1)
                tensor.copy_(table[:, :top_k])
            elif ".mlp." in name and tensor.is_floating_point() and tensor.numel():
                fan_in = tensor.shape[-1] if tensor.dim() > 1 else 1
                scale = 1.0 / fan_in**0.5 if tensor.dim() > 1 else 0.05
                tensor.copy_(torch.randn(tensor.shape, generator=generator) * scale)
    model.eval()
    model.save_pretrained(folder)
    return model.get_submodule(moe_names(model)[0])


def saved_folder(tmp_path_factory, name: str, config) -> Path:
    """A fresh folder holding the model of `config`, saved by save_model (for module fixtures)."""
    folder = tmp_path_factory.mktemp(f"hf_{name}")
    save_model(config, folder)
    return folder


def oracle(block: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The transformers MoE block's output for tokens x [T, H]."""
    with torch.no_grad():
        return block(x.unsqueeze(0)).squeeze(0)


def oracle_routing(block: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The experts the transformers router selects, [T, K] (sorted per token)."""
    with torch.no_grad():
        _, _, ids = block.gate(x)
    return ids.sort(dim=-1).values


def init_spec(folder: Path, *args: str) -> str:
    """The README's flow on a saved model: `moec init --from-hf config.json -o spec.toml`, for
    the CPU in fp32, with `args` after it (more `--set`s, `--layer-type`); the spec's path."""
    from moec.cli import main

    spec = folder / "spec.toml"
    command = ["init", "--from-hf", str(folder / "config.json"), "-o", str(spec)]
    command += ["--set", "target.device=cpu", "--set", "target.dtype=float32", *args]
    assert main(command) == 0
    return str(spec)


def tokens(seed: int = 0) -> torch.Tensor:
    """A [2, 7] batch of token ids below 64 (every tiny model's vocabulary holds them)."""
    return torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(seed))
