"""What each DeepSeek-style `model_type` means to `moec init --from-hf`: the router defaults a
config leaves out, the family's own names of the MoE keys, where the MoE keys live (Kimi-K2.5,
GLM-4.5V, GLM-4.6V, GLM-5-Next, DeepSeek-OCR-2, Unlimited-OCR, Mistral-Large-4: `text_config`),
and the MoE layer types of DeepSeek-V4 (`mlp_layer_types`, or the legacy `num_hash_layers`).

The values a key left out takes are transformers' defaults for that model type. The plain
top-k routers (Mixtral's, Qwen3-MoE's, Granite's, ...) are hf_topk's; the Family record itself
hf_family's.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from moec.errors import problem
from moec.spec.hf_family import Family
from moec.spec.hf_topk import TOP_K_FAMILIES
from moec.spec.hf_values import ConfigReader

# DeepseekV3Config's defaults (DeepseekV32Config's and Kimi-K2's the same)
_V3 = Family("sigmoid", "noaux_tc", True, 1, routed_scaling_factor=2.5, n_group=8, topk_group=4)
_ONE_SHARED = Family("sigmoid", "noaux_tc", True, 1)
_NO_SHARED = Family("sigmoid", "noaux_tc", True, 0)
_V2 = Family("softmax", "greedy", False, 2, greedy_ignores_groups=True)
_LINEAR_KEYS = {  # Kimi-Linear's and Ling's (bailing) names, as their config.json write them
    "n_routed_experts": ("num_experts",),
    "num_experts_per_tok": ("num_experts_per_token",),
    "n_shared_experts": ("num_shared_experts",),
    "norm_topk_prob": ("moe_renormalize",),
    "n_group": ("num_expert_group",),
}
_NUM_EXPERTS = {"n_routed_experts": ("num_experts",), "n_shared_experts": ("num_shared_experts",)}
_BOTH_NAMES = {  # Sarvam: transformers reads DeepSeek's names and the released config's
    "n_routed_experts": ("n_routed_experts", "num_experts"),
    "n_shared_experts": ("n_shared_experts", "num_shared_experts"),
}
_INKLING2 = Family(
    "sigmoid",
    "noaux_tc",
    True,
    0,
    8.0,
    scored_by_activation=True,
    activation=(
        "situ",
        (("beta", "mlp_gate_softcap", 4.0), ("linear_beta", "mlp_up_softcap", 25.0)),
    ),
    keys={
        **dict.fromkeys(("topk_method", "n_group", "topk_group", "norm_topk_prob"), ()),
        "n_shared_experts": (),
        "n_routed_experts": ("n_routed_experts", "num_local_experts"),
        "routed_scaling_factor": ("route_scale", "routed_scaling_factor"),
    },
)
"""Inkling-2's block: sigmoid scores, the top-k of scores + bias, ungrouped, always renormalized
and scaled by route_scale, no shared expert, a softcapped SwiGLU."""
FAMILIES = {
    "deepseek_v2": _V2,
    "deepseek_v3": _V3,
    "kimi_k2": _V3,
    "deepseek_v32": _V3,
    "glm4_moe": _ONE_SHARED,
    "deepseek_v4": Family(
        "sqrtsoftplus",
        "noaux_tc",
        True,
        1,
        routed_scaling_factor=1.5,
        swiglu_limit=10.0,
        scored_by_activation=True,
    ),
    # DeepSeek-V3's MoE block under another name, with the defaults of its model type
    "dots1": Family("sigmoid", "noaux_tc", False, 0),
    "glm4_moe_lite": Family("sigmoid", "noaux_tc", True, 1, routed_scaling_factor=1.8),
    "glm_moe_dsa": Family("sigmoid", "noaux_tc", True, 1, routed_scaling_factor=2.5),
    "solar_open": _ONE_SHARED,
    "glm4v_moe_text": _ONE_SHARED,
    "glm5_next_text": Family(
        "sigmoid", "noaux_tc", True, 1, routed_scaling_factor=2.5, swiglu_limit=10.0
    ),
    "mimo_v2_flash": _NO_SHARED,
    "sarvam_mla": Family("sigmoid", "noaux_tc", True, 1, 2.5, keys=_BOTH_NAMES),
    "sarvam_moe": Family("sigmoid", "noaux_tc", True, 1, 2.5, keys=_BOTH_NAMES),
    "param2moe": Family("sigmoid", "noaux_tc", True, 2, 2.5, keys=_BOTH_NAMES),  # Glm4MoeMoE
    "exaone_moe": Family("sigmoid", "noaux_tc", True, 1, 2.5, keys=_NUM_EXPERTS),
    "kimi_linear": Family(
        "sigmoid",
        "noaux_tc",
        True,
        1,
        2.446,
        keys={**_LINEAR_KEYS, "scoring_func": ("moe_router_activation_func",)},
    ),
    "bailing_hybrid": Family(
        "sigmoid",
        "noaux_tc",
        True,
        1,
        2.5,
        n_group=8,
        topk_group=4,
        keys={**_LINEAR_KEYS, "scoring_func": ("score_function",)},
    ),
    "deepseek_ocr2_text": replace(_V2, keys={"n_routed_experts": _BOTH_NAMES["n_routed_experts"]}),
    # sigmoid top-k with a correction bias, ungrouped, renormalized: noaux_tc with one group
    "afmoe": Family(
        "sigmoid",
        "noaux_tc",
        True,
        2,
        keys={
            **_NUM_EXPERTS,
            "routed_scaling_factor": ("route_scale",),
            "scoring_func": ("score_func",),
            "norm_topk_prob": ("route_norm",),
        },
    ),
    "minimax_m2": Family(
        "sigmoid",
        "noaux_tc",
        True,
        0,
        keys={
            "n_routed_experts": ("num_local_experts", "num_experts"),
            "moe_intermediate_size": ("intermediate_size",),
        },
    ),
    "unlimited_ocr_text": replace(_V2, keys={"n_routed_experts": _BOTH_NAMES["n_routed_experts"]}),
    "axk2": Family("sigmoid", "noaux_tc", True, 1, 2.5),  # grouped: refused (hf_refused)
    "hy_v3": Family(
        "sigmoid",
        "noaux_tc",
        True,
        1,
        2.826,
        keys={
            "n_routed_experts": ("num_experts", "num_local_experts"),
            "n_shared_experts": ("num_shared_experts",),
            "routed_scaling_factor": ("router_scaling_factor",),
        },
    ),
    # softmax top-k without a bias; grouped routers rank groups otherwise (refused)
    "mistral4": Family("softmax", "greedy", True, 1),
    "mistral_large4_text": Family("softmax", "greedy", True, 1),
    # softmax top-k, renormalized, and one shared expert as wide as the routed ones
    "hunyuan_v1_moe": Family(
        "softmax",
        "greedy",
        True,
        1,
        keys={
            "n_routed_experts": ("num_experts",),
            "num_experts_per_tok": ("moe_topk",),
            "moe_intermediate_size": ("intermediate_size",),
            "n_shared_experts": (),
        },
    ),
    # DeepSeek-V3's MoE block under other names: MiniCPM-5's with its defaults, Beam's without
    # a shared expert (it scales the experts' sum, not their weights: the same sum)
    "minicpm5_moe": Family(
        "sigmoid",
        "noaux_tc",
        True,
        1,
        3.66,
        keys={"n_routed_experts": ("n_routed_experts", "num_local_experts")},
    ),
    "beam": Family(
        "sigmoid",
        "noaux_tc",
        True,
        0,
        2.5,
        n_group=8,
        topk_group=4,
        keys={"n_routed_experts": ("num_experts",), "n_shared_experts": ()},
    ),
    "inkling2_text": _INKLING2,
    "inkling2_loop_text": _INKLING2,
    # sigmoid noaux_tc, ungrouped, renormalized, the experts' sum scaled; one shared expert of
    # shared_intermediate_size; every expert's SwiGLU GPT-OSS's, clamped at swiglu_limit
    "minimax_m3_vl_text": Family(
        "sigmoid",
        "noaux_tc",
        True,
        0,
        2.0,
        shared_width=("shared_intermediate_size", 3072),
        activation=(
            "oai_swiglu",
            (("alpha", "swiglu_alpha", 1.702), ("limit", "swiglu_limit", 7.0)),
        ),
        keys={
            **dict.fromkeys(("topk_method", "n_group", "topk_group", "norm_topk_prob"), ()),
            "scoring_func": (),
            "n_shared_experts": (),
            "n_routed_experts": ("num_local_experts", "num_experts"),
            "moe_intermediate_size": ("intermediate_size",),
        },
    ),
    # DeepSeek-V3's router with shared experts sized apart: dots3's n_shared_experts of
    # shared_experts_intermediate_size, Laguna's one of shared_expert_intermediate_size
    # (ungrouped, always renormalized, the experts' sum scaled by moe_routed_scaling_factor)
    "dots3_note_text": Family(
        "sigmoid",
        "noaux_tc",
        True,
        1,
        shared_width=("shared_experts_intermediate_size", 1536),
        keys={"n_routed_experts": ("n_routed_experts", "num_local_experts")},
    ),
    "laguna": Family(
        "sigmoid",
        "noaux_tc",
        True,
        0,
        shared_width=("shared_expert_intermediate_size", 512),
        keys={
            **dict.fromkeys(("topk_method", "n_group", "topk_group", "norm_topk_prob"), ()),
            "scoring_func": (),
            "n_shared_experts": (),
            "n_routed_experts": ("num_experts",),
            "routed_scaling_factor": ("moe_routed_scaling_factor",),
        },
    ),
    **TOP_K_FAMILIES,
}

_LOCAL_EXPERTS: dict[str, tuple[str, ...]] = {"n_routed_experts": ("num_local_experts",)}
ALIASES: dict[str, dict[str, tuple[str, ...]]] = {
    "deepseek_v2": {"n_routed_experts": ("num_experts",)},
    "deepseek_v32": {"n_routed_experts": ("num_local_experts", "num_experts")},
    "deepseek_v4": {**_LOCAL_EXPERTS, "moe_intermediate_size": ("intermediate_size",)},
    "inkling2_text": {"moe_intermediate_size": ("intermediate_size",)},
    "inkling2_loop_text": {"moe_intermediate_size": ("intermediate_size",)},
    **dict.fromkeys(
        (
            "deepseek_v3",
            "glm4_moe",
            "dots1",
            "glm4_moe_lite",
            "glm_moe_dsa",
            "solar_open",
            "glm4v_moe_text",
            "glm5_next_text",
            "mimo_v2_flash",
            "sarvam_mla",
            "sarvam_moe",
            "param2moe",
            "axk2",
            "mistral4",
            "mistral_large4_text",
        ),
        _LOCAL_EXPERTS,
    ),
}
"""The other names a model type's transformers config reads for a key (its `attribute_map`;
DeepSeek-V3.2's `num_experts`, which its config re-routes), after the family's own: a
config.json that writes only such a name is read as transformers reads it."""
_TOP_K_LOGITS = ("mixtral", "minimax", "qwen3_moe", "olmoe", "flex_olmo", "mellum", "jamba")
ROUNDING: dict[str, str] = {
    **dict.fromkeys(_TOP_K_LOGITS, "logits"),
    **dict.fromkeys(("qwen3_vl_moe_text", "qwen3_omni_moe_text", "cohere2_moe"), "logits"),
    **dict.fromkeys(("granitemoe", "granitemoe_swa", "granitemoeshared"), "logits"),
    **dict.fromkeys(("granitemoehybrid", "afmoe", "laguna"), "logits"),
    **dict.fromkeys(("minimax_m2", "minimax_m3_vl_text"), "logits"),
    **dict.fromkeys(("deepseek_v4", "mistral4", "lfm2_moe"), "all"),
}
"""model_type -> the router.rounding of its transformers router, where that computes in the
model dtype (every other model type's gate is fp32; init names it in a comment): "logits" where the gate GEMM's output is in the model
dtype and the scoring in fp32 (F.linear(x, W) then softmax(dtype=float32)), "all" where the
scoring and the weights are too (DeepSeek-V4's ACT2FN[scoring_func] of bf16 logits)."""
FAMILIES = {
    model_type: replace(
        family,
        rounding=ROUNDING.get(model_type, "none"),
        keys={
            **family.keys,
            **{
                key: tuple(dict.fromkeys((*family.keys.get(key, (key,)), *names)))
                for key, names in ALIASES.get(model_type, {}).items()
            },
        },
    )
    for model_type, family in FAMILIES.items()
}
"""model_type -> its defaults and key names (no name: the block fixes the value)."""
WRAPPERS = {
    "kimi_k25": ("deepseek_v3", "kimi_k2"),
    "glm4v_moe": ("glm4v_moe_text",),
    "glm46v": ("glm4v_moe_text",),
    "glm5_next": ("glm5_next_text",),
    "deepseek_ocr2": ("deepseek_ocr2_text",),
    "unlimited_ocr": ("unlimited_ocr_text",),
    "mistral_large4": ("mistral_large4_text",),
    "qwen3_vl_moe": ("qwen3_vl_moe_text",),
    "qwen3_omni_moe_thinker": ("qwen3_omni_moe_text",),
    "inkling2": ("inkling2_text",),
    "inkling2_loop": ("inkling2_loop_text",),
    "minimax_m3_vl": ("minimax_m3_vl_text",),
    "dots3_note": ("dots3_note_text",),
}
"""model_type whose MoE keys sit in `text_config` -> the MoE text model types it may hold (the
first when `text_config` names none, as transformers does, unless WRAPPER_DEFAULTS says)."""
WRAPPER_DEFAULTS = {"glm46v": "glm4v_text"}
"""The text model transformers builds when `text_config` names none, where it has no MoE."""
KNOWN_TYPES = (*FAMILIES, *WRAPPERS)

LAYER_TYPES = ("moe", "hash_moe")
"""DeepSeek-V4's MoE layer types (transformers' `mlp_layer_types` values)."""
V4_DEFAULT_LAYERS = 43
V4_DEFAULT_HASH_LAYERS = 3
"""transformers' DeepseekV4Config defaults: `num_hidden_layers`, and the first layers that
are hash_moe when a config gives neither `mlp_layer_types` nor `num_hash_layers`."""
HASH_ELSEWHERE = "hash-routed layers (tid2eid[input_ids] chooses the experts) are DeepSeek-V4's"


@dataclass(frozen=True)
class Source:
    """Where the MoE keys of a config are read."""

    model_type: str
    """The text model's type (for Kimi-K2.5, text_config's)."""
    reader: ConfigReader
    """The keys of the MoE layer (the config, or its text_config)."""
    outer: ConfigReader
    """The config itself: dtype, quantization and name fall back to it."""


def moe_source(reader: ConfigReader, model_type: str) -> Source | None:
    """The reader of the MoE keys; None (a problem recorded) when text_config is unusable."""
    if model_type not in WRAPPERS:
        return Source(model_type, reader, reader)
    text = reader.table("text_config", "model", required=True)
    if text is None:
        return None
    inner = ConfigReader(text, reader.set_keys, "text_config.", reader.problems)
    allowed = WRAPPERS[model_type]
    inner_type = inner.text("model_type", "model")
    if inner_type is None and model_type in WRAPPER_DEFAULTS:
        inner.problems.append(
            problem(
                "text_config.model_type",
                f"absent, so the text model of {model_type} is {WRAPPER_DEFAULTS[model_type]}, "
                "which has no MoE layers",
                f'"{allowed[0]}" for its MoE text model',
            )
        )
        return None
    if inner_type is None:
        inner_type = allowed[0]
    elif inner_type not in allowed:
        inner.report(
            "model_type",
            inner_type,
            f"is not a text model {model_type} holds",
            " or ".join(allowed),
        )
        return None
    return Source(inner_type, inner, reader)


def reader_of(source: Source, *keys: str) -> ConfigReader:
    """The reader holding one of `keys`: the MoE keys', or else the outer config's (dtype,
    quantization: Kimi-K2.5 may write them beside text_config)."""
    if any(source.reader.config.get(key) is not None for key in keys):
        return source.reader
    return source.outer


def check_layer_type(source: Source, layer_type: str | None) -> str | None:
    """The MoE layer type the spec describes ("moe" or "hash_moe"): the config's only one, or
    the one `layer_type` (`--layer-type`) picks; None, with a problem recorded, when the config
    has both and none is picked, or hash layers on a model type without them."""
    reader = source.reader
    if source.model_type != "deepseek_v4":
        if layer_type is not None:
            reader.report(
                "model_type",
                source.model_type,
                f"has one MoE layer type: --layer-type {layer_type} is for deepseek_v4 configs",
                "leave --layer-type out",
            )
        hashed = reader.integer("num_hash_layers", "router.topk_method")
        if hashed:  # a V4 key on another model type: its layers would be hash-routed
            reader.report(
                "num_hash_layers",
                hashed,
                f"asks for hash-routed layers, which {source.model_type} models do not have "
                f"({HASH_ELSEWHERE})",
                "remove it, or model_type deepseek_v4",
            )
            return None
        return "moe"
    key, counts = _v4_layer_counts(reader)
    if counts is None:
        return None
    if layer_type is None:
        present = [name for name in LAYER_TYPES if counts[name]]
        if len(present) > 1:
            message = (
                f"holds {counts['hash_moe']} hash_moe and {counts['moe']} moe layers, and a "
                "spec describes one layer type"
            )
            hint = "--layer-type moe for the routed layers, hash_moe for the hash-routed ones"
            _report(reader, key, message, hint)
            return None
        return present[0] if present else "moe"
    if not counts[layer_type]:
        others = " or ".join(name for name in LAYER_TYPES if counts[name])
        _report(reader, key, f"has no {layer_type} layer", f"--layer-type {others}")
        return None
    return layer_type


def _report(reader: ConfigReader, key: str, message: str, hint: str) -> None:
    """A layer-type problem, showing the key's value when the config writes it."""
    value = reader.config.get(key)
    if value is None:  # transformers' default schedule
        message = f"absent, so the first {V4_DEFAULT_HASH_LAYERS} layers are hash_moe: {message}"
        reader.problems.append(problem(reader.prefix + key, message, hint))
    else:
        reader.report(key, value, message, hint)


def _v4_layer_counts(reader: ConfigReader) -> tuple[str, dict[str, int] | None]:
    """(the key the layer types come from, {layer type: count}); None when it is unusable."""
    layers = reader.integer("num_hidden_layers", "num_hidden_layers")
    written = reader.config.get("num_hidden_layers") is not None
    if written and (layers is None or layers <= 0):  # recorded, or check_moe_layers says why
        return "num_hidden_layers", None
    layers = V4_DEFAULT_LAYERS if layers is None else layers
    if reader.config.get("mlp_layer_types") is not None:
        types = reader.config["mlp_layer_types"]
        if not isinstance(types, list) or not all(item in LAYER_TYPES for item in types):
            reader.report(
                "mlp_layer_types",
                types,
                "is not a list of DeepSeek-V4 MoE layer types",
                'a list of "moe" and "hash_moe"',
            )
            return "mlp_layer_types", None
        if len(types) < layers:  # transformers' validate_layer_type refuses it
            reader.report(
                "mlp_layer_types",
                types,
                f"has {len(types)} entries, fewer than the model's num_hidden_layers = {layers}",
                "one entry per layer (transformers reads the first num_hidden_layers)",
            )
            return "mlp_layer_types", None
        types = types[:layers]  # as transformers' __post_init__ cuts it
        return "mlp_layer_types", {name: types.count(name) for name in LAYER_TYPES}
    hashed = reader.integer("num_hash_layers", "router.topk_method")
    hashed = min(max(V4_DEFAULT_HASH_LAYERS if hashed is None else hashed, 0), layers)
    key = "num_hash_layers" if "num_hash_layers" in reader.config else "mlp_layer_types"
    return key, {"hash_moe": hashed, "moe": layers - hashed}
