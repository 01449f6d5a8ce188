"""The router and shared-expert defaults of one MoE model type, and its names of the config
keys (hf_families.FAMILIES: model_type -> Family)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from moec.spec.hf_values import JSON_NULL, ConfigReader


@dataclass(frozen=True)
class Family:
    """The router and shared-expert defaults of one model type, and its names of the keys."""

    scoring_func: str
    topk_method: str
    norm_topk_prob: bool
    n_shared_experts: int
    """When the config leaves it out."""
    routed_scaling_factor: float = 1.0
    n_group: int = 1
    topk_group: int = 1
    swiglu_limit: float | None = None
    """The clamp of a config that leaves `swiglu_limit` out (DeepSeek-V4, GLM-5-Next: 10);
    None: the model type's MoE block never clamps (it reads no swiglu_limit), whatever the
    config says."""
    keys: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """DeepSeek's name of a key -> the names this model type's config takes for it (the
    names transformers reads, its `attribute_map` included); a key not here is DeepSeek's; no
    name: the model type has no such key (its MoE block fixes the value, the default)."""
    bias_key: str | None = None
    """The boolean key that says whether the router has a correction bias (LFM2-MoE's
    use_expert_bias): false makes `topk_method` greedy, without one."""
    shared_width: tuple[str, int] | None = None
    """(the key of the shared expert's own width, transformers' default of it) where the config
    sizes it apart (Flint's, Lara-Mini's shared_expert_intermediate_size): n_shared_experts is
    that width over moe_intermediate_size, refused where it is no multiple."""
    softmax_of_top_k: bool = False
    """Whether the router takes the softmax of the top-k logits (Cohere2-MoE's): with softmax
    scores the top-k weights are renormalized whatever norm_topk_prob says."""
    activation: tuple[str, tuple[tuple[str, str, float], ...]] | None = None
    """(moec's activation kind, its keys as (spec key, config key, transformers' default)) where
    the experts compute a gated activation of their own, whatever hidden_act says: Inkling-2's
    softcapped SwiGLU (situ), MiniMax-M3's clamped GPT-OSS SwiGLU (oai_swiglu)."""
    scored_by_activation: bool = False
    """Whether the router scores with the activation scoring_func names (transformers'
    ACT2FN[scoring_func]: DeepSeek-V4's, Inkling-2's): softmax is none, so transformers builds
    no layer of a config that asks for it."""
    greedy_ignores_groups: bool = False
    """Whether the router reads n_group / topk_group only for group_limited_greedy (DeepSeek-V2's),
    so that a greedy config's groups are unused, not refused."""
    rounding: str = "none"
    """router.rounding: what the model type's transformers router rounds to the model dtype
    (hf_families.ROUNDING)."""
    beside: Mapping[str, str] = field(default_factory=dict)
    """A config key of a module beside the MoE block, which the spec does not describe ->
    what it is (Granite's shared_mlp), noted in the spec init writes when the config sets it."""

    @property
    def clamps(self) -> bool:
        """Whether the model type's MoE block clamps its SwiGLU at the config's swiglu_limit."""
        return self.swiglu_limit is not None

    def reads(self, name: str) -> bool:
        """Whether this model type's config has a key for DeepSeek's `name`."""
        return self.keys.get(name, (name,)) != ()

    def key(self, reader: ConfigReader, name: str) -> str:
        """The config key that holds DeepSeek's `name`: the one of this family's names the
        config writes (a problem when it writes two with different values, a null among them),
        else the first; a name written null only is returned, for the reader to judge."""
        names = self.keys.get(name, (name,))
        # a null is written too: transformers reads an alias's null over the other name's value
        written = [key for key in names if key in reader.config]
        values = {json.dumps(reader.config[key], sort_keys=True) for key in written}
        if len(values) > 1:
            first = f"{written[0]} = {json.dumps(reader.config[written[0]])}"
            second = reader.config[written[1]]
            reader.report(
                written[1],
                JSON_NULL if second is None else second,
                f"says otherwise than {first}: two names of one key",
                f"one of {' or '.join(written)}",
            )
        present = [key for key in written if reader.config[key] is not None]
        return (present or written or names)[0]
