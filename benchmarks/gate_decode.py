"""The router and the selection in one launch (triton_gate) against two, at a few tokens.

For each package and T: the select stage alone (the router fused in), as one launch and as the
router then select_topk, 10 calls in one CUDA graph; then the whole layer, one CUDA graph per
variant (one launch up to `built` tokens as the package has it, never, always), replayed in
turn for ROUNDS rounds, each variant's time the median of its rounds' medians. The layer's
output must not change: both ways choose the same experts with the same weights, bit for bit.

    python benchmarks/gate_decode.py --tokens 1,2,4,8,16 --out $OUT/gate_decode.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
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
ALWAYS = 1 << 30  # one_launch past any T


def with_one_launch(built, one_launch: int | None):
    """triton_gate.gate with one_launch replaced (None: as the package passes it)."""
    if one_launch is None:
        return built
    return lambda *args, **kwargs: built(*args, **{**kwargs, "one_launch": one_launch})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--packages", default="bench_v3_fp8_triton,bench_v3_bf16_triton,bench_v2lite_fp8_triton"
    )
    parser.add_argument("--tokens", default="1,2,4,8,16")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    rows = []
    for name in args.packages.split(","):
        package = import_package(name)
        gate = sys.modules[f"{package.__name__}.triton_gate"]
        stages = stages_of(package)
        built = gate.gate
        select = plan_stage(package, "select")
        layer = package.MoELayer(device="cuda").random_(0)
        held = held_by(layer, select)
        hidden = package.PLAN["choices"]["dims"]["hidden"]
        variants = {"built": None, "two_launches": 0, "one_launch": ALWAYS}
        for tokens in map(int, args.tokens.split(",")):
            x = torch.randn(tokens, hidden, device="cuda").bfloat16()
            row = {"package": name, "tokens": tokens}
            row["built_one_launch"] = select["choices"]["one_launch"]
            outputs, replays = {}, {}
            for variant, one_launch in variants.items():
                gate.gate = with_one_launch(built, one_launch)
                try:
                    if variant != "built":
                        row[f"stage_{variant}_us"] = round(
                            per_call_us(partial(stages.select, x, *held)), 2
                        )
                    outputs[variant] = layer(x)
                    replays[variant] = graphed(partial(layer, x))
                finally:
                    gate.gate = built
            row["same_output"] = all(torch.equal(o, outputs["built"]) for o in outputs.values())
            times = in_turn(replays, args.rounds, warmup=5, repeats=50)
            for variant, samples in times.items():
                row[f"layer_{variant}_ms"] = round(statistics.median(samples), 4)
            rows.append(row)
            print(row, flush=True)
    dump(Path(args.out), {"device": torch.cuda.get_device_name(), "rows": rows})


if __name__ == "__main__":
    main()
