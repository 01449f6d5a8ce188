"""The router alone (triton_router.router_logits) above decode: the layer's tiles and a few
others around them, each 10 calls in one CUDA graph. Prints one row per T and config; writes
JSON.

    python benchmarks/router_tiles.py --tokens 1024,4096,16384 --out $OUT/router_tiles.json
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path

import torch
from common import dump, import_package, per_call_us

VARIANTS = {  # changes to the layer's tiles
    "built": {},
    "E128": {"BLOCK_E": 128},
    "E128_T64": {"BLOCK_E": 128, "BLOCK_T": 64},
    "E256_T64": {"BLOCK_E": 256, "BLOCK_T": 64},
    "K32": {"BLOCK_K": 32},
    "stages4": {"num_stages": 4},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--package", default="bench_v3_fp8_triton")
    parser.add_argument("--tokens", default="1024,4096,16384")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    package = import_package(args.package)
    router = sys.modules[f"{package.__name__}.triton_router"]
    tiles = sys.modules[f"{package.__name__}.tiles"]
    layer = package.MoELayer(device="cuda").random_(0)
    rows = []
    for tokens in map(int, args.tokens.split(",")):
        x = torch.randn(tokens, layer.gate_parts.shape[2], device="cuda").bfloat16()
        built = tiles.router(tokens)
        reference = router.router_logits(x, layer.gate_parts, config=built).sum(0)
        for name, change in VARIANTS.items():
            config = {**built, **change}
            call = partial(router.router_logits, x, layer.gate_parts, config=config)
            try:
                same = bool(torch.equal(call().sum(0), reference))
                us = round(per_call_us(call), 2)
            except Exception as error:  # noqa: BLE001  (a config the GPU cannot run: reported)
                same, us = None, repr(error)[:120]
            row = {"tokens": tokens, "variant": name, "config": config, "us": us, "same": same}
            rows.append(row)
            print(row, flush=True)
    dump(Path(args.out), {"device": torch.cuda.get_device_name(), "rows": rows})


if __name__ == "__main__":
    main()
