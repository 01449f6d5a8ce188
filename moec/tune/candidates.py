"""The tile candidates `moec tune` measures: grouped GEMM configs per token count, and the tiles
of the memory-bound kernels (permute, act, combine).

GEMM grids by rows per expert (T * K / E): decode (<= 2) tries 16-row tiles, plain, swap-AB
(the weight rows as the MMA's M) and TMA with one program per tile; mid-size (<= 40) tries 16 to
64 rows; prefill tries 64 and 128 rows, TMA persistent with and without warp specialization
(always 8 warps: with 4 it returned wrong results, FACTS.md; the checker would reject it
anyway). fp8 schemes also try promoting the tensor-core sums to fp32 every 128 K elements
instead of 32 (FP8_ACC, docs/numerics.md), except swap-AB tiles of 16 rows. Swap-AB and TMA
take bf16 and fp8 schemes only, and TMA needs sm90 or newer.
"""

from __future__ import annotations

import itertools
from typing import Any

FP8_SCHEMES = ("fp8_per_tensor", "fp8_block")
"""Schemes whose GEMMs run on the fp8 tensor cores with a promotion interval to choose."""
PLAIN_SCHEMES = ("bf16", *FP8_SCHEMES)
"""Schemes the swap-AB and TMA variants of the grouped GEMM take."""
BLOCK_K = 128
"""K tile of every candidate: divides every block-scaled group (128, 32 x 4)."""

ROWS_KEY = {"permute": "BLOCK_M", "act": "BLOCK_M", "combine": "BLOCK_T"}
"""The rows-per-program key of each elementwise kernel's config."""
COLUMNS_KEY = {"permute": "BLOCK_H", "act": "BLOCK_I", "combine": "BLOCK_H"}
"""The columns-per-program key of each elementwise kernel's config."""
ELEMENTWISE_KERNELS = tuple(ROWS_KEY)

Row = tuple[int, int, int, int, dict[str, Any]]
"""(BLOCK_M, BLOCK_N, num_warps, num_stages, extra keys) of one GEMM candidate."""


def _decode() -> list[Row]:
    rows: list[Row] = [(16, bn, 4, s, {}) for bn in (32, 64, 128) for s in (4, 6)]
    rows += [(16, bn, 4, s, {"SWAP_AB": True}) for bn in (64, 128) for s in (4, 6)]
    rows += [(16, bn, 4, s, {"TMA": True, "PROGRAMS": 4096}) for bn in (32, 64) for s in (4, 6)]
    return rows


def _mid() -> list[Row]:
    rows: list[Row] = [(bm, bn, 4, 3, {}) for bm in (16, 32, 64) for bn in (64, 128)]
    # deeper pipelines keep more weight bytes in flight per program: the mid sizes still stream
    # every expert's weights (T=256 touches all of them) with few rows to compute per tile. The
    # 128-wide tiles with 4 stages were missing: 4-6% faster than the tuned tiles at T=1024 on
    # the H200, fp8 and bf16 (benchmarks/RESULTS.md, runs 65-66)
    rows += [(bm, 64, 4, s, {}) for bm in (32, 64) for s in (4, 5)]
    rows += [(bm, 128, 4, 4, {}) for bm in (32, 64)] + [(64, 128, 8, 4, {})]
    rows += [
        (bm, bn, 4, s, {"SWAP_AB": True}) for bm in (16, 32) for bn in (64, 128) for s in (3, 4)
    ]
    rows += [(bm, 64, 4, s, {"SWAP_AB": True}) for bm in (16, 32) for s in (5, 6)]
    rows += [(bm, 128, 4, 4, {"TMA": True}) for bm in (16, 32, 64)]
    rows += [(bm, 64, 4, 4, {"TMA": True, "PROGRAMS": 8192}) for bm in (16, 32)]
    return rows


def _prefill() -> list[Row]:
    rows: list[Row] = [(64, 128, 4, s, {}) for s in (3, 4)] + [(64, 128, 4, 3, {"TMA": True})]
    rows += [(64, 128, 4, 4, {"TMA": True}), (128, 128, 8, 3, {}), (128, 128, 8, 4, {})]
    rows += [(128, 128, 8, s, {"TMA": True}) for s in (3, 4)]
    rows += [(128, 128, 8, s, {"TMA": True, "WARP_SPECIALIZE": True}) for s in (3, 4)]
    rows += [(64, 128, 8, 4, {"TMA": True, "WARP_SPECIALIZE": True})]
    return rows


def gemm_candidates(
    tokens: int, experts: int, top_k: int, scheme: str, tma: bool
) -> list[dict[str, Any]]:
    """GEMM configs worth timing at T = `tokens` for `scheme`; `tma`: the GPU has TMA (sm90+)."""
    rows_per_expert = tokens * top_k / experts
    grid = _decode() if rows_per_expert <= 2 else _mid() if rows_per_expert <= 40 else _prefill()
    configs = []
    for block_m, block_n, warps, stages, extra in grid:
        if (extra.get("SWAP_AB") or extra.get("TMA")) and scheme not in PLAIN_SCHEMES:
            continue
        if extra.get("TMA") and not tma:
            continue
        configs.append(
            {
                "BLOCK_M": block_m,
                "BLOCK_N": block_n,
                "BLOCK_K": BLOCK_K,
                "GROUP_SIZE_M": 8,
                "num_warps": warps,
                "num_stages": stages,
                **extra,
            }
        )
    if scheme in FP8_SCHEMES:
        configs += [{**config, "FP8_ACC": 128} for config in configs if _may_promote_late(config)]
    return configs


def _may_promote_late(config: dict[str, Any]) -> bool:
    """Whether FP8_ACC 128 is worth trying: not for swap-AB tiles of 16 token rows, whose 128-deep
    sums in the fp8 tensor core exceeded the fp32 bound in every shipped config on the H200
    (tests/kernel_tests test_shipped_tuned_configs, benchmarks/RESULTS.md, run 51), though the
    tuner's sampled rows had passed."""
    return not (config.get("SWAP_AB") and config["BLOCK_M"] < 32)


VALUES_PER_THREAD = 256
"""The most values a candidate tile of a memory-bound kernel gives one thread (more spill)."""


def elementwise_candidates(kernel: str) -> list[dict[str, int]]:
    """Tiles of one memory-bound kernel: rows x columns per program, warps, and for combine the
    expert rows loaded per step. Narrow tiles and single warps are among them: a one-warp,
    512-column combine took 138 us at T=4096 on the H200 against 162 us for the 4-warp,
    1024-column tile the earlier, wider set chose (benchmarks/RESULTS.md, run 38)."""
    tiles = []
    rows_: tuple[int, ...]
    columns_: tuple[int, ...]
    warps_: tuple[int, ...]
    terms: tuple[int, ...]
    if kernel == "combine":  # each candidate compiles a kernel (about 0.8 s): about 50 of each
        rows_, columns_, warps_, terms = (1, 2, 4), (256, 512, 1024), (1, 2, 4), (4, 8)
    else:
        rows_, columns_, warps_, terms = (1, 2, 4, 8), (512, 1024, 2048), (1, 2, 4, 8), (1,)
    values = {"combine": 1, "act": 2, "permute": 1}[kernel]  # act reads gate and up
    for rows, columns, warps, step in itertools.product(rows_, columns_, warps_, terms):
        if rows * columns * step * values > VALUES_PER_THREAD * 32 * warps:
            continue
        tile = {ROWS_KEY[kernel]: rows, COLUMNS_KEY[kernel]: columns, "num_warps": warps}
        tiles.append({**tile, "TERMS_AT_ONCE": step} if kernel == "combine" else tile)
    return tiles
