"""The MoE model types of transformers whose router is a plain top-k (no correction bias, no
groups) that `moec init --from-hf` reads: softmax top-k blocks without a shared expert
(Mixtral's, Qwen3-MoE's, OLMoE's, Granite's, ...), Cohere2-MoE's, Flint's and Lara-Mini's with
one added in full, LFM2-MoE's sigmoid one. hf_families.FAMILIES holds them beside the
DeepSeek-style ones; the values a key left out takes are transformers' defaults.
"""

from __future__ import annotations

from dataclasses import replace

from moec.spec.hf_family import Family

_TOP_K_ONLY = dict.fromkeys(
    ("scoring_func", "topk_method", "n_group", "topk_group", "routed_scaling_factor"), ()
)
"""The routing keys of a plain softmax top-k router (Mixtral, Qwen3-MoE, OLMoE): none."""
_SOFTMAX_TOP_K = {**_TOP_K_ONLY, "n_shared_experts": ()}
_MIXTRAL = Family(
    "softmax",
    "greedy",
    True,
    0,
    keys={
        **_SOFTMAX_TOP_K,
        "n_routed_experts": ("num_local_experts", "num_experts"),
        "moe_intermediate_size": ("intermediate_size",),
        "norm_topk_prob": (),
    },
)
"""Mixtral's block: softmax top-k, always renormalized, experts intermediate_size wide."""
_GRANITE_SHARED = (
    "is the width of the decoder layer's shared_mlp, which transformers adds beside the MoE "
    "block this spec describes (patch_model leaves it transformers' own)"
)
_GRANITE = Family(
    "softmax",
    "greedy",
    True,
    0,
    keys={**_MIXTRAL.keys, "n_routed_experts": ("num_local_experts",)},
)
"""Granite's block: the softmax of the top-k logits, which is the renormalized top-k of the
softmax (Mixtral's), under Granite's names."""
TOP_K_FAMILIES = {
    # softmax over all experts, then the top-k (renormalized: always for Mixtral, as
    # norm_topk_prob says for Qwen3-MoE and OLMoE), no shared expert
    "mixtral": _MIXTRAL,
    "minimax": _MIXTRAL,  # its block is Mixtral's (router_jitter_noise acts in training only)
    "qwen3_moe": Family(
        "softmax",
        "greedy",
        False,
        0,
        keys={**_SOFTMAX_TOP_K, "n_routed_experts": ("num_local_experts", "num_experts")},
    ),
    "olmoe": Family(
        "softmax",
        "greedy",
        False,
        0,
        keys={
            **_SOFTMAX_TOP_K,
            "n_routed_experts": ("num_experts", "num_local_experts"),
            "moe_intermediate_size": ("intermediate_size",),
        },
    ),
    # the top-k of the softmax, renormalized as norm_topk_prob says (FlexOlmo: OLMoE's
    # block and default, Mellum: Qwen3-MoE's block, renormalized by default), or never (Jamba)
    "flex_olmo": Family(
        "softmax",
        "greedy",
        False,
        0,
        keys={
            **_SOFTMAX_TOP_K,
            "n_routed_experts": ("num_experts", "num_local_experts"),
            "moe_intermediate_size": ("intermediate_size",),
        },
    ),
    "mellum": Family(
        "softmax",
        "greedy",
        True,
        0,
        keys={**_SOFTMAX_TOP_K, "n_routed_experts": ("num_local_experts", "num_experts")},
    ),
    "jamba": Family(
        "softmax",
        "greedy",
        False,
        0,
        keys={
            **_MIXTRAL.keys,
            "n_routed_experts": ("num_experts", "num_local_experts"),
            "norm_topk_prob": (),
        },
    ),
    # Qwen3-MoE's block in the Qwen3-VL-MoE text model (always renormalized) and in
    # Qwen3-Omni-MoE's thinker (as norm_topk_prob says, true by default)
    "qwen3_vl_moe_text": Family(
        "softmax",
        "greedy",
        True,
        0,
        keys={
            **_SOFTMAX_TOP_K,
            "n_routed_experts": ("num_experts", "num_local_experts"),
            "norm_topk_prob": (),
        },
    ),
    "qwen3_omni_moe_text": Family(  # its configuration reads no num_local_experts
        "softmax",
        "greedy",
        True,
        0,
        keys={**_SOFTMAX_TOP_K, "n_routed_experts": ("num_experts",)},
    ),
    # a top-k router without a bias, ungrouped, unscaled, and a shared expert added in full:
    # Cohere2-MoE's (num_shared_experts x intermediate_size wide; the softmax of the top-k
    # logits, or their sigmoid renormalized as norm_topk_prob says), Flint's (sigmoid) and
    # Lara-Mini's (softmax), renormalized as norm_topk_prob says, the shared expert sized apart
    "cohere2_moe": Family(
        "softmax",
        "greedy",
        True,
        0,
        softmax_of_top_k=True,
        keys={
            **_TOP_K_ONLY,
            "scoring_func": ("expert_selection_fn",),
            "n_routed_experts": ("num_experts",),  # its configuration reads no num_local_experts
            "n_shared_experts": ("num_shared_experts",),
            "moe_intermediate_size": ("intermediate_size",),
        },
    ),
    "flint": Family(
        "sigmoid",
        "greedy",
        True,
        0,
        shared_width=("shared_expert_intermediate_size", 1024),
        keys={**_SOFTMAX_TOP_K, "n_routed_experts": ("num_experts",), "scoring_func": ()},
    ),
    "lara_mini": Family(
        "softmax",
        "greedy",
        True,
        0,
        shared_width=("shared_expert_intermediate_size", 512),
        keys={**_SOFTMAX_TOP_K, "n_routed_experts": ("num_experts",)},
    ),
    "granitemoe": _GRANITE,
    "granitemoe_swa": replace(_GRANITE, beside={"shared_intermediate_size": _GRANITE_SHARED}),
    "granitemoeshared": replace(_GRANITE, beside={"shared_intermediate_size": _GRANITE_SHARED}),
    "granitemoehybrid": replace(_GRANITE, beside={"shared_intermediate_size": _GRANITE_SHARED}),
    # sigmoid top-k, ungrouped, with the correction bias as use_expert_bias says (noaux_tc with
    # one group, or greedy); renormalized by sum + 1e-6: refused (hf_refused), unless false
    "lfm2_moe": Family(
        "sigmoid",
        "noaux_tc",
        True,
        0,
        bias_key="use_expert_bias",
        keys={
            **dict.fromkeys(("scoring_func", "topk_method", "n_group", "topk_group"), ()),
            "n_routed_experts": ("num_experts",),
            "n_shared_experts": (),
        },
    ),
}
"""model_type -> its defaults and key names (no name: the block fixes the value)."""
