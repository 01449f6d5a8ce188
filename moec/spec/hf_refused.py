"""The MoE model types `moec init --from-hf` refuses by name, and the config keys that would make
a supported one compute what moec's layer cannot (each refused naming its key, never dropped).

A type is refused where transformers' MoE block does math moec's spec cannot say: a different
router (softmax scores with a correction bias, clamped renormalization, a normalized input, a
logit bias), zero-computation experts, a clamp after the activation, per-layer limits, a gated
or router-weighted shared expert, a norm per expert, ungated experts, transposed expert
weights, tokens dropped past a capacity, or no MoE layer at all; and, by the name of its block,
each other MoE of transformers that moec has not been checked against. A key whose value
changes the math (KEY_CHECKS), or leaves the model no MoE layer (NO_MOE_LAYERS), is refused by
key.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from moec.errors import problem
from moec.spec.hf_values import ConfigReader

_SOFTMAX_BIAS = (
    "chooses experts on softmax scores plus a correction bias, and moec's noaux_tc adds the "
    "bias to sigmoid-family scores only"
)
_STEP = (
    "clamps its SwiGLU after the activation (silu(gate) clamped, where moec clamps the gate "
    "before it) with a limit per layer (swiglu_limits, swiglu_limits_shared), and sizes its "
    "shared expert apart (share_expert_dim)"
)
_HY_V4 = (
    "clamps the routed experts' SwiGLU (swiglu_limit) and not the shared expert's, where "
    "moec's silu_clamped clamps both"
)
_MUSE = (
    "projects its experts' input to moe_hidden_size and normalizes it (pre_expert_proj, "
    "pre_expert_norm), their sum back (post_expert_proj), and scales the router logits "
    "(output_multiplier) before the sigmoid, where moec's experts read and write the hidden "
    "states as they are"
)
_GATED_SHARED = (
    "gates its shared expert by a sigmoid of a per-token linear map (shared_expert_gate) and "
    "sizes it apart (shared_expert_intermediate_size); moec's shared experts are ungated, "
    "n_shared_experts x moe_intermediate_size wide"
)
_LLAMA4 = (
    "scales each token's input to its expert by the sigmoid of the router logit (before the "
    "expert's SwiGLU, not after it, as moec weights the outputs)"
)
_ENCODER_DECODER = (
    "is an encoder-decoder whose routers drop the tokens past each expert's capacity "
    "(expert_capacity); moec's layer computes every token"
)
_KOLIBRI = (
    "chooses experts on the router logits plus a correction bias, before the sigmoid; moec's "
    "noaux_tc adds the bias to the sigmoid scores"
)
_ERNIE = (
    f"{_SOFTMAX_BIAS} (moe_statics), and renormalizes the top-k weights by max(sum, moe_norm_min)"
)
_ERNIE_VL = f"routes text and image tokens to separate experts (text_moe, vision_moe), and {_ERNIE}"
_ARIA = (
    "stores its routed experts transposed (experts.gate_up_proj [E, H, 2I], experts.down_proj "
    "[E, I, H]), a layout moec's load_weights does not read"
)
_GEMMA4 = (
    "normalizes its router's input (an RMSNorm, then a learned scale) and multiplies each chosen "
    "expert's weight by a learned per_expert_scale, which moec's router does not"
)
_INKLING = (
    "weights its shared experts per token by router scores (shared_gammas: the chosen and the "
    "shared experts' log-sigmoid logits normalized together), where moec's shared experts are "
    "unweighted"
)
_NEMOTRON_H = (
    "computes its experts as ungated MLPs, down(act(up(x))) with mlp_hidden_act (and may "
    "project them to a latent width, moe_latent_size), where moec's are gated (SwiGLU)"
)
_UNCHECKED = (
    "has an MoE block moec has not been checked against transformers' own ({block}), so "
    "init does not guess what it computes"
)
UNCHECKED_BLOCKS: dict[str, str] = {}
"""model_type -> its block, for an MoE model type of transformers refused until it is checked
(its block read, and computed or refused with its reason); every one of 5.24-5.25 is."""
REFUSED_TYPES = {
    "longcat_flash": (
        "routes tokens to zero-computation (identity) experts (zero_expert_num) beside its FFN "
        f"experts, and {_SOFTMAX_BIAS}"
    ),
    "ernie4_5_moe": _ERNIE,
    "ernie4_5_vl_moe": _ERNIE_VL,
    "ernie4_5_vl_moe_text": _ERNIE_VL,
    "step3p7": _STEP,
    "step3p5": _STEP,
    "youtu": "has no MoE layer: every layer is a dense MLP",
    "axk1": "normalizes the MoE block's output (post_mlp_layernorm), which moec's layer does not",
    "hy_v4": _HY_V4,
    "hy_v4_vl": _HY_V4,
    "hy_v4_vl_text": _HY_V4,
    "kolibri1": _KOLIBRI,
    "kolibri1_1": _KOLIBRI,
    "muse_spark_text": _MUSE,
    "muse_spark": _MUSE,
    "qwen2_moe": _GATED_SHARED,
    "qwen3_next": _GATED_SHARED,
    "qwen3_5_moe": _GATED_SHARED,
    "qwen3_5_moe_text": _GATED_SHARED,
    "qwen4_exp": _GATED_SHARED,
    "qwen4_exp_text": _GATED_SHARED,
    "qwen3_omni_moe_talker_text": _GATED_SHARED,
    "qwen3_omni_moe": (
        "holds two MoE text models, its thinker's (Qwen3-MoE's block, which moec computes: "
        "init from thinker_config, model_type qwen3_omni_moe_thinker) and its talker's, whose "
        "shared expert is gated (shared_expert_gate), and a spec describes one"
    ),
    "aria": _ARIA,
    "aria_text": _ARIA,
    "ergo": (
        "normalizes each routed expert's output by that expert's own RMSNorm (post_expert_norm) "
        "before the weighted sum, which moec's experts do not"
    ),
    "gemma4": _GEMMA4,
    "gemma4_text": _GEMMA4,
    "diffusion_gemma": _GEMMA4,
    "diffusion_gemma_text": _GEMMA4,
    "inkling_mm_model": _INKLING,
    "inkling_text": _INKLING,
    "nemotron_h": _NEMOTRON_H,
    "nemo_speechlm": f"holds a nemotron_h text model (text_config), which {_NEMOTRON_H}",
    "nemotron_h_omni": f"holds a nemotron_h text model (text_config), which {_NEMOTRON_H}",
    "openai_privacy_filter": (
        "adds a learned bias to its router logits (router.bias) before the top-k, which moec's "
        "router has none of"
    ),
    "zaya": (
        "routes through a router MLP whose state carries from layer to layer (router_states) "
        "and may choose a skip expert that computes nothing"
    ),
    "llama4": _LLAMA4,
    "llama4_text": _LLAMA4,
    "gpt_oss": (
        "gives its router and its experts biases and computes its SwiGLU as "
        "gate * sigmoid(swiglu_alpha * gate) * (up + 1), clamped"
    ),
    "phimoe": (
        "chooses its experts with sparsemixer (a threshold-masked softmax per choice), not a "
        "top-k of one softmax"
    ),
    "dbrx": (
        "renormalizes the top-k weights by their p-norm (ffn_config.moe_normalize_expert_weights), "
        "its MoE keys in ffn_config"
    ),
    "jetmoe": "also routes its attention heads through experts (JetMoeMoA)",
    "doge": "mixes product-key-selected single-neuron experts with a dense MLP (DogeCDMoE)",
    "switch_transformers": _ENCODER_DECODER,
    "nllb-moe": _ENCODER_DECODER,
    **{name: _UNCHECKED.format(block=block) for name, block in UNCHECKED_BLOCKS.items()},
}
"""model_type -> why moec cannot compute its MoE layers (in words, after the model type)."""


def refused_type(model_type: object) -> str | None:
    """Why moec refuses `model_type` ("an MoE moec does not compute: ..."), or None."""
    if not isinstance(model_type, str) or model_type not in REFUSED_TYPES:
        return None
    return f"an MoE moec does not compute: {model_type} {REFUSED_TYPES[model_type]}"


@dataclass(frozen=True)
class KeyCheck:
    """A config key whose other values change the MoE math beyond what moec computes."""

    key: str
    allowed: tuple[Any, ...]
    """The values moec computes (absent and null are transformers' default: allowed, unless
    `default` says otherwise)."""
    why: str
    hint: str
    default: Any = None
    """transformers' value of an absent key, where it is not one of `allowed` (None: it is)."""


_MLP_BIAS = KeyCheck(
    "mlp_bias",
    (False,),
    "gives the shared experts' projections biases, which moec's experts do not have",
    "false",
)
_V2_METHODS = KeyCheck(
    "topk_method",
    ("greedy", "group_limited_greedy"),
    "is none of the two ways DeepSeek-V2's router chooses (greedy, group_limited_greedy): "
    "transformers' computes no top-k weights for it",
    '"greedy" or "group_limited_greedy"',
)
_MISTRAL_GROUPS = KeyCheck(
    "n_group",
    (1,),
    "ranks expert groups by the sum of their top-2 softmax scores, where moec's "
    "group_limited_greedy ranks them by the largest",
    "1",
)
_AXK2_GROUPS = KeyCheck(
    "n_group",
    (1,),
    "masks the groups left out to 0, not -inf, so that an expert there can still be chosen "
    "over one whose score plus bias is negative; moec's noaux_tc never chooses one",
    "1, or leave it out (ungrouped)",
)
_INKLING2_SCORES = KeyCheck(
    "scoring_func",
    ("sigmoid",),
    "scores the router logits with another activation (ACT2FN[scoring_func]), where moec's "
    "noaux_tc takes sigmoid scores",
    '"sigmoid"',
)
KEY_CHECKS = {
    "cohere2_moe": (
        KeyCheck(
            "expert_selection_fn",
            ("softmax", "sigmoid"),
            "is a router transformers' Cohere2-MoE block refuses (it scores with a softmax or "
            "a sigmoid only)",
            '"softmax" or "sigmoid"',
        ),
    ),
    "laguna": (
        KeyCheck(
            "moe_router_logit_softcapping",
            (0, 0.0),
            "softcaps the router logits (a tanh) before the sigmoid, which moec's router does not",
            "0 (no softcap)",
        ),
    ),
    "inkling2_text": (_INKLING2_SCORES,),
    "inkling2_loop_text": (_INKLING2_SCORES,),
    "deepseek_v2": (_MLP_BIAS, _V2_METHODS),
    "deepseek_ocr2_text": (_MLP_BIAS, _V2_METHODS),
    "unlimited_ocr_text": (_MLP_BIAS, _V2_METHODS),
    "hy_v3": (_MLP_BIAS,),
    "deepseek_v4": (_MLP_BIAS,),
    "mistral4": (_MISTRAL_GROUPS,),
    "mistral_large4_text": (_MISTRAL_GROUPS,),
    "axk2": (_AXK2_GROUPS,),
    "minimax_m2": (
        KeyCheck(
            "use_routing_bias",
            (True,),
            "is a router without a correction bias; moec's noaux_tc reads the checkpoint's one",
            "true",
        ),
        KeyCheck(
            "shared_intermediate_size",
            (0,),
            "asks for a shared expert, which MiniMax-M2's MoE block does not have",
            "0",
        ),
    ),
    "bailing_hybrid": (
        KeyCheck(
            "moe_router_enable_expert_bias",
            (True,),
            "is a router without a correction bias; moec's noaux_tc reads the checkpoint's one",
            "true",
        ),
    ),
    "mimo_v2_flash": (
        KeyCheck(
            "n_shared_experts",
            (0,),
            "asks for shared experts, which MiMo-V2-Flash's MoE block does not have",
            "0, or leave it out",
        ),
    ),
    "lfm2_moe": (
        KeyCheck(
            "norm_topk_prob",
            (False,),
            "renormalizes the top-k weights by their sum + 1e-6, where moec's norm_topk_prob "
            "divides by the sum + 1e-20 (DeepSeek's): a relative difference of about 1e-6 / sum "
            "in every weight, moec has no such epsilon",
            "false",
            default=True,
        ),
    ),
}
"""model_type -> the keys checked (the MoE keys' reader: text_config for a wrapper)."""


LAYER_LIMITS = {
    "bailing_hybrid": (
        "expert_swiglu_limit_list",
        "share_expert_swiglu_limit_list",
        "swiglu_limits",
        "swiglu_limits_shared",
    ),
}
"""model_type -> its keys of per-layer SwiGLU limits (0: no clamp), the names transformers
reads (its attribute_map's included)."""


def check_keys(reader: ConfigReader, model_type: str) -> None:
    """Record a problem for each key of KEY_CHECKS[model_type] the config sets otherwise, and
    for each per-layer SwiGLU limit (LAYER_LIMITS) that clamps."""
    for check in KEY_CHECKS.get(model_type, ()):
        value = reader.get(check.key, hint=check.hint)
        if value is None and check.default is not None:  # transformers' default is refused
            message = f"absent, so transformers' default {_literal(check.default)}, which"
            reader.problems.append(
                problem(reader.prefix + check.key, f"{message} {check.why}", check.hint)
            )
        elif value is not None and not any(
            value == allowed and type(value) is type(allowed) for allowed in check.allowed
        ):
            reader.report(check.key, value, check.why, check.hint)
    no_moe = NO_MOE_LAYERS.get(model_type)
    found = no_moe(reader) if no_moe is not None else None
    if found is not None:
        key, why = found
        reader.report(key, reader.config[key], f"leaves the model no MoE layer: {why}", NO_MOE_HINT)
    other = OTHER_MATH.get(model_type)
    differs = other(reader) if other is not None else None
    if differs is not None:
        key, default, why, hint = differs
        if reader.get(key, hint=hint) is None:
            message = f"absent, so transformers' default {json.dumps(default)}, which {why}"
            reader.problems.append(problem(reader.prefix + key, message, hint))
        else:
            reader.report(key, reader.config[key], why, hint)
    for key in LAYER_LIMITS.get(model_type, ()):
        limits = reader.get(key, hint="a list of 0 (no clamp)")
        if limits is not None and not _all_zero(limits):
            reader.report(
                key,
                limits,
                "clamps the SwiGLU with a limit per layer (0: none), and a moec spec has no "
                "per-layer limits",
                "a list of 0 (no clamp), or leave it out",
            )


def _literal(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


def _granite_hybrid_moe(reader: ConfigReader) -> tuple[str, str] | None:
    """GraniteMoeHybrid without experts (num_local_experts 0): every MLP the dense shared_mlp."""
    experts = reader.get("num_local_experts", hint="a JSON integer without quotes")
    if type(experts) is int and experts == 0:
        return "num_local_experts", "every layer's MLP is the dense shared_mlp"
    return None


def _jamba_moe(reader: ConfigReader) -> tuple[str, str] | None:
    """Jamba's MoE layers are i % expert_layer_period == expert_layer_offset, each a
    JambaSparseMoeBlock only when num_experts > 1 (else a dense JambaMLP)."""
    key = "num_experts" if "num_experts" in reader.config else "num_local_experts"
    experts = reader.get(key, hint=_INTEGER)
    if type(experts) is int and experts == 1:
        return key, "with one expert every layer's feed_forward is a dense JambaMLP"
    layers = reader.get("num_hidden_layers", JAMBA_DEFAULTS["num_hidden_layers"], _INTEGER)
    offset = reader.get("expert_layer_offset", JAMBA_DEFAULTS["expert_layer_offset"], _INTEGER)
    if type(layers) is int and type(offset) is int and 0 <= layers <= offset:
        return "num_hidden_layers", f"the MoE layers start at expert_layer_offset = {offset}"
    return None


_INTEGER = "a JSON integer without quotes"
JAMBA_DEFAULTS = {"num_hidden_layers": 32, "expert_layer_offset": 1}
"""transformers' JambaConfig values of the keys a config leaves out."""


def _cohere_average(reader: ConfigReader) -> tuple[str, Any, str, str] | None:
    """Cohere2-MoE's shared experts averaged with the routed ones (its default strategy)."""
    shared = reader.get("num_shared_experts", 0, _INTEGER)
    strategy = reader.get("shared_expert_combination_strategy", hint='"sum" or "average"')
    if type(shared) is int and shared > 0 and strategy != "sum":
        why = (
            "adds the shared experts as (routed + shared) / 2, where moec's layer computes "
            "routed + shared"
        )
        return "shared_expert_combination_strategy", "average", why, '"sum", or no shared experts'
    return None


def _hy_v3_no_shared(reader: ConfigReader) -> tuple[str, Any, str, str] | None:
    """HY-V3's shared expert is moe_intermediate_size x num_shared_experts wide, and HYV3MLP
    reads a width of 0 as unset: num_shared_experts 0 makes it intermediate_size wide."""
    shared = reader.get("num_shared_experts", hint=_INTEGER)
    if type(shared) is int and shared == 0:
        why = (
            "makes transformers' HY-V3 shared expert intermediate_size wide, not absent "
            "(HYV3MLP reads a width of 0 as unset), and moec's shared experts are "
            "n_shared_experts x moe_intermediate_size wide"
        )
        return "num_shared_experts", 1, why, "a count of at least 1"
    return None


NO_MOE_LAYERS = {"granitemoehybrid": _granite_hybrid_moe, "jamba": _jamba_moe}
"""model_type -> (the key, why) where a config leaves the model without an MoE layer."""
NO_MOE_HINT = "a config whose model has MoE layers"
OTHER_MATH = {"cohere2_moe": _cohere_average, "hy_v3": _hy_v3_no_shared}
"""model_type -> (the key, transformers' default of it, why, hint) where keys together change
the math, or a value does otherwise than it says (a KeyCheck reads one)."""


def _all_zero(limits: object) -> bool:
    """Whether `limits` is a list of zeros (numbers, not booleans)."""
    return isinstance(limits, list) and all(
        isinstance(limit, (int, float)) and not isinstance(limit, bool) and limit == 0
        for limit in limits
    )
