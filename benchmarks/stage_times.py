"""GPU time of each stage of the layer, beside the stage's plan floor (`moec explain`'s cost model).

One forward runs with every stage function of the package recording its arguments; then each
stage is replayed on those arguments from a CUDA graph holding REPEATS calls, so the time is the
stage's kernels (launches included, Python not) and not its share of an eager forward, where
Python launching the small stages dominated (benchmarks/RESULTS.md, run 12). Prints a table per
T; writes JSON.

    python benchmarks/stage_times.py --tokens 1024,4096,16384 --out $OUT/stage_times.json
"""

from __future__ import annotations

import argparse
import json
import sys
from functools import partial
from pathlib import Path

import torch
from common import (
    apply_elementwise,
    dump,
    graphed,
    import_package,
    median_ms,
    per_call_us,
    plan_floors,
    stage_names,
    stages_of,
)

REPEATS = 10


def recorded_calls(package, layer, x) -> list[tuple[str, object, tuple]]:
    """(stage name, function, arguments) of each stage call of one forward, in order."""
    stages = stages_of(package)
    names = stage_names(package)
    original = {name: getattr(stages, name) for name in names}
    calls = []

    def recording(name, fn):
        def run(*args):
            calls.append((name, fn, args))
            return fn(*args)

        return run

    try:
        for name in names:
            setattr(stages, name, recording(name, original[name]))
        layer(x)
    finally:
        for name in names:
            setattr(stages, name, original[name])
    return calls


def stage_us(fn, args) -> float:
    return per_call_us(partial(fn, *args), REPEATS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--package", default="bench_v3_fp8_triton")
    parser.add_argument("--tokens", default="1024,4096,16384")
    parser.add_argument(
        "--elementwise",
        metavar="TABLE:KEY",
        help="take the permute, act and combine tiles of a tuned table's layer KEY instead",
    )
    parser.add_argument(
        "--router",
        metavar="JSON",
        help="router tile changes for every bucket above decode, e.g. '{\"BLOCK_E\": 128}'",
    )
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    package = import_package(args.package)
    if args.router:
        routers = sys.modules[f"{package.__name__}.tiles"].ROUTERS
        for _, config in routers[1:]:
            config.update(json.loads(args.router))
    if args.elementwise:
        table, key = args.elementwise.split(":", 1)
        tiles = json.loads(Path(table).read_text())[f"elementwise/{key}"]
        apply_elementwise(package, tiles)
    layer = package.MoELayer(device="cuda").random_(0)
    floors = plan_floors(package)
    hidden = package.PLAN["choices"]["dims"]["hidden"]
    results = []
    for tokens in map(int, args.tokens.split(",")):
        x = torch.randn(tokens, hidden, device="cuda").bfloat16()
        layer_ms = median_ms(graphed(partial(layer, x)), warmup=3, repeats=20)
        stages = []
        for name, fn, call_args in recorded_calls(package, layer, x):
            floor = floors.get(tokens, {}).get("stages", {}).get(name)
            us = stage_us(fn, call_args)
            stages.append(
                {
                    "stage": name,
                    "us": round(us, 2),
                    "plan_floor_us": None if floor is None else round(floor * 1e3, 2),
                    "x_floor": None if not floor else round(us / (floor * 1e3), 2),
                }
            )
        row = {
            "tokens": tokens,
            "layer_ms": round(layer_ms, 4),
            "stage_sum_ms": round(sum(s["us"] for s in stages) / 1e3, 4),
            "plan_floor_ms": floors.get(tokens, {}).get("floor_ms"),
            "stages": stages,
        }
        results.append(row)
        print(
            f"\nT={tokens}: layer {row['layer_ms']} ms (graph), stages {row['stage_sum_ms']} ms, "
            f"plan floor {row['plan_floor_ms']} ms"
        )
        for s in stages:
            print(
                f"  {s['stage']:<14} {s['us']:>9} us   floor {s['plan_floor_us']} us   x{s['x_floor']}"
            )
    dump(Path(args.out), {"device": torch.cuda.get_device_name(), "runs": results})


if __name__ == "__main__":
    main()
