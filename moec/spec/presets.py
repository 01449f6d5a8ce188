"""Known models. A preset fills every key the spec leaves out; explicit keys win.

Values are from each model's published `config.json`.
"""

from __future__ import annotations

from typing import Any

_DEEPSEEK_V3: dict[str, dict[str, Any]] = {
    "model": {
        "hidden_size": 7168,
        "moe_intermediate_size": 2048,
        "n_routed_experts": 256,
        "num_experts_per_tok": 8,
        "n_shared_experts": 1,
    },
    "router": {
        "scoring_func": "sigmoid",
        "topk_method": "noaux_tc",
        "n_group": 8,
        "topk_group": 4,
        "norm_topk_prob": True,
        "routed_scaling_factor": 2.5,
    },
    "quant": {"scheme": "fp8_block"},
}

PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "deepseek-v3": _DEEPSEEK_V3,
    "deepseek-r1": _DEEPSEEK_V3,
    "deepseek-v2": {
        "model": {
            "hidden_size": 5120,
            "moe_intermediate_size": 1536,
            "n_routed_experts": 160,
            "num_experts_per_tok": 6,
            "n_shared_experts": 2,
        },
        "router": {
            "scoring_func": "softmax",
            "topk_method": "group_limited_greedy",
            "n_group": 8,
            "topk_group": 3,
            "norm_topk_prob": False,
            "routed_scaling_factor": 16.0,
        },
    },
    "deepseek-v2-lite": {
        "model": {
            "hidden_size": 2048,
            "moe_intermediate_size": 1408,
            "n_routed_experts": 64,
            "num_experts_per_tok": 6,
            "n_shared_experts": 2,
        },
        "router": {
            "scoring_func": "softmax",
            "topk_method": "greedy",
            "n_group": 1,
            "topk_group": 1,
            "norm_topk_prob": False,
            "routed_scaling_factor": 1.0,
        },
    },
    "kimi-k2": {
        "model": {
            "hidden_size": 7168,
            "moe_intermediate_size": 2048,
            "n_routed_experts": 384,
            "num_experts_per_tok": 8,
            "n_shared_experts": 1,
        },
        "router": {
            "scoring_func": "sigmoid",
            "topk_method": "noaux_tc",
            "n_group": 1,
            "topk_group": 1,
            "norm_topk_prob": True,
            "routed_scaling_factor": 2.827,
        },
        "quant": {"scheme": "fp8_block"},
    },
}


def apply_preset(raw: dict[str, Any], preset: str) -> tuple[dict[str, Any], set[str]]:
    """Fill `raw` (a parsed spec) from `preset`; return it and the key paths the preset set."""
    filled = {
        table: dict(values) if isinstance(values, dict) else values for table, values in raw.items()
    }
    from_preset: set[str] = set()
    for table, values in PRESETS[preset].items():
        current = filled.setdefault(table, {})
        if not isinstance(current, dict):
            continue  # a non-table value is reported by validation
        for key, value in values.items():
            if key not in current:
                current[key] = value
                from_preset.add(f"{table}.{key}")
    return filled, from_preset
