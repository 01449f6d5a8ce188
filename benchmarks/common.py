"""Shared pieces of the GPU benchmarks: importing built packages, routing, floors, timing.

Runs where only torch and triton are installed (the GPU image has no moec dependencies): the
layer packages are built beforehand with `make bench-packages` and carried to the GPU. The timer
and the CUDA-graph capture are moec/runtime's (self_check.py, cuda_graph.py), which need only
torch, like all of moec/runtime (the repo root on PYTHONPATH, as gpu_session.sh sets it).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from pathlib import Path

import torch

from moec.runtime import cuda_graph, self_check
from moec.runtime.reference import SELECT_OPTIONS

PACKAGES = Path(
    os.environ.get("MOEC_BENCH_PACKAGES", Path(__file__).resolve().parent / ".packages")
)
DEVICE = os.environ.get("MOEC_BENCH_DEVICE", "cuda")  # "cpu": a dry run under TRITON_INTERPRET=1
TOKENS = (1, 16, 64, 256, 1024, 2048, 4096, 8192, 16384)
BANDWIDTH = 4274e9  # B/s, H200 copy bandwidth measured (read + write)
FP8_RATE = 1414e12  # FLOP/s, DeepGEMM grouped fp8 on the H200
BF16_RATE = 688e12  # FLOP/s, bf16 dense matmul on the H200


def import_package(name: str):
    """Import a generated package from benchmarks/.packages/<name>."""
    folder = PACKAGES / name
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(
        name, folder / "__init__.py", submodule_search_locations=[str(folder)]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def stages_of(package):
    return sys.modules[f"{package.__name__}.stages"]


def stage_names(package) -> list[str]:
    """The package's stage functions, in the order stages.py defines them (a package with a
    GEMM split has one set per backend)."""
    stages = stages_of(package)
    return [
        name
        for name, value in vars(stages).items()
        if callable(value) and getattr(value, "__module__", None) == stages.__name__
    ]


def graph_safe(package) -> bool:
    """Whether the package's plan says its layer can be captured in a CUDA graph."""
    return any(
        d["what"] == "CUDA graph" and d["choice"] == "yes" for d in package.PLAN["decisions"]
    )


def plan_floors(package) -> dict[int, dict]:
    """The plan's floors by token count: {T: {"floor_ms": layer, "stages": {stage: ms}}}."""
    return {
        row["tokens"]: {
            "floor_ms": row["floor_ms"],
            "stages": {s["stage"]: s["floor_ms"] for s in row["stages"]},
        }
        for row in package.PLAN["cost"]
    }


def apply_buckets(package, table: list[dict], elementwise: dict | None = None) -> None:
    """Use a tuned table in an already built package (what a rebuild would embed)."""
    tiles = sys.modules[f"{package.__name__}.tiles"]
    tiles.BUCKETS = tuple(
        tiles.Bucket(b["max_tokens"], b["block_m"], b["gate_up"], b["down"]) for b in table
    )
    if elementwise:
        apply_elementwise(package, elementwise)


def apply_elementwise(package, elementwise: dict) -> None:
    """Use a tuned table's permute, act and combine tiles in an already built package."""
    tiles = sys.modules[f"{package.__name__}.tiles"]
    tiles.PERMUTE = elementwise["permute"]
    tiles.ACT = elementwise["act"]
    tiles.COMBINE = elementwise["combine"]


def plan_stage(package, name: str) -> dict:
    """The stage `name` of the package's plan (plan.json's form)."""
    return next(s for s in package.PLAN["stages"] if s["name"] == name)


def held_by(layer, stage: dict) -> list[torch.Tensor]:
    """The layer's tensors a stage's function takes after its inputs: weights, then workspace."""
    return [getattr(layer, item["tensor"]) for item in stage["weights"] + stage["workspace"]]


def route(package, layer, x) -> tuple[torch.Tensor, torch.Tensor]:
    """(topk_weights, topk_ids) of x, by the layer's own stages: the router then select, or
    select alone where the router is fused into it."""
    stages = stages_of(package)
    select = plan_stage(package, "select")
    held = held_by(layer, select)
    if "router" in select["fused"]:
        return stages.select(x, *held)
    router = plan_stage(package, "router")
    logits = stages.router(x, *held_by(layer, router))
    return stages.select(logits, *held)


def select_options(package) -> dict:
    """The select stage's options, as triton_select.select_topk takes them."""
    choices = plan_stage(package, "select")["choices"]
    return {key: choices[key] for key in SELECT_OPTIONS}


def chosen_experts(package, layer, x) -> torch.Tensor:
    """[T, K] the routed experts the layer's router and select choose for x, sorted per token
    (fused shared experts, numbered after the routed ones, left out)."""
    top_k = package.PLAN["choices"]["dims"]["top_k"]
    return route(package, layer, x)[1].sort(dim=1).values[:, :top_k]


def design_floor_ms(
    package, layer, x, weight_bytes_per_expert: float, fp8: bool
) -> tuple[float, int]:
    """DESIGN.md's floor: max(bytes of the experts actually touched (routed hit + shared) plus
    the router weight / bandwidth, FLOPs / matmul rate), from this input's real routing."""
    ids = chosen_experts(package, layer, x)
    router_weight = getattr(layer, "gate_weight", None)
    if router_weight is None:
        router_weight = layer.gate_parts
    plan = package.PLAN["choices"]["dims"]
    routed = plan["routed_experts"]
    hit = int(torch.unique(ids[ids < routed]).numel())
    shared = plan["n_shared"]
    bytes_moved = (
        hit + shared
    ) * weight_bytes_per_expert + router_weight.numel() * router_weight.element_size()
    tokens = x.shape[0]
    hidden, inter = plan["hidden"], plan["intermediate"]
    flops = 2 * tokens * hidden * routed + 6 * tokens * hidden * inter * (plan["top_k"] + shared)
    rate = FP8_RATE if fp8 else BF16_RATE
    return max(bytes_moved / BANDWIDTH, flops / rate) * 1e3, hit


def layer_flops(package, tokens: int) -> float:
    plan = package.PLAN["choices"]["dims"]
    hidden, inter = plan["hidden"], plan["intermediate"]
    return 2 * tokens * hidden * plan["routed_experts"] + 6 * tokens * hidden * inter * (
        plan["top_k"] + plan["n_shared"]
    )


WARM_SECONDS = 0.25
"""Each timing first runs fn() for this long: an idle H200 sits at a low SM clock, and a few
0.1 ms replays end before it has raised it (a decode step measured first in a process took
0.145 ms, the same graph measured after other work 0.129; benchmarks/RESULTS.md, run 18)."""


def median_ms(fn, warmup: int = 3, repeats: int = 20) -> float:
    """Median of CUDA-event timings of fn(), each run started on an idle GPU, after at least
    `warmup` runs and WARM_SECONDS of them (host timer without CUDA, for dry runs):
    moec/runtime/self_check.py's timer."""
    if not torch.cuda.is_available():
        return self_check.median_ms(fn, "cpu", repeats, warmup)
    start = time.perf_counter()
    while time.perf_counter() - start < WARM_SECONDS:
        fn()
        torch.cuda.synchronize()
    return self_check.median_ms(fn, "cuda", repeats, warmup, barrier=torch.cuda.synchronize)


def in_turn(replays: dict, rounds: int, warmup: int = 3, repeats: int = 20) -> dict:
    """{name: [ms per round]}: each replay's median_ms, the replays timed one after another in
    each of `rounds` rounds, so that a drift of the GPU's clock between rounds touches them
    alike."""
    samples = {name: [] for name in replays}
    for _ in range(rounds):
        for name, replay in replays.items():
            samples[name].append(median_ms(replay, warmup=warmup, repeats=repeats))
    return samples


def graphed(fn):
    """Capture fn() in a CUDA graph (two warm-ups first); return a function replaying it."""
    replay, _ = cuda_graph.capture(fn, warmup=2)
    return replay


def per_call_us(fn, calls: int = 10) -> float:
    """Time of one fn() call, us: `calls` calls captured in one CUDA graph and replayed, so the
    time is the kernels' (launches included), not Python's."""

    def many():
        for _ in range(calls):
            fn()

    return median_ms(graphed(many), warmup=3, repeats=20) * 1e3 / calls


def dump(path: Path, data) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")


def stage_times_ms(package, layer, x, repeats: int = 5) -> dict[str, float]:
    """Median time of each stage of one forward: every stage function of the package is wrapped
    to synchronize and time itself (so stages do not overlap, as they would not anyway)."""
    stages = stages_of(package)
    names = stage_names(package)
    original = {name: getattr(stages, name) for name in names}
    samples: dict[str, list[float]] = {name: [] for name in names}

    def timed(name, fn):
        def run(*args):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            result = fn(*args)
            end.record()
            end.synchronize()
            samples[name].append(start.elapsed_time(end))
            return result

        return run

    try:
        for name in names:
            setattr(stages, name, timed(name, original[name]))
        for _ in range(repeats + 1):
            layer(x)
    finally:
        for name in names:
            setattr(stages, name, original[name])
    return {name: round(sorted(v[1:])[len(v[1:]) // 2], 4) for name, v in samples.items() if v[1:]}
