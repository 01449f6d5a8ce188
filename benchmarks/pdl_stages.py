"""Which launches gain from programmatic dependent launch: the whole layer, each variant captured
in its own CUDA graph, as built, with no PDL at all, with one stage (or a set of them) at a
time launched without it (its kernels in order, none releasing its successor early), and with
the dispatch's row copy under PDL too (the plan's Dispatch.copy_pdl, which the stage passes to
triton_dispatch.dispatch). The variants are replayed in turn, ROUNDS times, and each reports
the median of its rounds' medians: a layer's time drifts by more between processes and over a
run than most of these differences. Prints one row per package and T; writes JSON.

    python benchmarks/pdl_stages.py --tokens 1,256,1024,4096 --out $OUT/pdl_stages.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
from common import dump, graphed, import_package, in_turn, stages_of

STAGES = ("select", "dispatch", "gemm_gate_up", "activation", "gemm_down", "combine")
"""The stages of the Triton layers (the router fused into select)."""
ROUNDS = 3


def without_pdl(tiles, fn):
    """fn with tiles.PDL off while it runs (a stage reads it at each call)."""

    def run(*args):
        tiles.PDL = False
        try:
            return fn(*args)
        finally:
            tiles.PDL = True

    return run


def variants(package, layer, x, in_order: list[str]) -> dict:
    """{variant: graph replay} of one forward of x; in_order: the variants with stages launched
    in order, each a "+"-joined list of stage names."""
    tiles = sys.modules[f"{package.__name__}.tiles"]
    dispatch = sys.modules[f"{package.__name__}.triton_dispatch"]
    stages = stages_of(package)
    replays = {"built": graphed(lambda: layer(x))}
    tiles.PDL = False
    try:
        replays["no_pdl"] = graphed(lambda: layer(x))
    finally:
        tiles.PDL = True
    built_dispatch = dispatch.dispatch
    dispatch.dispatch = lambda *args, **kwargs: built_dispatch(
        *args, **{**kwargs, "copy_pdl": True}
    )
    try:
        replays["copy_pdl"] = graphed(lambda: layer(x))
    finally:
        dispatch.dispatch = built_dispatch
    for variant in in_order:
        built = {stage: getattr(stages, stage) for stage in variant.split("+")}
        for stage, fn in built.items():
            setattr(stages, stage, without_pdl(tiles, fn))
        try:
            replays[f"{variant}_in_order"] = graphed(lambda: layer(x))
        finally:
            for stage, fn in built.items():
                setattr(stages, stage, fn)
    return replays


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--packages", default="bench_v3_fp8_triton,bench_v3_bf16_triton")
    parser.add_argument("--tokens", default="1,256,1024,4096")
    parser.add_argument(
        "--in-order",
        default=",".join(STAGES),
        help="variants launching stages in order: comma-separated, stages of one joined by +",
    )
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    rows = []
    for name in args.packages.split(","):
        package = import_package(name)
        layer = package.MoELayer(device="cuda").random_(0)
        hidden = package.PLAN["choices"]["dims"]["hidden"]
        for tokens in map(int, args.tokens.split(",")):
            x = torch.randn(tokens, hidden, device="cuda").bfloat16()
            replays = variants(package, layer, x, args.in_order.split(","))
            rounds = in_turn(replays, args.rounds)
            row = {"package": name, "tokens": tokens}
            row.update({v: round(statistics.median(ms), 4) for v, ms in rounds.items()})
            row["rounds"] = rounds
            rows.append(row)
            print({k: v for k, v in row.items() if k != "rounds"}, flush=True)
            del replays
            torch.cuda.empty_cache()
    dump(Path(args.out), {"device": torch.cuda.get_device_name(), "rows": rows})


if __name__ == "__main__":
    main()
