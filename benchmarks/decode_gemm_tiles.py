"""The grouped GEMMs under tiles `moec tune` does not try: each grouped GEMM of one forward at
T tokens (default 1), replayed on its recorded arguments from a CUDA graph, with the bucket's
config replaced by each candidate in turn (BLOCK_N, num_stages, num_warps, swap-AB). At T=1 a
grid of 9 experts x N / BLOCK_N programs is about one wave of the H200's 132 SMs, and how many
programs fit on an SM at once (shared memory: num_stages x the A and W tiles) decides whether
the last of them run as a second, short wave. Prints each config's time beside the shipped
one's; writes JSON. With --vary KEY=V1,V2 (repeatable), the shipped config with those keys
changed instead, e.g. --vary BLOCK_N=64,128 --vary GROUP_SIZE_M=1,2,4,8 (the order in which
the programs of the experts' tiles are scheduled) or --vary FP8_ACC=none,128.

    python benchmarks/decode_gemm_tiles.py --packages bench_v3_fp8_triton,bench_v3_bf16_triton --out $OUT/decode_tiles.json
"""

from __future__ import annotations

import argparse
import ast
import itertools
import sys
from pathlib import Path

import torch
from common import dump, import_package
from stage_times import recorded_calls, stage_us

GEMMS = ("gemm_gate_up", "gemm_down")
KEYS = {"gemm_gate_up": "gate_up", "gemm_down": "down"}


def candidates(shipped: dict, fp8: bool, tokens: int) -> list[dict]:
    """The shipped config and its neighbours: BLOCK_N 32-256, 2-6 stages, 4 warps (8 for the
    wide tiles), plain and swap-AB; fp8 plain tiles promote every 128 K elements. From 1024
    tokens on (tens of rows per expert) plain tiles only, BLOCK_N 64-256, 3-6 stages."""
    configs = [shipped]
    grid = ((32, 64, 128, 256), (2, 3, 4, 6), (4, 8), (False, True))
    if tokens >= 1024:
        grid = ((64, 128, 256), (3, 4, 5, 6), (4, 8), (False,))
    for block_n, stages, warps, swap in itertools.product(*grid):
        if warps == 8 and (block_n < 128 or stages == 6):
            continue
        config = {**shipped, "BLOCK_N": block_n, "num_stages": stages, "num_warps": warps}
        config.pop("SWAP_AB", None)
        if swap:
            config["SWAP_AB"] = True
        if fp8 and not swap:  # the tuner's fp8 candidates come with and without FP8_ACC
            config["FP8_ACC"] = 128
        if config != shipped:
            configs.append(config)
    return configs


def varied(shipped: dict, changes: list[str]) -> list[dict]:
    """The shipped config and every combination of the --vary values, e.g. ["BLOCK_N=64,128",
    "GROUP_SIZE_M=1,8"]; a value "none" drops the key (FP8_ACC=none: the default)."""
    axes = []
    for change in changes:
        key, values = change.split("=", 1)
        axes.append(
            [(key, None if v == "none" else ast.literal_eval(v)) for v in values.split(",")]
        )
    configs = [shipped]
    for combination in itertools.product(*axes):
        config = dict(shipped)
        for key, value in combination:
            config.pop(key, None)
            if value is not None:
                config[key] = value
        if config not in configs:
            configs.append(config)
    return configs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--packages", default="bench_v3_fp8_triton,bench_v3_bf16_triton")
    parser.add_argument("--tokens", default="1")
    parser.add_argument("--out", required=True)
    parser.add_argument("--vary", action="append", metavar="KEY=V1,V2", help="configs to try")
    args = parser.parse_args()
    rows = []
    for name in args.packages.split(","):
        package = import_package(name)
        tiles = sys.modules[f"{package.__name__}.tiles"]
        fp8 = package.PLAN["choices"]["dims"]["routed"]["scheme"].startswith("fp8")
        layer = package.MoELayer(device="cuda").random_(0)
        hidden = package.PLAN["choices"]["dims"]["hidden"]
        for tokens in map(int, args.tokens.split(",")):
            x = torch.randn(tokens, hidden, device="cuda").bfloat16()
            calls = {stage: (fn, a) for stage, fn, a in recorded_calls(package, layer, x)}
            bucket = tiles.bucket(tokens)
            for stage in GEMMS:
                fn, call_args = calls[stage]
                routing = next(a for a in call_args if hasattr(a, "row_of"))
                used = routing.row_of.flatten()  # the rows assignments fill (no padding)
                used = used[used >= 0].long()
                reference = fn(*call_args)[used]
                # Timed once and dropped: the first config timed per GEMM read 2-3% high in runs
                # 75 and 77, against the same work timed later (the cause was not found).
                stage_us(fn, call_args)
                shipped = getattr(bucket, KEYS[stage])
                if args.vary:
                    configs = varied(shipped, args.vary)
                else:
                    configs = candidates(shipped, fp8, tokens)
                for config in configs:
                    patched = bucket._replace(**{KEYS[stage]: config})
                    original = tiles.bucket
                    tiles.bucket = lambda _tokens, patched=patched: patched
                    try:
                        out = fn(*call_args)[used]
                        us = round(stage_us(fn, call_args), 2)
                    except Exception as error:  # a tile that does not compile or fit: a row
                        out, us = None, repr(error)[:120]
                    finally:
                        tiles.bucket = original
                    same = out is not None and bool(
                        torch.allclose(out.float(), reference.float(), rtol=2e-2, atol=1e-2)
                    )
                    row = {
                        "package": name,
                        "tokens": tokens,
                        "stage": stage,
                        "shipped": config is shipped,
                        "config": config,
                        "us": us,
                        "close_to_shipped": same,
                    }
                    rows.append(row)
                    print(row, flush=True)
    dump(Path(args.out), {"device": torch.cuda.get_device_name(), "rows": rows})


if __name__ == "__main__":
    main()
