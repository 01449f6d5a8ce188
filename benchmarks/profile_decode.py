"""Where a decode step's time goes: every kernel of one layer forward replayed from a CUDA graph.

For each package and T (default 1): capture the layer in a CUDA graph, replay it under
torch.profiler (CUPTI traces the kernels of a graph), and list each kernel's median duration in
launch order, their sum, and the replay's wall time measured with CUDA events. The kernels are
profiled launched without PDL (with it, a kernel starts early and waits inside, and its duration
would include the wait); wall minus the kernel sum is then what the launches cost beyond the
kernels themselves. The wall with PDL (as the package runs) and without are each the best of
two measurements, taken in turn. Prints a table; writes JSON.

    python benchmarks/profile_decode.py --packages bench_v3_fp8_triton,bench_v3_bf16_triton --out $OUT/decode.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
from functools import partial
from pathlib import Path

import torch
from common import dump, graphed, import_package, median_ms, plan_floors
from torch.profiler import ProfilerActivity, profile

REPLAYS = 20


def kernel_rows(replay) -> list[dict]:
    """Median duration (us) of each kernel of one replay, in launch order."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(REPLAYS):
            replay()
        torch.cuda.synchronize()
    kernels = [
        e
        for e in prof.events()
        if e.device_type == torch.autograd.DeviceType.CUDA and e.device_time > 0
    ]
    kernels.sort(key=lambda e: e.time_range.start)
    per_replay = len(kernels) // REPLAYS
    if per_replay == 0:
        return []
    rows = []
    for i in range(per_replay):
        durations = [kernels[r * per_replay + i].device_time for r in range(REPLAYS)]
        rows.append({"kernel": kernels[i].name[:80], "us": round(statistics.median(durations), 2)})
    return rows


def profile_package(name: str, tokens: int) -> dict:
    """One graph replay's wall time as built, then, launched without PDL, its wall time and each
    kernel's duration (with PDL a kernel starts before its predecessor ends and waits inside, so
    its duration would include that wait)."""
    package = import_package(name)
    layer = package.MoELayer(device="cuda").random_(0)
    hidden = package.PLAN["choices"]["dims"]["hidden"]
    x = torch.randn(tokens, hidden, device="cuda").bfloat16()
    tiles = sys.modules.get(f"{package.__name__}.tiles")
    pdl = getattr(tiles, "PDL", False)
    walls = {True: [], False: []}  # with PDL as built, without; twice each, alternating
    for with_pdl in (True, False, True, False):
        if tiles is not None:
            tiles.PDL = pdl and with_pdl
        replay = graphed(partial(layer, x))
        walls[with_pdl].append(median_ms(replay, warmup=5, repeats=50))
    rows = kernel_rows(replay)  # the last graph: without PDL
    if tiles is not None:
        tiles.PDL = pdl
    wall_ms, wall_no_pdl_ms = min(walls[True]), min(walls[False])
    kernel_us = sum(r["us"] for r in rows)
    floor = plan_floors(package).get(tokens, {}).get("floor_ms")
    return {
        "package": name,
        "tokens": tokens,
        "graph_ms": round(wall_ms, 4),
        "graph_ms_no_pdl": round(wall_no_pdl_ms, 4),
        "kernel_sum_ms": round(kernel_us / 1e3, 4),
        "plan_floor_ms": floor,
        "kernels": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--packages", default="bench_v3_fp8_triton")
    parser.add_argument("--tokens", default="1")
    parser.add_argument(
        "--large-combine-tiles",
        action="store_true",
        help="the combine's tuned (T=4096) tiles at every T, not its decode tiles (an A/B)",
    )
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    results = []
    for name in args.packages.split(","):
        for tokens in map(int, args.tokens.split(",")):
            try:
                if args.large_combine_tiles:
                    tiles = sys.modules.get(f"{import_package(name).__name__}.tiles")
                    tiles.COMBINE_DECODE_ROWS = 0
                result = profile_package(name, tokens)
            except Exception as failure:  # report, keep profiling the rest
                print(f"{name} T={tokens}: {failure!r}"[:400], flush=True)
                continue
            results.append(result)
            print(
                f"\n{name} T={tokens}: graph {result['graph_ms']} ms (without PDL "
                f"{result['graph_ms_no_pdl']}), kernels {result['kernel_sum_ms']} ms without "
                f"PDL, plan floor {result['plan_floor_ms']} ms"
            )
            for row in result["kernels"]:
                print(f"  {row['us']:>8} us  {row['kernel']}")
    dump(
        Path(args.out),
        {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "runs": results},
    )


if __name__ == "__main__":
    main()
