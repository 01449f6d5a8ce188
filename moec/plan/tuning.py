"""Pass: Triton tile configs per token bucket, from a tuned table measured on a GPU or defaults.

A bucket is (largest T, block_m, gate/up GEMM config, down GEMM config); both GEMMs of a bucket
share BLOCK_M, which is also the contiguous layout's row padding. Tuned tables (one JSON file
per GPU, written by `moec tune`; moec/plan/tables.py says where they are looked up) are keyed by
"<scheme>/H<hidden>/I<intermediate>/E<experts>/K<top_k>"; the plan records which table it used,
and the generated package carries the configs, so a build never re-tunes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from moec.plan.environment import Environment, shipped_table
from moec.plan.graph import Plan
from moec.plan.layer import Layer
from moec.plan.stages import Dispatch, Quantize
from moec.plan.tables import TUNED_DIR, TunedTable, check_launch_limits, find_table, table_key
from moec.vocab import Arch, Backend, DeviceKind

__all__ = ["TUNED_DIR", "TileBucket", "Tiles", "choose_tiles", "table_key"]

PDL_ARCHS = (Arch.sm90, Arch.sm100, Arch.sm120)
"""Architectures with programmatic dependent launch."""


@dataclass(frozen=True)
class TileBucket:
    """Tiles of the grouped GEMMs for token counts up to `max_tokens` (None: any larger)."""

    max_tokens: int | None
    block_m: int
    """Rows per GEMM tile, and the contiguous layout's row padding, in this bucket."""
    gate_up: dict[str, Any]
    """grouped_gemm config of the gate/up GEMM (BLOCK_M/N/K, GROUP_SIZE_M, warps, stages...)."""
    down: dict[str, Any]


@dataclass(frozen=True)
class Tiles:
    """Every Triton tile config of one layer."""

    buckets: tuple[TileBucket, ...]
    permute: dict[str, int]
    """permute_quant: BLOCK_M, BLOCK_H, num_warps."""
    act: dict[str, int]
    """act_quant: BLOCK_M, BLOCK_I, num_warps."""
    combine: dict[str, int]
    """combine: BLOCK_T, BLOCK_H, num_warps."""
    combine_decode: dict[str, int]
    """combine of at most COMBINE_DECODE_ROWS rows (+ TERMS_AT_ONCE)."""
    source: str
    """Where the table came from."""
    routers: tuple[tuple[int | None, dict[str, int]], ...]
    """The Triton router's tiles per token bucket: (most tokens, or None for any more; BLOCK_T,
    BLOCK_E, BLOCK_K, PROGRAMS, num_warps, num_stages)."""
    pdl: bool
    """Launch the kernels with programmatic dependent launch (Hopper and newer)."""
    received_per_token: float | None = None
    """Expert parallelism with an exchange: rows a rank receives per token a rank sends, under
    uniform routing. A received row count divided by it is the tokens per rank, whose bucket
    (tuned on one GPU holding the rank's experts) fits the rank's rows per expert."""

    def bucket(self, tokens: int) -> TileBucket:
        """The bucket of `tokens` tokens: the first whose limit holds them (the last has none)."""
        return next(
            (b for b in self.buckets if b.max_tokens is None or tokens <= b.max_tokens),
            self.buckets[-1],
        )

    def reachable(self, tokens: int) -> tuple[TileBucket, ...]:
        """The buckets a forward of at most `tokens` tokens can take."""
        return self.buckets[: self.buckets.index(self.bucket(tokens)) + 1]


def choose_tiles(plan: Plan, env: Environment) -> None:
    """Pass: the tile table of a Triton layer, recorded with its source."""
    layer = plan.layer
    found = find_table(layer, env) if layer.device == DeviceKind.cuda else None
    buckets, source = gemm_buckets(layer, found)
    split = plan.backends.split
    if split is not None:  # the Triton GEMMs run only up to the split
        buckets = _buckets_up_to(buckets, split.up_to)
    elementwise = elementwise_configs(layer, found)
    if isinstance(found, TunedTable):
        triton_gemms = buckets if plan.backends.gemm == "triton" else []
        check_launch_limits(found, triton_gemms, layer.arch, _gemm_schemes(plan), _groups(plan))
    pdl = layer.device == DeviceKind.cuda and layer.arch in PDL_ARCHS
    received = received_per_token(layer) if layer.exchanges_rows else None
    plan.tiles = Tiles(
        buckets=tuple(
            TileBucket(b["max_tokens"], b["block_m"], b["gate_up"], b["down"]) for b in buckets
        ),
        permute=elementwise["permute"],
        act=elementwise["act"],
        combine=elementwise["combine"],
        combine_decode=combine_decode_config(layer, elementwise["combine"]),
        source=source,
        routers=router_configs(layer),
        pdl=pdl,
        received_per_token=received,
    )
    if received is not None:
        plan.decide(
            "tile bucket of received rows",
            f"received rows / {received:.4g}",
            f"the bucket of a rank's tokens: with uniform routing a token goes to a rank "
            f"holding {layer.local_experts} of the {layer.routed_experts} experts with "
            f"probability {received / layer.ep:.4g} (at least one of its {layer.top_k}), and "
            f"each of the {layer.ep} ranks sends its tokens; that many tokens per rank give the "
            "rank's experts the rows a one-GPU layer of those experts gets, which is what the "
            "table was tuned on",
        )
    limits = ", ".join(f"T<={b['max_tokens']}" if b["max_tokens"] else "larger" for b in buckets)
    if plan.backends.gemm == Backend.triton:
        upper = f", up to T={split.up_to}" if split else ""
        plan.decide("triton tiles", f"{len(buckets)} token buckets ({limits}{upper})", source)
    else:
        plan.decide(
            "triton tiles",
            "the router, permute, activation and combine kernels' tiles",
            f"the GEMMs run on {plan.backends.gemm}; {source}",
        )
    plan.decide(
        "programmatic dependent launch",
        "yes" if pdl else "no",
        f"{layer.arch} schedules each Triton kernel's programs while the previous kernel runs; "
        "they wait there for its results: the launch gaps of the decode path are hidden"
        if pdl
        else f"{layer.arch or layer.device} has no programmatic dependent launch (sm90 and newer)",
    )
    if plan.has("shared_expert") and plan.stage("shared_expert").backend == Backend.triton:
        plan.decide(
            "shared expert tiles",
            "the routed experts' bucket for T",
            "the shared MLP runs as a one-expert grouped GEMM over T rows with the same "
            "kernels; it has no table of its own",
        )


def _gemm_schemes(plan: Plan) -> tuple[str, ...]:
    """The schemes the Triton grouped GEMMs run with the bucket tiles: the routed experts', and
    a Triton shared expert's (it takes the same tiles)."""
    schemes = [plan.layer.routed.scheme]
    if plan.has("shared_expert") and plan.stage("shared_expert").backend == "triton":
        schemes.append(plan.layer.shared.scheme)
    return tuple(dict.fromkeys(schemes))


def _groups(plan: Plan) -> dict[str, int]:
    """Elementwise kernels that quantize activations in groups, with the group size: the
    permute tiles' (quantize, or the dispatch it fuses into) and the activation's (quantize_down,
    which it absorbs)."""
    groups = {}
    for stage, kernel in (("quantize", "permute"), ("quantize_down", "act")):
        if plan.has(stage) and plan.stage(stage).backend == "triton":
            group = plan.stage(stage, Quantize).format.group
            if group:
                groups[kernel] = group
    return groups


def received_per_token(layer: Layer) -> float:
    """ep x P(a token has one of its top-k distinct experts among a rank's), uniform routing."""
    experts, local, top_k = layer.routed_experts, layer.local_experts, layer.top_k
    none_here = 1.0
    for i in range(top_k):
        none_here *= max(experts - local - i, 0) / (experts - i)
    return round(layer.ep * (1.0 - none_here), 4)


def order_dispatch_pass(plan: Plan) -> None:
    """Pass, after the copy-free dispatch's: whether a Triton dispatch's pass over the tokens
    after the route (the row copy, or the tokens' quantization) takes part in PDL."""
    if plan.tiles is None or not plan.tiles.pdl or not plan.has("dispatch"):
        return
    dispatch = plan.stage("dispatch", Dispatch)
    if dispatch.backend != Backend.triton:
        return
    if dispatch.gather and not dispatch.quantize:
        plan.decide(
            "dispatch row copy under PDL",
            "no pass to order",
            "unquantized tokens need no pass after the route: the gate/up GEMM reads x itself",
        )
        return
    plan.update("dispatch", copy_pdl=False)
    what = "the tokens' quantization" if dispatch.gather else "the row copy"
    plan.decide(
        "dispatch row copy under PDL",
        "no, launched in order",
        f"{what} after the route, launched early, keeps its successor's programs waiting on "
        "the SMs while it runs: the stage took 5.6-7.4 us longer on the H200 at T = 256 to "
        "4096 with the row copy (benchmarks/RESULTS.md, run 47); the route's launches and the "
        "one-launch decode dispatch keep PDL",
    )


def _buckets_up_to(buckets: list[dict], tokens: int) -> list[dict]:
    """The buckets that hold token counts up to `tokens`, the last of them open-ended."""
    kept = []
    for bucket in buckets:
        kept.append(bucket)
        if bucket["max_tokens"] is None or bucket["max_tokens"] >= tokens:
            break
    return [*kept[:-1], {**kept[-1], "max_tokens": None}]


ROUTER_DECODE_TOKENS = 64
"""The router uses its decode tiles up to this many tokens."""

ROUTER_NARROW_TOKENS = 2048
"""Above decode, the router's tiles are 64 experts wide up to this many tokens, 128 above."""


def router_configs(layer: Layer) -> tuple[tuple[int | None, dict[str, int]], ...]:
    """Router tiles per token bucket (untuned): 16-token tiles at decode, 128-token tiles that
    read the weight once per 128 tokens above; the hidden dim is split into slices until the
    grid holds about PROGRAMS programs, so a few tokens still spread the weight over every SM.
    Measured on the H200 at DeepSeek-V3 dims (benchmarks/RESULTS.md): decode 29.7 us unsplit,
    4.2 us with two programs per SM (264); T=1024 72.7 us unsplit, 21.0 us with one per SM
    (132), 24.2 with 264 (run 9). Tiles 128 experts wide need twice the slices of 64 for the same
    grid, and the selection then sums twice the partial logits: router + select at T=1024
    31.0 us against 28.1 with 64, at T=2048 51.4 against 48.9, at T=4096 89.3 against 97.7, at
    T=16384 342 against 396 (runs 57-59). Interpreted: small tiles, a few slices (the split path is tested)."""
    if layer.device == DeviceKind.cpu:
        small = {"BLOCK_T": 16, "BLOCK_E": 64, "BLOCK_K": 64, "PROGRAMS": 4}
        return ((None, small | {"num_warps": 4, "num_stages": 1}),)
    decode = {"BLOCK_T": 16, "BLOCK_E": 32, "BLOCK_K": 128, "PROGRAMS": 264}
    decode |= {"num_warps": 4, "num_stages": 3}
    narrow = {"BLOCK_T": 128, "BLOCK_E": 64, "BLOCK_K": 64, "PROGRAMS": 132}
    narrow |= {"num_warps": 8, "num_stages": 3}
    return (
        (ROUTER_DECODE_TOKENS, decode),
        (ROUTER_NARROW_TOKENS, narrow),
        (None, narrow | {"BLOCK_E": 128}),
    )


def router_tiles(layer: Layer, tokens: int) -> dict[str, int]:
    """The router's tiles at `tokens` tokens: the first bucket that holds them."""
    buckets = router_configs(layer)
    return next(c for most, c in buckets if most is None or tokens <= most)


COMBINE_DECODE_ROWS = 32
"""The combine uses its decode tiles for sums over up to this many rows."""


def combine_decode_config(layer: Layer, combine: dict[str, int]) -> dict[str, int]:
    """Combine tiles for a few tokens (untuned): one token per program, 256 columns, every
    expert row of a step loaded at once. The tuned tiles are chosen at T=4096; at T=1-32 on the
    H200 (DeepSeek-V3) these took 1.7-2.6 us against 3.4-5.0 us with them (benchmarks/RESULTS.md,
    runs 35-36). Interpreted: the layer's own combine tiles."""
    if layer.device == DeviceKind.cpu:
        return dict(combine)
    return {"BLOCK_T": 1, "BLOCK_H": 256, "num_warps": 1, "TERMS_AT_ONCE": 16}


def _gemm(block_m: int, block_n: int, block_k: int, warps: int, stages: int, group: int = 8):
    return {
        "BLOCK_M": block_m,
        "BLOCK_N": block_n,
        "BLOCK_K": block_k,
        "GROUP_SIZE_M": group,
        "num_warps": warps,
        "num_stages": stages,
    }


# Untuned defaults for a GPU: small M tiles when each expert gets few rows (decode), large
# square tiles when the GEMMs are compute-bound. BLOCK_K 128 divides every block-scaled group.
def _default_cuda() -> list[dict[str, Any]]:
    rows = [(16, 16, 64, 4, 4), (128, 32, 64, 4, 4), (1024, 64, 128, 4, 3), (None, 128, 128, 8, 3)]
    return [
        {
            "max_tokens": limit,
            "block_m": bm,
            "gate_up": _gemm(bm, bn, 128, warps, stages),
            "down": _gemm(bm, bn, 128, warps, stages),
        }
        for limit, bm, bn, warps, stages in rows
    ]


# The interpreter's cost grows with the number of programs: one bucket of large tiles.
def _interpreted() -> list[dict[str, Any]]:
    config = _gemm(32, 128, 128, 4, 1, 1)
    return [{"max_tokens": None, "block_m": 32, "gate_up": config, "down": dict(config)}]


def gemm_buckets(layer: Layer, found: TunedTable | str | None) -> tuple[list[dict[str, Any]], str]:
    """Bucket table for this layer and where it came from (for the plan's decision); `found`:
    the layer's tuned table, or why there is none (None for a CPU target)."""
    if layer.device == DeviceKind.cpu:
        return _interpreted(), "one bucket of large tiles: a CPU target runs Triton interpreted"
    if isinstance(found, TunedTable):
        return found.buckets, f"tuned on {found.gpu}: {found.where}, key {found.key}"
    return _default_cuda(), f"default table: {found}"


def elementwise_configs(layer: Layer, found: TunedTable | str | None) -> dict[str, dict[str, int]]:
    """Tiles of the memory-bound kernels (rows x columns): the tuned table's, else defaults."""
    if isinstance(found, TunedTable) and found.elementwise:
        return found.elementwise
    if layer.device == DeviceKind.cpu:
        return {
            "permute": {"BLOCK_M": 16, "BLOCK_H": 256, "num_warps": 4},
            "act": {"BLOCK_M": 16, "BLOCK_I": 256, "num_warps": 4},
            "combine": {"BLOCK_T": 16, "BLOCK_H": 256, "num_warps": 4},
        }
    # Untuned layers take what the H200 tuner chose for DeepSeek-V3, quantized or bf16: V2-Lite's
    # activation at T=1 took 7.1 us with the 4-row tiles these replaced, against 2.9 us for V3's
    # larger one with these (benchmarks/RESULTS.md, run 17)
    key = REFERENCE_ELEMENTWISE[layer.routed.quantized]
    return shipped_table(REFERENCE_GPU)[f"elementwise/{key}"]


REFERENCE_GPU = "nvidia-h200"
REFERENCE_ELEMENTWISE = {True: "fp8_block/H7168/I2048/E256/K8", False: "bf16/H7168/I2048/E256/K8"}
"""The shipped table's layers whose elementwise tiles untuned CUDA layers take (quantized or
not): DeepSeek-V3's on the H200."""


def router_slices(layer: Layer, tokens: int) -> int:
    """K slices of the Triton router at `tokens` tokens (the S of its partial logits [S, T, E]):
    what moec/runtime/triton_router.py computes from the tiles the plan gives it."""
    config = router_tiles(layer, tokens)
    tiles = -(-tokens // config["BLOCK_T"]) * -(-layer.routed_experts // config["BLOCK_E"])
    k_blocks = -(-layer.hidden // config["BLOCK_K"])
    slices = max(1, min(k_blocks, config["PROGRAMS"] // max(tiles, 1)))
    k_slice = -(-k_blocks // slices) * config["BLOCK_K"]
    return -(-layer.hidden // k_slice)
