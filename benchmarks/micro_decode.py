"""Decode-path kernels alone, at DeepSeek-V3 dims: the split-K router for several grid sizes
and the top-k select for several warp counts, each as 20 launches captured in one CUDA graph
(so the times are the kernels', not the launches'). Prints a table; writes JSON.

    python benchmarks/micro_decode.py --out $OUT/micro_decode.json
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path

import torch
from common import dump, import_package, per_call_us, select_options

LAUNCHES = 20


def per_launch_us(fn) -> float:
    return per_call_us(fn, LAUNCHES)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--package", default="bench_v3_fp8_triton")
    parser.add_argument("--tokens", default="1,16,1024,4096")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    package = import_package(args.package)
    router = sys.modules[f"{package.__name__}.triton_router"]
    selection = sys.modules[f"{package.__name__}.triton_select"]
    tiles = sys.modules[f"{package.__name__}.tiles"]
    layer = package.MoELayer(device="cuda").random_(0)
    rows = []
    for tokens in map(int, args.tokens.split(",")):
        x = torch.randn(tokens, layer.gate_parts.shape[2], device="cuda").bfloat16()
        base = tiles.router(tokens)
        for programs in (1, 132, 264, 528):
            config = {**base, "PROGRAMS": programs}
            call = partial(router.router_logits, x, layer.gate_parts, config=config)
            slices = call().shape[0]
            rows.append(
                {
                    "kernel": "router",
                    "tokens": tokens,
                    "programs": programs,
                    "slices": slices,
                    "us": round(per_launch_us(call), 2),
                }
            )
        logits = router.router_logits(x, layer.gate_parts, config=base)
        options = select_options(package)
        for warps in (1, 2, 4, 8):
            call = partial(
                selection.select_topk, logits, layer.gate_bias, num_warps=warps, **options
            )
            rows.append(
                {
                    "kernel": "select",
                    "tokens": tokens,
                    "num_warps": warps,
                    "slices": logits.shape[0],
                    "us": round(per_launch_us(call), 2),
                }
            )
    for row in rows:
        print(row)
    dump(Path(args.out), {"device": torch.cuda.get_device_name(), "rows": rows})


if __name__ == "__main__":
    main()
