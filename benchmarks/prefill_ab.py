"""Several builds of one layer side by side in one process, at prefill token counts: each layer
captured in one CUDA graph and replayed in turn for ROUNDS rounds (the median of its rounds'
medians), beside DESIGN.md's floor for that input, and each output against a reference package
(the torch backend) on the same weights: norm-wise and max-wise error, and how many tokens the
two routers send to other experts, and each output's largest difference from the first
package's (max |a - b| / max |a|). With --profile, each layer's kernels of one forward
(torch.profiler, summed by kernel name) for the largest T.

    python benchmarks/prefill_ab.py --packages bench_v3_fp8_auto_before,bench_v3_fp8_auto \
        --reference bench_v3_fp8_torch --tokens 2048,4096,16384 --out $OUT/prefill.json

Every package must hold the same layer dims (random_(0) gives them the same weights).
"""

from __future__ import annotations

import argparse
import statistics
import time
from functools import partial
from pathlib import Path

import torch
from bench_moe import expert_bytes
from common import (
    DEVICE,
    chosen_experts,
    design_floor_ms,
    dump,
    graphed,
    import_package,
    in_turn,
)

ROUNDS = 3


def kernel_times_ms(fn, top: int = 12) -> list[tuple[str, float]]:
    """The `top` kernels of one fn() by device time (ms), summed by name."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    totals: dict[str, float] = {}
    for event in prof.key_averages():
        if event.device_type.name != "CUDA":
            continue
        totals[event.key[:90]] = totals.get(event.key[:90], 0.0) + event.device_time_total / 1e3
    return sorted(totals.items(), key=lambda item: -item[1])[:top]


def errors(out: torch.Tensor, expected: torch.Tensor) -> dict[str, float]:
    difference = out.double() - expected.double()
    return {
        "norm_error": round((difference.norm() / expected.double().norm()).item(), 6),
        "max_error": round((difference.abs().max() / expected.double().abs().max()).item(), 6),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--packages", required=True, help="package names, comma-separated")
    parser.add_argument("--reference", default="", help="a package to check each output against")
    parser.add_argument("--tokens", default="2048,4096,8192,16384")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--profile", action="store_true", help="kernel times at the largest T")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    names = args.packages.split(",")
    packages = {name: import_package(name) for name in names}
    layers = {
        name: package.MoELayer(device=DEVICE).random_(0) for name, package in packages.items()
    }
    first = packages[names[0]]
    dims = first.PLAN["choices"]["dims"]
    fp8 = dims["routed"]["scheme"] != "bf16"
    reference = import_package(args.reference) if args.reference else None
    reference_layer = reference.MoELayer(device=DEVICE).random_(0) if reference else None
    tokens_list = [int(t) for t in args.tokens.split(",")]
    rows = []
    for tokens in tokens_list:
        start = time.time()
        x = torch.randn(tokens, dims["hidden"], device=DEVICE).bfloat16()
        floor, hit = design_floor_ms(first, layers[names[0]], x, expert_bytes(first), fp8)
        row = {"tokens": tokens, "design_floor_ms": round(floor, 4), "experts_hit": hit}
        expected = reference_layer(x) if reference_layer is not None else None
        replays, first_out = {}, None
        for name in names:
            out = layers[name](x)
            if first_out is None:
                first_out = out
            else:  # how far from the first package's output (0.0: the same bits)
                gap = (out.float() - first_out.float()).abs().max() / first_out.float().abs().max()
                row[f"{name}_gap_to_first"] = float(gap)
            if expected is not None:
                row[f"{name}_errors"] = errors(out, expected)
                ours = chosen_experts(packages[name], layers[name], x)
                theirs = chosen_experts(reference, reference_layer, x)
                row[f"{name}_errors"]["rerouted"] = int((ours != theirs).any(dim=1).sum())
            del out
            try:
                replays[name] = graphed(partial(layers[name], x))
            except Exception as failure:  # report, time it eagerly
                print(f"T={tokens} {name}: CUDA graph capture failed: {failure!r}"[:300])
                replays[name] = partial(layers[name], x)
        del expected, first_out
        for name, samples in in_turn(replays, args.rounds).items():
            best = statistics.median(samples)
            row[f"{name}_ms"] = round(best, 4)
            row[f"{name}_x_floor"] = round(best / floor, 3)
        if args.profile and tokens == max(tokens_list):
            row["kernels_ms"] = {
                name: [(k, round(ms, 4)) for k, ms in kernel_times_ms(replays[name])]
                for name in names
            }
        rows.append(row)
        replays.clear()
        torch.cuda.empty_cache()
        times = "  ".join(f"{n} {row[f'{n}_ms']:.4f} ({row[f'{n}_x_floor']}x)" for n in names)
        print(f"T={tokens}: floor {floor:.4f} ms  {times}  ({time.time() - start:.0f} s)")
        gaps = {n: row[f"{n}_gap_to_first"] for n in names[1:]}
        print(f"    output gap to {names[0]}: {gaps}")
        for name in names:
            if f"{name}_errors" in row:
                print(f"    {name} vs {args.reference}: {row[f'{name}_errors']}")
        for name, kernels in row.get("kernels_ms", {}).items():
            print(f"    {name} kernels of one forward (ms):")
            for kernel, ms in kernels:
                print(f"      {ms:8.4f}  {kernel}")
        dump(  # after every T, so that a run cut short keeps what it measured
            Path(args.out),
            {
                "packages": names,
                "reference": args.reference,
                "rounds": args.rounds,
                "rows": rows,
                "device": torch.cuda.get_device_name() if DEVICE == "cuda" else DEVICE,
                "torch": torch.__version__,
                "triton": __import__("triton").__version__,
            },
        )


if __name__ == "__main__":
    main()
