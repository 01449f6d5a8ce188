"""The decode router / select pair, variant by variant: how many K slices the split-K router leaves
(its PROGRAMS) and how many of them select loads per step (triton_select.SLICES_AT_ONCE). Times
select alone (20 launches in one CUDA graph) and the whole layer (graph replay), at DeepSeek-V3
dims. Prints rows; writes JSON. Run 31 (benchmarks/RESULTS.md) also tried select reading the
top-k weights in one reduction after its argmax loop (commit 0e6c430): no faster; removed.

    python benchmarks/select_variants.py --out $OUT/select_variants.json
"""

from __future__ import annotations

import argparse
import itertools
import sys
from functools import partial
from pathlib import Path

import torch
from common import dump, graphed, import_package, median_ms, select_options
from micro_decode import per_launch_us


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--package", default="bench_v3_fp8_triton")
    parser.add_argument("--tokens", default="1,16")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    package = import_package(args.package)
    router = sys.modules[f"{package.__name__}.triton_router"]
    selection = sys.modules[f"{package.__name__}.triton_select"]
    tiles = sys.modules[f"{package.__name__}.tiles"]
    options = select_options(package)
    layer = package.MoELayer(device="cuda").random_(0)
    decode = tiles.router(1)  # the decode bucket's tiles, changed in place
    built = (decode["PROGRAMS"], selection.SLICES_AT_ONCE)
    rows = []
    for tokens in map(int, args.tokens.split(",")):
        x = torch.randn(tokens, layer.gate_parts.shape[2], device="cuda").bfloat16()
        reference = layer(x)
        for programs, at_once in itertools.product((132, 264), (8, 16)):
            decode["PROGRAMS"] = programs
            selection.SLICES_AT_ONCE = at_once
            logits = router.router_logits(x, layer.gate_parts, config=tiles.router(tokens))
            select = partial(
                selection.select_topk, logits, layer.gate_bias, pdl=tiles.PDL, **options
            )
            select_us = per_launch_us(select)
            replay = graphed(partial(layer, x))
            layer_ms = min(median_ms(replay, warmup=5, repeats=50) for _ in range(2))
            row = {
                "tokens": tokens,
                "router_programs": programs,
                "slices": logits.shape[0],
                "slices_at_once": at_once,
                "select_us": round(select_us, 2),
                "layer_ms": round(layer_ms, 4),
                "same_output": bool(torch.equal(layer(x), reference)),
            }
            rows.append(row)
            print(row, flush=True)
    decode["PROGRAMS"] = built[0]
    selection.SLICES_AT_ONCE = built[1]
    dump(Path(args.out), {"device": torch.cuda.get_device_name(), "rows": rows})


if __name__ == "__main__":
    main()
