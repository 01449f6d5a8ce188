"""The memory-bound stages of a DeepGEMM prefill layer, tile by tile, at prefill T (issue 27).

The permute, activation and combine tiles a package runs are one config for every T, chosen by
`moec tune` at T=4096 (and only the combine's re-tuned since, runs 38-40). At T=16384 the
dispatch's row copy runs at about 60% of the H200's copy bandwidth (runs 88, 105). For each T,
each candidate tile of each stage is timed as its stage replayed from a CUDA graph
(benchmarks/stage_times.py), its output checked bit for bit against the built tile's on the rows
in use; the best few are then timed in the whole layer (graph replay) beside the built tiles, in
turn. The dispatch is also timed with its scales written row-major (`rowmajor_scales`), to
measure what writing DeepGEMM's MN-major activation scales from a scatter costs (not a layout
DeepGEMM takes: a probe only). Prints rows; writes JSON.

    cd benchmarks && python prefill_elementwise.py --out $OUT/prefill_elementwise.json
"""

from __future__ import annotations

import argparse
import itertools
import sys
from functools import partial
from pathlib import Path

import torch
from common import dump, graphed, import_package, in_turn
from stage_times import recorded_calls, stage_us

PERMUTE = [
    {"BLOCK_M": m, "BLOCK_H": h, "num_warps": w}
    for m, h, w in itertools.product((1, 2, 4, 8, 16), (512, 1024, 2048), (2, 4, 8, 16))
    if 8 <= m * h // (32 * w) <= 64  # values per thread
]
ACT = [
    {"BLOCK_M": m, "BLOCK_I": i, "num_warps": w}
    for m, i, w in itertools.product((1, 2, 4, 8), (512, 1024, 2048), (1, 2, 4, 8))
    if 8 <= m * i // (32 * w) <= 64
]
COMBINE = [
    {"BLOCK_T": t, "BLOCK_H": h, "num_warps": w, "TERMS_AT_ONCE": terms}
    for t, h, w, terms in itertools.product((1, 2, 4), (256, 512, 1024), (1, 2, 4, 8), (2, 4, 8))
    if 2 <= t * h * terms // (32 * w) <= 256
]
STAGES = {  # stage -> (tiles attribute, candidates); its function: the stage's name, or with
    # "_deep_gemm" where the package's GEMM split runs DeepGEMM at this T
    "dispatch": ("PERMUTE", PERMUTE),
    "activation": ("ACT", ACT),
    "combine": ("COMBINE", COMBINE),
}


def valid_rows(routing) -> torch.Tensor:
    return routing.token_of_row >= 0


def rows_and_scales(out) -> tuple:
    """(rows, scales or None) of a dispatch's or an activation's output."""
    return (out, None) if torch.is_tensor(out) else (out[0], out[1])


def same_output(name: str, got, want, routing) -> bool:
    """Bit for bit on the layout's rows in use (padding rows are never written)."""
    if name == "combine":
        return torch.equal(got, want)
    rows = valid_rows(routing)
    (a, a_scale), (ref, ref_scale) = rows_and_scales(got), rows_and_scales(want)
    same = torch.equal(a[rows].view(torch.uint8), ref[rows].view(torch.uint8))
    if a_scale is not None:  # [M, groups] in either layout
        same = same and torch.equal(a_scale[rows], ref_scale[rows])
    return same


def rowmajor_us(package, fn, call_args) -> tuple[float, bool]:
    """The dispatch timed with its scales row-major, and whether its rows and scales equal the
    built dispatch's."""
    dispatch_module = sys.modules[f"{package.__name__}.triton_dispatch"]
    original = dispatch_module.dispatch

    def rowmajor(*args, **kwargs):
        return original(*args, **{**kwargs, "mn_major_scales": False})

    dispatch_module.dispatch = rowmajor
    try:
        got = fn(*call_args)
        us = stage_us(fn, call_args)
    finally:
        dispatch_module.dispatch = original
    want = fn(*call_args)
    rows = valid_rows(want[2])
    same = torch.equal(got[0][rows].view(torch.uint8), want[0][rows].view(torch.uint8))
    same = same and torch.equal(got[1][rows], want[1][rows])
    return us, same


def with_tiles(tiles, configs: dict, forward):
    """Set the package's tiles; capture forward (if any) in a CUDA graph on them."""
    for attribute, config in configs.items():
        setattr(tiles, attribute, dict(config))
    return graphed(forward) if forward else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--package", default="bench_v3_fp8_auto")
    parser.add_argument("--tokens", default="4096,16384")
    parser.add_argument("--best", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--stages", default="dispatch,activation")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    package = import_package(args.package)
    tiles = sys.modules[f"{package.__name__}.tiles"]
    built = {attribute: dict(getattr(tiles, attribute)) for attribute, _ in STAGES.values()}
    layer = package.MoELayer(device="cuda").random_(0)
    hidden = package.PLAN["choices"]["dims"]["hidden"]
    result = {"device": torch.cuda.get_device_name(), "package": args.package, "built": built}
    result.update(stages=[], layers=[], rowmajor=[])
    for tokens in map(int, args.tokens.split(",")):
        x = torch.randn(tokens, hidden, device="cuda").bfloat16()
        calls = {}
        for name, fn, call_args in recorded_calls(package, layer, x):
            calls[name.removesuffix("_deep_gemm")] = (name, fn, call_args)
        routing = calls["activation"][2][1]
        best = {}
        for name in args.stages.split(","):
            attribute, candidates = STAGES[name]
            function, fn, call_args = calls[name]
            want = fn(*call_args)
            timed = []
            for config in [built[attribute], *candidates]:
                setattr(tiles, attribute, dict(config))
                try:
                    ok = same_output(name, fn(*call_args), want, routing)
                except Exception as error:  # a tile Triton cannot compile or launch
                    print(f"T={tokens} {name} {config}: {type(error).__name__}", flush=True)
                    continue
                if ok:
                    timed.append((stage_us(fn, call_args), config))
                else:
                    print(f"T={tokens} {name} {config}: output differs", flush=True)
            setattr(tiles, attribute, dict(built[attribute]))
            built_us = timed[0][0]
            timed.sort(key=lambda item: item[0])
            for us, config in timed[: args.best]:
                row = {"tokens": tokens, "stage": function, "config": config, "us": round(us, 2)}
                row.update(built_us=round(built_us, 2), built=config == built[attribute])
                result["stages"].append(row)
                print(row, flush=True)
            best[attribute] = timed[0][1]
            if function == "dispatch_deep_gemm" and want[1] is not None:  # quantized rows
                us, same = rowmajor_us(package, fn, call_args)
                row = {
                    "tokens": tokens,
                    "built_us": round(built_us, 2),
                    "rowmajor_us": round(us, 2),
                }
                row["same"] = same
                result["rowmajor"].append(row)
                print(row, flush=True)

        replays = {
            "built": with_tiles(tiles, built, partial(layer, x)),
            "best": with_tiles(tiles, {**built, **best}, partial(layer, x)),
        }
        with_tiles(tiles, built, None)
        samples = in_turn(replays, args.rounds, warmup=3, repeats=20)
        row = {"tokens": tokens, "best": best}
        row.update({name: round(min(ms), 4) for name, ms in samples.items()})
        result["layers"].append(row)
        print(row, flush=True)
        dump(Path(args.out), result)


if __name__ == "__main__":
    main()
