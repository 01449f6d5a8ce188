"""The dispatch stage above its one-launch size: route (count, prefix, layout) and the row copy,
timed apart and together for several `span`s (assignments per part of triton_route.route_layout,
as built ROUTE_SPAN), each as calls in one CUDA graph, on the layer's own routing of random
tokens at DeepSeek-V3 dims. Prints rows; writes JSON.

    python benchmarks/route_span.py --out $OUT/route_span.json
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path

import torch
from common import dump, import_package, per_call_us, stages_of


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--package", default="bench_v3_fp8_triton")
    parser.add_argument("--tokens", default="256,1024,4096,16384")
    parser.add_argument("--spans", default="1024,2048,4096,8192")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    package = import_package(args.package)
    route = sys.modules[f"{package.__name__}.triton_route"]
    tiles = sys.modules[f"{package.__name__}.tiles"]
    stages = stages_of(package)
    layer = package.MoELayer(device="cuda").random_(0)
    experts = layer.w13.shape[0]
    built = route.route_layout
    rows = []
    for tokens in map(int, args.tokens.split(",")):
        x = torch.randn(tokens, layer.w13.shape[2], device="cuda").bfloat16()
        _, topk_ids = stages.select(stages.router(x, layer.gate_parts), layer.gate_bias)
        block_m = tiles.bucket(tokens).block_m
        reference = stages.dispatch(x, topk_ids)[2]
        for span in map(int, args.spans.split(",")):
            route.route_layout = partial(built, span=span)
            try:
                routing = stages.dispatch(x, topk_ids)[2]
                row = {
                    "tokens": tokens,
                    "span": span,
                    "route_us": round(
                        per_call_us(
                            partial(route.route_contiguous, topk_ids, experts, block_m, True)
                        ),
                        2,
                    ),
                    "dispatch_us": round(per_call_us(partial(stages.dispatch, x, topk_ids)), 2),
                    "same_routing": all(
                        torch.equal(a, b) for a, b in zip(routing, reference, strict=True)
                    ),
                }
            finally:
                route.route_layout = built
            rows.append(row)
            print(row, flush=True)
    dump(Path(args.out), {"device": torch.cuda.get_device_name(), "rows": rows})


if __name__ == "__main__":
    main()
