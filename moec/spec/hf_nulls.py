"""Which config keys a JSON null may leave out: those whose null transformers reads as it reads
the key left out.

A null is not "not set" to transformers. Its configuration classes (strict dataclasses) refuse
null for a typed key (`routed_scaling_factor: float`), or keep None where the key takes
Optional, and the MoE block then reads None, not the default: DeepseekV3Config's
`norm_topk_prob = None` is falsy (no renormalization, where the default is true), its
`n_group = None` fails the grouped top-k. moec's reads (hf_values.ConfigReader) therefore
refuse null for every key they read, naming the key, except the keys here, for which null and
the key left out are one to transformers: a key whose default is None itself, or that its
configuration derives when None (`mlp_layer_types`), or that transformers' configuration of
the model type does not define (DeepSeek-V3's `topk_method`: its block reads no such key).

Taken from transformers 5.25 (tests/test_spec_probes.py builds each configuration with each key
null and checks this table against it). A key required by moec (hidden_size, ...) is refused
as missing whether it is left out or null.
"""

from __future__ import annotations

EVERY_TYPE = frozenset(
    {
        # None is the default: the checkpoint's own dtype, no quantization (transformers reads
        # `quantization_config or text_config's quantization_config`), no name
        "torch_dtype",
        "dtype",
        "quantization_config",
        "_name_or_path",
        "expert_dtype",  # DeepSeek-V4's, moved into quantization_config when not None
        # derived when None (from first_k_dense_replace, the default [], num_hidden_layers)
        "mlp_layer_types",
        "mlp_only_layers",
        "num_hash_layers",
        "expert_swiglu_limit_list",
        "share_expert_swiglu_limit_list",
        "swiglu_limits",
        "swiglu_limits_shared",
    }
)
"""Keys whose null is the key left out for every model type moec reads."""

QUANTIZATION = frozenset({"weight_block_size", "fmt", "expert_dtype"})
"""Keys of `quantization_config` whose null transformers takes as a value, not a wrong type:
FineGrainedFP8Config's weight_block_size None is per-tensor scales (moec's fp8_per_tensor; left
out, it is the class's default (128, 128), which hf._quant_from reads apart), expert_dtype None
not "fp4" (fp8 experts), fmt is not read. Its activation_scheme None fails
(`.lower()`), and quant_method is required."""

_DEEPSEEK_V3 = ("scoring_func", "swiglu_limit", "topk_method")
_TOP_K = ("swiglu_limit",)
BY_TYPE: dict[str, tuple[str, ...]] = {
    "deepseek_v2": ("n_group", "scoring_func", "swiglu_limit", "topk_group"),
    "deepseek_v3": _DEEPSEEK_V3,
    "kimi_k2": _DEEPSEEK_V3,  # not in transformers: Kimi-K2's DeepseekV3Config, read as V3's
    "deepseek_v32": _DEEPSEEK_V3,
    "glm4_moe": _DEEPSEEK_V3,
    "deepseek_v4": ("n_group", "topk_group", "topk_method"),
    "dots1": ("n_shared_experts", *_DEEPSEEK_V3),
    "glm4_moe_lite": ("first_k_dense_replace", *_DEEPSEEK_V3),
    "glm_moe_dsa": _DEEPSEEK_V3,
    "solar_open": _DEEPSEEK_V3,
    "glm4v_moe_text": _DEEPSEEK_V3,
    "glm5_next_text": ("first_k_dense_replace", "scoring_func", "topk_method"),
    "mimo_v2_flash": (
        "first_k_dense_replace",
        "n_shared_experts",
        "routed_scaling_factor",
        *_DEEPSEEK_V3,
    ),
    "sarvam_mla": _DEEPSEEK_V3,
    "sarvam_moe": _DEEPSEEK_V3,
    "param2moe": _DEEPSEEK_V3,
    "exaone_moe": _DEEPSEEK_V3,
    "kimi_linear": ("moe_router_activation_func", "swiglu_limit", "topk_method"),
    "bailing_hybrid": (
        "moe_router_enable_expert_bias",
        "score_function",
        "swiglu_limit",
        "topk_method",
    ),
    "deepseek_ocr2_text": (
        "first_k_dense_replace",
        "n_group",
        "norm_topk_prob",
        "scoring_func",
        "swiglu_limit",
        "topk_group",
    ),
    "afmoe": ("n_group", "route_norm", "score_func", "swiglu_limit", "topk_group", "topk_method"),
    "minimax_m2": (
        "n_group",
        "n_shared_experts",
        "norm_topk_prob",
        "routed_scaling_factor",
        "scoring_func",
        "shared_intermediate_size",
        "swiglu_limit",
        "topk_group",
        "topk_method",
        "use_routing_bias",
    ),
    "unlimited_ocr_text": ("norm_topk_prob", "scoring_func", "swiglu_limit"),
    "axk2": ("n_group", "scoring_func", "swiglu_limit", "topk_group", "topk_method"),
    "hy_v3": (
        "first_k_dense_replace",
        "n_group",
        "norm_topk_prob",
        "scoring_func",
        "swiglu_limit",
        "topk_group",
        "topk_method",
    ),
    "mistral4": _DEEPSEEK_V3,
    "mistral_large4_text": ("norm_topk_prob", *_DEEPSEEK_V3),
    "hunyuan_v1_moe": (
        "n_group",
        "norm_topk_prob",
        "routed_scaling_factor",
        "scoring_func",
        "swiglu_limit",
        "topk_group",
        "topk_method",
    ),
    "minicpm5_moe": _DEEPSEEK_V3,
    "beam": ("first_k_dense_replace", *_DEEPSEEK_V3),
    "inkling2_text": (),
    "inkling2_loop_text": (),
    "minimax_m3_vl_text": ("first_k_dense_replace",),
    "dots3_note_text": _DEEPSEEK_V3,
    "laguna": ("first_k_dense_replace", "swiglu_limit"),
    "mixtral": _TOP_K,
    "minimax": _TOP_K,
    "qwen3_moe": _TOP_K,
    "olmoe": _TOP_K,
    "flex_olmo": _TOP_K,
    "mellum": ("first_k_dense_replace", "swiglu_limit"),
    "jamba": _TOP_K,
    "qwen3_vl_moe_text": _TOP_K,
    "qwen3_omni_moe_text": _TOP_K,
    "cohere2_moe": _TOP_K,
    "flint": _TOP_K,
    "lara_mini": _TOP_K,
    "granitemoe": _TOP_K,
    "granitemoe_swa": _TOP_K,
    "granitemoeshared": _TOP_K,
    "granitemoehybrid": _TOP_K,
    "lfm2_moe": ("hidden_act", "swiglu_limit"),
}
"""model_type -> the keys moec reads (beside EVERY_TYPE's) whose null is the key left out."""


def absent_nulls(model_type: str) -> frozenset[str]:
    """The keys of a `model_type` config whose null moec reads as the key left out."""
    return EVERY_TYPE | frozenset(BY_TYPE.get(model_type, ()))
