"""The activation and combine kernels at decode sizes, tile by tile, against the tiles the package
runs at each T (its tuned tiles are chosen at T=4096 by moec/tune/elementwise.py; the combine has
decode tiles since runs 35-37 of benchmarks/RESULTS.md). For each T, each candidate is timed as its
stage replayed from a CUDA graph (benchmarks/stage_times.py), its output checked bit for bit
against the package's, and the best few then timed inside the whole layer (graph replay, PDL as
built). Prints rows; writes JSON.

    python benchmarks/decode_elementwise.py --out $OUT/decode_elementwise.json
"""

from __future__ import annotations

import argparse
import itertools
import sys
from functools import partial
from pathlib import Path

import torch
from common import dump, graphed, import_package, median_ms
from stage_times import recorded_calls, stage_us

COMBINE = [
    {"BLOCK_T": t, "BLOCK_H": h, "num_warps": w, "TERMS_AT_ONCE": terms}
    for t, h, w, terms in itertools.product((1, 4), (256, 512, 1024), (1, 2, 4), (4, 8, 16))
    if t * h * terms // (32 * w) <= 256  # fp32 values per thread
]
ACT = [
    {"BLOCK_M": m, "BLOCK_I": i, "num_warps": w}
    for m, i, w in itertools.product((1, 2, 4), (512, 1024, 2048), (1, 2, 4))
]


def apply(package, name: str, config: dict) -> None:
    """Run the stage on `config` at every T (the combine's decode tiles switched off)."""
    tiles = sys.modules[f"{package.__name__}.tiles"]
    if name == "combine":
        tiles.COMBINE_DECODE_ROWS = 0
        tiles.COMBINE = dict(config)
    else:
        tiles.ACT = dict(config)


def same_output(name: str, got, want, call_args) -> bool:
    """Bit for bit; the activation only on the layout's rows in use (it leaves padding unwritten)."""
    if name == "activation":
        valid = call_args[1].m_indices >= 0
        return all(torch.equal(g[valid], w[valid]) for g, w in zip(got, want, strict=True))
    return torch.equal(got.view(torch.uint8), want.view(torch.uint8))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--package", default="bench_v3_fp8_triton")
    parser.add_argument("--tokens", default="1,4,16")
    parser.add_argument("--best", type=int, default=3)
    parser.add_argument("--stages", default="combine,activation")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    package = import_package(args.package)
    tiles = sys.modules[f"{package.__name__}.tiles"]
    combine = sys.modules[f"{package.__name__}.triton_combine"]
    shipped = (tiles.COMBINE, tiles.COMBINE_DECODE_ROWS, tiles.ACT)
    layer = package.MoELayer(device="cuda").random_(0)
    hidden = package.PLAN["choices"]["dims"]["hidden"]
    rows = []
    for tokens in map(int, args.tokens.split(",")):
        x = torch.randn(tokens, hidden, device="cuda").bfloat16()
        calls = {name: (fn, a) for name, fn, a in recorded_calls(package, layer, x)}
        built = {  # the tiles the package runs at this T
            "combine": {"TERMS_AT_ONCE": combine.TERMS_AT_ONCE, **tiles.combine(tokens)},
            "activation": dict(tiles.ACT),
        }
        for name in args.stages.split(","):
            candidates = {"combine": COMBINE, "activation": ACT}[name]
            fn, call_args = calls[name]
            want = fn(*call_args)
            timed = []
            for config in [built[name], *candidates]:
                apply(package, name, config)
                if same_output(name, fn(*call_args), want, call_args):
                    timed.append((stage_us(fn, call_args), config))
            apply(package, name, built[name])
            timed.sort(key=lambda item: item[0])
            for us, config in [t for t in timed if t[1] is built[name]] + timed[: args.best]:
                apply(package, name, config)
                layer_ms = min(
                    median_ms(graphed(partial(layer, x)), warmup=5, repeats=50) for _ in range(2)
                )
                row = {
                    "tokens": tokens,
                    "stage": name,
                    "config": config,
                    "built": config is built[name],
                    "stage_us": round(us, 2),
                    "layer_ms": round(layer_ms, 4),
                }
                rows.append(row)
                print(row, flush=True)
            apply(package, name, built[name])
        tiles.COMBINE, tiles.COMBINE_DECODE_ROWS, tiles.ACT = shipped
    dump(Path(args.out), {"device": torch.cuda.get_device_name(), "rows": rows})


if __name__ == "__main__":
    main()
