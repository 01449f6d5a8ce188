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


def deepseek_v2(topk_method: str, layers: int = 2) -> object:
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
            norm_topk_prob=False,
            routed_scaling_factor=1.5,
        )
    )


def save_model(config, folder: Path, seed: int = 0) -> torch.nn.Module:
    """Build the model, randomize every MoE tensor, save it; return the in-memory MoE block."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in list(model.named_parameters()) + list(model.named_buffers()):
            if ".mlp." in name and tensor.is_floating_point() and tensor.numel():
                fan_in = tensor.shape[-1] if tensor.dim() > 1 else 1
                scale = 1.0 / fan_in**0.5 if tensor.dim() > 1 else 0.05
                tensor.copy_(torch.randn(tensor.shape, generator=generator) * scale)
    model.eval()
    model.save_pretrained(folder)
    return model.model.layers[MOE_LAYER].mlp


def oracle(block: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The transformers MoE block's output for tokens x [T, H]."""
    with torch.no_grad():
        return block(x.unsqueeze(0)).squeeze(0)


def oracle_routing(block: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The experts the transformers router selects, [T, K] (sorted per token)."""
    with torch.no_grad():
        _, _, ids = block.gate(x)
    return ids.sort(dim=-1).values
