"""Triton tile configs per token bucket: tuned tables measured on a GPU, or a default table.

A bucket is (largest T, block_m, gate/up GEMM config, down GEMM config); both GEMMs of a bucket
share BLOCK_M, which is also the contiguous layout's row padding. Tuned tables live in
`moec/plan/tuned/<device>.json`, written by `benchmarks/tune.py` on the GPU, keyed by
"<scheme>/H<hidden>/I<intermediate>/E<experts>/K<top_k>"; the plan records which table it used,
and the generated package carries the configs, so a build never re-tunes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from moec.plan.facts import Facts

TUNED_DIR = Path(__file__).resolve().parent / "tuned"
_ARCH_DEVICE = {"sm90": "h200"}


def _gemm(block_m: int, block_n: int, block_k: int, warps: int, stages: int, group: int = 8):
    return {
        "BLOCK_M": block_m,
        "BLOCK_N": block_n,
        "BLOCK_K": block_k,
        "GROUP_SIZE_M": group,
        "num_warps": warps,
        "num_stages": stages,
    }


def _k_block(facts: Facts) -> int:
    return 128


# Untuned defaults for a GPU: small M tiles when each expert gets few rows (decode), large
# square tiles when the GEMMs are compute-bound.
def _default_cuda(facts: Facts) -> list[dict[str, Any]]:
    bk = _k_block(facts)
    rows = [(16, 16, 64, 4, 4), (128, 32, 64, 4, 4), (1024, 64, 128, 4, 3), (None, 128, 128, 8, 3)]
    return [
        {
            "max_tokens": limit,
            "block_m": bm,
            "gate_up": _gemm(bm, bn, bk, warps, stages),
            "down": _gemm(bm, bn, bk, warps, stages),
        }
        for limit, bm, bn, warps, stages in rows
    ]


# The interpreter's cost grows with the number of programs: one bucket of large tiles.
def _interpreted(facts: Facts) -> list[dict[str, Any]]:
    config = _gemm(32, 128, _k_block(facts), 4, 1, 1)
    return [{"max_tokens": None, "block_m": 32, "gate_up": config, "down": dict(config)}]


def table_key(facts: Facts) -> str:
    """Key of a layer's GEMM shapes (fused shared experts share the routed experts' table)."""
    return (
        f"{facts.routed.scheme}/H{facts.hidden}/I{facts.intermediate}/"
        f"E{facts.local_experts}/K{facts.top_k}"
    )


def gemm_buckets(facts: Facts) -> tuple[list[dict[str, Any]], str]:
    """Bucket table for this layer and where it came from (for the plan's decision)."""
    if facts.device == "cpu":
        return _interpreted(
            facts
        ), "one bucket of large tiles: a CPU target runs Triton interpreted"
    device = _ARCH_DEVICE.get(facts.arch or "")
    path = TUNED_DIR / f"{device}.json" if device else None
    if path and path.exists():
        tuned = json.loads(path.read_text()).get(table_key(facts))
        if tuned:
            return tuned, f"tuned on the {device.upper()} ({path.name}, {table_key(facts)})"
    return _default_cuda(facts), f"default table: no tuned entry for {table_key(facts)}"


# Memory-bound kernels: rows x columns tiles.
def elementwise_configs(facts: Facts) -> dict[str, dict[str, int]]:
    device = _ARCH_DEVICE.get(facts.arch or "")
    path = TUNED_DIR / f"{device}.json" if device else None
    if facts.device == "cuda" and path and path.exists():
        tuned = json.loads(path.read_text()).get(f"elementwise/{table_key(facts)}")
        if tuned:
            return tuned
    if facts.device == "cpu":
        return {
            "permute": {"BLOCK_M": 16, "BLOCK_H": 256, "num_warps": 4},
            "act": {"BLOCK_M": 16, "BLOCK_I": 256, "num_warps": 4},
            "combine": {"BLOCK_T": 16, "BLOCK_H": 256, "num_warps": 4},
        }
    return {
        "permute": {"BLOCK_M": 4, "BLOCK_H": 1024, "num_warps": 4},
        "act": {"BLOCK_M": 4, "BLOCK_I": 1024, "num_warps": 4},
        "combine": {"BLOCK_T": 4, "BLOCK_H": 1024, "num_warps": 4},
    }
