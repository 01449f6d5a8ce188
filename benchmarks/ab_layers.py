"""Two builds of one layer side by side in one process: the same weights, the same inputs.

Each package carries its own copy of the runtime, so a package built from an earlier commit
(`git worktree add`, then `moec build ... --set name=...` there) holds the earlier kernels. For
each T: each package's `--stage` alone (10 calls in one CUDA graph), then the whole layers, one
CUDA graph each, replayed in turn for ROUNDS rounds (each time the median of its rounds'
medians), and how far the outputs are apart (max |a - b| / max |a|).

    python benchmarks/ab_layers.py --packages bench_v3_fp8_before,bench_v3_fp8_triton \
        --stage select --tokens 1,1024 --out $OUT/ab.json
"""

from __future__ import annotations

import argparse
import statistics
from functools import partial
from pathlib import Path

import torch
from common import (
    dump,
    graphed,
    held_by,
    import_package,
    in_turn,
    per_call_us,
    plan_stage,
    stages_of,
)

ROUNDS = 3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--packages", required=True, help="two package names, comma-separated")
    parser.add_argument("--stage", default="select", help="a stage that takes x first")
    parser.add_argument("--tokens", default="1,16,1024,4096")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    names = args.packages.split(",")
    packages = [import_package(name) for name in names]
    layers = [p.MoELayer(device="cuda").random_(0) for p in packages]
    hidden = packages[0].PLAN["choices"]["dims"]["hidden"]
    rows = []
    for tokens in map(int, args.tokens.split(",")):
        x = torch.randn(tokens, hidden, device="cuda").bfloat16()
        row = {"tokens": tokens}
        replays, outputs = {}, []
        for name, package, layer in zip(names, packages, layers, strict=True):
            held = held_by(layer, plan_stage(package, args.stage))
            stage = getattr(stages_of(package), args.stage)
            row[f"{args.stage}_{name}_us"] = round(per_call_us(partial(stage, x, *held)), 2)
            outputs.append(layer(x).float())
            replays[name] = graphed(partial(layer, x))
        first, second = outputs
        row["output_gap"] = float((first - second).abs().max() / first.abs().max())
        for name, samples in in_turn(replays, args.rounds).items():
            row[f"layer_{name}_ms"] = round(statistics.median(samples), 4)
        rows.append(row)
        print(row, flush=True)
    dump(Path(args.out), {"device": torch.cuda.get_device_name(), "rows": rows})


if __name__ == "__main__":
    main()
