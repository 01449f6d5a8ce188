"""The dispatch stage above its one-launch size: route (count, prefix, layout) and the row copy,
timed apart and together for several variants of triton_route.route_layout (SPAN/ONE_PASS:
assignments per program, and counted by every program; as built ROUTE_SPAN, ONE_PASS), each as calls in one CUDA graph, on the layer's own routing of random
tokens at DeepSeek-V3 dims; each variant's indices must equal the built ones ("built": the
package's own route_layout, whatever its options). The row copy alone is timed on the built
routing. Prints rows; writes JSON.

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
    parser.add_argument("--variants", default="built,64/1024,256/1024")
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
        dispatch = sys.modules[f"{package.__name__}.triton_dispatch"]
        routed = dispatch.route_contiguous
        dispatch.route_contiguous = lambda *args, routing=reference, **kwargs: routing  # noqa: ARG005
        try:
            copy_us = round(per_call_us(partial(stages.dispatch, x, topk_ids)), 2)
        finally:
            dispatch.route_contiguous = routed
        print({"tokens": tokens, "copy_us": copy_us}, flush=True)
        for variant in args.variants.split(","):
            if variant != "built":
                span, one_pass = map(int, variant.split("/"))
                route.route_layout = partial(built, span=span, one_pass=one_pass)
            try:
                routing = stages.dispatch(x, topk_ids)[2]
                row = {
                    "tokens": tokens,
                    "variant": variant,
                    "copy_us": copy_us,
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
