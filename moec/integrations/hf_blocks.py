"""The transformers MoE blocks `patch_model` replaces, and what each one computes where it
differs from its config.

A transformers router does not always read every routing key its config.json carries:
DeepseekV2's always scores with a softmax and never renormalizes, DeepseekV3's always scores
with a sigmoid and chooses as noaux_tc, DeepSeek-V4's always renormalizes, ungrouped. moec's
spec follows the config (as DeepSeek's and SGLang's code do), so a config that sets such a key
otherwise would make the patched model compute something else than the model it patches.
`expected_keys` says, per block, what the block computes; `patch_model` follows it (and says
so) unless the caller asks to follow the config.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from moec.errors import MoecError, problem


@dataclass(frozen=True)
class Fixed:
    """A spec key whose value a transformers block fixes, whatever its config says."""

    path: str
    """Spec key, e.g. "router.norm_topk_prob"."""
    value: Any
    """What the block computes with."""
    does: str
    """What the block does, in words: "never renormalizes the top-k weights"."""
    quiet: bool = False
    """No config key says it (the router's precision): set without a note, and absent from the
    config's reading."""


@dataclass(frozen=True)
class Block:
    """One transformers MoE block class."""

    module: str
    """Under transformers.models."""
    name: str
    """The class."""
    router: str
    """The router class, as messages name it."""
    fixed: tuple[Fixed, ...] = field(default=())
    clamps: bool = False
    """Whether its experts clamp their SwiGLU at the config's swiglu_limit (DeepSeek-V4's,
    GLM-5-Next's); every other block ignores the key."""
    own_activation: bool = False
    """Whether its experts compute an activation of their own that the config's keys say in full
    (Inkling-2's softcapped SwiGLU): neither silu nor a clamp is fixed."""

    @property
    def computes(self) -> tuple[Fixed, ...]:
        """Every key the block fixes: `fixed`, and the plain SwiGLU of one that never clamps."""
        if self.clamps or self.own_activation:
            return self.fixed
        return (*self.fixed, _NO_CLAMP)


_NO_CLAMP = Fixed("activation.kind", "silu", "never clamps its SwiGLU (it reads no swiglu_limit)")


_SIGMOID = Fixed("router.scoring_func", "sigmoid", "always scores with a sigmoid")
_NOAUX = Fixed("router.topk_method", "noaux_tc", "always chooses as noaux_tc, with the bias")
_V3_LIKE = (_SIGMOID, _NOAUX)
_SOFTMAX = Fixed("router.scoring_func", "softmax", "always scores with a softmax")
_GREEDY = Fixed("router.topk_method", "greedy", "always chooses the top-k, without a bias")
_NEVER_RENORMALIZES = "never renormalizes the top-k weights"
_V2_LIKE = (_SOFTMAX, Fixed("router.norm_topk_prob", False, _NEVER_RENORMALIZES))
_RENORMALIZED = Fixed("router.norm_topk_prob", True, "always renormalizes the top-k weights")
_UNGROUPED = (
    Fixed("router.n_group", 1, "chooses among all experts, ungrouped"),
    Fixed("router.topk_group", 1, "chooses among all experts, ungrouped"),
    _RENORMALIZED,
)
"""An ungrouped, renormalizing router (every block that fixes its groups renormalizes too)."""
_NO_SHARED = Fixed("model.n_shared_experts", 0, "has no shared experts")
_ROUNDS_LOGITS = Fixed(
    "router.rounding",
    "logits",
    "computes its logits in the model dtype (fp32 scores from them)",
    quiet=True,
)
_ROUNDS_ALL = Fixed(
    "router.rounding",
    "all",
    "computes its logits, scores and weights in the model dtype",
    quiet=True,
)
"""The precision of the block's router (no config key says it): patch_model's spec from the
config takes it without a warning; a spec given to patch_model keeps its own."""


def _v3(model: str, prefix: str, block: str = "MoE", extra: tuple[Fixed, ...] = ()) -> Block:
    """A copy of DeepseekV3MoE (transformers' modular models) under model `model`'s names."""
    module = f"{model}.modeling_{model.split('.')[-1]}"
    return Block(module, f"{prefix}{block}", f"{prefix}TopkRouter", (*_V3_LIKE, *extra))


_NEVER_SCALES = Fixed("router.routed_scaling_factor", 1.0, "never scales the top-k weights")


def _top_k(
    model: str, prefix: str, extra: tuple[Fixed, ...] = (), block: str = "SparseMoeBlock"
) -> Block:
    """A softmax top-k block without a shared expert (Mixtral's, Qwen3-MoE's, OLMoE's, and
    Granite's, which takes the softmax of the top-k logits: the same weights)."""
    fixed = (_SOFTMAX, _GREEDY, *_UNGROUPED[:2], _NEVER_SCALES, _NO_SHARED, _ROUNDS_LOGITS, *extra)
    module = f"{model}.modeling_{model}"
    return Block(module, f"{prefix}{block}", f"{prefix}TopKRouter", fixed)


BLOCKS = (
    Block("deepseek_v3.modeling_deepseek_v3", "DeepseekV3MoE", "DeepseekV3TopkRouter", _V3_LIKE),
    Block("deepseek_v2.modeling_deepseek_v2", "DeepseekV2Moe", "DeepseekV2TopkRouter", _V2_LIKE),
    Block(
        "deepseek_v32.modeling_deepseek_v32", "DeepseekV32MoE", "DeepseekV32TopkRouter", _V3_LIKE
    ),
    Block("glm4_moe.modeling_glm4_moe", "Glm4MoeMoE", "Glm4MoeTopkRouter", _V3_LIKE),
    Block(
        "deepseek_v4.modeling_deepseek_v4",
        "DeepseekV4SparseMoeBlock",
        "DeepseekV4TopKRouter",
        (
            _NOAUX,
            Fixed("router.n_group", 1, "chooses among all experts, ungrouped"),
            Fixed("router.topk_group", 1, "chooses among all experts, ungrouped"),
            Fixed("router.norm_topk_prob", True, "always renormalizes the top-k weights"),
            Fixed("model.n_shared_experts", 1, "holds one shared expert of moe_intermediate_size"),
            _ROUNDS_ALL,
        ),
        clamps=True,
    ),
    _v3("dots1", "Dots1"),
    _v3("glm4_moe_lite", "Glm4MoeLite"),
    _v3("glm_moe_dsa", "GlmMoeDsa"),
    _v3("solar_open", "SolarOpen"),
    _v3("glm4v_moe", "Glm4vMoeText"),
    replace(_v3("glm5_next", "Glm5NextText"), clamps=True),
    _v3("kimi_linear", "KimiLinear"),
    _v3("bailing_hybrid", "BailingHybrid"),
    _v3("exaone_moe", "ExaoneMoe", "SparseMoEBlock"),
    _v3("mimo_v2_flash", "MiMoV2Flash", extra=(_NO_SHARED,)),
    Block(
        "deepseek_ocr2.modeling_deepseek_ocr2",
        "DeepseekOcr2TextMoe",
        "DeepseekOcr2TextTopkRouter",
        _V2_LIKE,
    ),
    Block(
        "afmoe.modeling_afmoe",
        "AfmoeSparseMoeBlock",
        "AfmoeTokenChoiceRouter",
        (*_V3_LIKE, *_UNGROUPED, _ROUNDS_LOGITS),
    ),
    _v3("axk2", "AXK2"),
    Block(
        "unlimited_ocr.modeling_unlimited_ocr",
        "UnlimitedOcrTextMoe",
        "UnlimitedOcrTextTopkRouter",
        _V2_LIKE,
    ),
    Block(
        "hy_v3.modeling_hy_v3",
        "HYV3MoE",
        "HYV3TopKRouter",
        (*_V3_LIKE, *_UNGROUPED),
    ),
    Block(
        "mistral4.modeling_mistral4",
        "Mistral4MoE",
        "Mistral4TopkRouter",
        (_SOFTMAX, _GREEDY, _ROUNDS_ALL),
    ),
    Block(
        "mistral_large4.modeling_mistral_large4",
        "MistralLarge4TextMoE",
        "MistralLarge4TextTopkRouter",
        (_SOFTMAX, _GREEDY, _RENORMALIZED),
    ),
    Block(
        "hunyuan_v1_moe.modeling_hunyuan_v1_moe",
        "HunYuanMoEV1Moe",
        "HunYuanMoEV1Gate",
        (
            _SOFTMAX,
            _GREEDY,
            *_UNGROUPED,
            Fixed("router.routed_scaling_factor", 1.0, "never scales the top-k weights"),
            Fixed("model.n_shared_experts", 1, "holds one shared expert of intermediate_size"),
        ),
    ),
    _v3("minicpm5_moe", "MiniCPM5Moe"),
    Block("beam.modeling_beam", "BeamMoE", "BeamTopKRouter", (*_V3_LIKE, _NO_SHARED)),
    _top_k("mixtral", "Mixtral", (_RENORMALIZED,)),
    _top_k("qwen3_moe", "Qwen3Moe"),
    _top_k("olmoe", "Olmoe"),
    _top_k("minimax", "MiniMax", (_RENORMALIZED,)),
    _top_k("flex_olmo", "FlexOlmo"),
    _top_k("mellum", "Mellum"),
    _top_k("jamba", "Jamba", (Fixed("router.norm_topk_prob", False, _NEVER_RENORMALIZES),)),
    _top_k("qwen3_vl_moe", "Qwen3VLMoeText", (_RENORMALIZED,)),
    replace(
        _top_k("qwen3_omni_moe", "Qwen3OmniMoeThinkerText"),
        router="Qwen3OmniMoeThinkerTextTopKRouter",
    ),
    Block(
        "cohere2_moe.modeling_cohere2_moe",
        "Cohere2MoeSparseMoeBlock",
        "Cohere2MoeTopKRouter",
        (_GREEDY, *_UNGROUPED[:2], _NEVER_SCALES, _ROUNDS_LOGITS),
    ),
    Block(
        "flint.modeling_flint",
        "FlintSparseMoeBlock",
        "FlintTopKRouter",
        (_SIGMOID, _GREEDY, *_UNGROUPED[:2], _NEVER_SCALES),
    ),
    Block(
        "lara_mini.modeling_lara_mini",
        "LaraMiniSparseMoeBlock",
        "LaraMiniTopKRouter",
        (_SOFTMAX, _GREEDY, *_UNGROUPED[:2], _NEVER_SCALES),
    ),
    Block(
        "inkling2.modeling_inkling2",
        "Inkling2SparseMoeBlock",
        "Inkling2TopKRouter",
        (*_V3_LIKE, *_UNGROUPED, _NO_SHARED),
        own_activation=True,
    ),
    Block(
        "inkling2_loop.modeling_inkling2_loop",
        "Inkling2LoopSparseMoeBlock",
        "Inkling2LoopTopKRouter",
        (*_V3_LIKE, *_UNGROUPED, _NO_SHARED),
        own_activation=True,
    ),
    Block(
        "minimax_m3_vl.modeling_minimax_m3_vl",
        "MiniMaxM3VLSparseMoeBlock",
        "MiniMaxM3VLTopKRouter",
        (*_V3_LIKE, *_UNGROUPED, _ROUNDS_LOGITS),
        own_activation=True,
    ),
    _v3("dots3_note", "Dots3NoteText"),
    Block(
        "laguna.modeling_laguna",
        "LagunaSparseMoeBlock",
        "LagunaTopKRouter",
        (*_V3_LIKE, *_UNGROUPED, _ROUNDS_LOGITS),
    ),
    _top_k("granitemoe", "GraniteMoe", (_RENORMALIZED,), "MoE"),
    _top_k("granitemoe_swa", "GraniteMoeSWA", (_RENORMALIZED,), "MoE"),
    _top_k("granitemoeshared", "GraniteMoeShared", (_RENORMALIZED,), "MoE"),
    _top_k("granitemoehybrid", "GraniteMoeHybrid", (_RENORMALIZED,), "MoE"),
    Block(
        "lfm2_moe.modeling_lfm2_moe",
        "Lfm2MoeSparseMoeBlock",
        "Lfm2MoeTopKRouter",
        (_SIGMOID, *_UNGROUPED[:2], _NO_SHARED, _ROUNDS_ALL),
    ),
    Block(
        "minimax_m2.modeling_minimax_m2",
        "MiniMaxM2SparseMoeBlock",
        "MiniMaxM2TopKRouter",
        (
            *_V3_LIKE,
            *_UNGROUPED,
            Fixed("router.routed_scaling_factor", 1.0, "never scales the top-k weights"),
            _NO_SHARED,
            _ROUNDS_LOGITS,
        ),
    ),
)
"""Every block patch_model replaces (Kimi-K2 and Kimi-K2.5 hold DeepseekV3MoE blocks, Sarvam's
sarvam_mla DeepseekV3MoE ones, sarvam_moe and param2moe Glm4MoeMoE ones; GLM-4.6V holds GLM-4.5V's).
Granite's shared_mlp, Jamba's and GraniteMoeHybrid's Mamba layers sit beside the MoE blocks and
stay transformers' own."""
ROUTER_KEYS = ("transformers", "config")
"""patch_model's `router_keys`: follow what the transformers block computes, or the config."""


def block_of(name: str) -> Block:
    return next(block for block in BLOCKS if block.name == name)


_HELD_BY = {
    "kimi_k2": "DeepseekV3MoE",
    "sarvam_mla": "DeepseekV3MoE",
    "sarvam_moe": "Glm4MoeMoE",
    "param2moe": "Glm4MoeMoE",
}
"""Model types whose models hold another model type's block (see BLOCKS)."""


def block_of_type(model_type: str) -> Block | None:
    """The MoE block transformers builds for a (text) model type: the block of the models
    folder of its name ("glm4v_moe_text": glm4v_moe's), or the one _HELD_BY names; None for
    a model type of no block here."""
    if model_type in _HELD_BY:
        return block_of(_HELD_BY[model_type])
    folder = model_type.removesuffix("_text")
    return next((block for block in BLOCKS if block.module.split(".")[0] == folder), None)


def ignored_keys(block: Block, raw: dict[str, Any]) -> list[tuple[Fixed, Any]]:
    """(fixed key, the config's value) for each key of `raw` (spec data from the config) that
    the block computes otherwise."""
    found = []
    hashed = raw["router"]["topk_method"] == "hash"  # V4's hash_moe layer: the table chooses
    for fixed in block.computes:
        if hashed and fixed.path == "router.topk_method":
            continue
        table, key = fixed.path.split(".")
        section = raw.get(table, {"kind": "silu"})  # no activation table: silu
        value = section.get(key) if fixed.quiet else section[key]
        if value != fixed.value:
            found.append((fixed, value))
    return found


def follow_block(block: Block, raw: dict[str, Any]) -> list[str]:
    """Set the keys of `raw` the block fixes to what it computes; one sentence for each key
    that changed (empty when the config agrees with the block)."""
    notes = []
    for fixed, config_value in ignored_keys(block, raw):
        table, key = fixed.path.split(".")
        if fixed is _NO_CLAMP:  # silu: no activation table
            limit = raw.pop(table)["swiglu_limit"]
            notes.append(
                f"swiglu_limit = {literal(limit)} in the config, but {block.name} "
                f"{fixed.does} (silu)"
            )
            continue
        raw[table][key] = fixed.value
        if fixed.quiet:
            continue
        notes.append(
            f"{key} = {literal(config_value)} in the config, but {block.router} {fixed.does} "
            f"({key} = {literal(fixed.value)})"
        )
    return notes


def literal(value: Any) -> str:
    """A value as a spec writes it: true, "sigmoid", 1.5."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return f'"{value}"' if isinstance(value, str) else repr(value)


def spec_per_layer_type(spec, groups: dict[str, list[str]]) -> dict:
    """{layer type: the spec given for it, or None}: one spec for a model of one layer type,
    a mapping by layer type for DeepSeek-V4's two; MoecError otherwise."""
    if isinstance(spec, Mapping):
        if set(spec) != set(groups):
            raise MoecError(
                [
                    problem(
                        "spec",
                        f"names the layer types {sorted(spec)}, and the model has {sorted(groups)}",
                        "a spec for each of them, or spec=None for specs from the config",
                    )
                ],
                kind="usage",
            )
        return dict(spec)
    if spec is not None and len(groups) > 1:
        raise MoecError(
            [
                problem(
                    "spec",
                    f"describes one MoE layer type, and the model has {len(groups['moe'])} "
                    f"moe and {len(groups['hash_moe'])} hash_moe layers",
                    '{"moe": spec, "hash_moe": spec}, or spec=None for specs from the config',
                )
            ],
            kind="usage",
        )
    return dict.fromkeys(groups, spec)
