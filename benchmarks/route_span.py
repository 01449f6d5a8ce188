"""The dispatch stage above its one-launch size: route (count, prefix, layout) and the row copy,
timed apart and together for several variants of triton_route.route_layout (SPAN/ONE_PASS:
assignments per program, and counted by every program; as built ROUTE_SPAN, ONE_PASS), each as calls in one CUDA graph, on the layer's own routing of random
tokens at DeepSeek-V3 dims; each variant's indices must equal the built ones ("built": the
package's own route_layout, whatever its options). The row copy alone is timed on the built
routing. --pdl on,off times everything launched with programmatic dependent launch and without
(route-off / copy-off: PDL for every launch but the route's, or the row copy's);
--profile lists the median duration of each kernel of one dispatch (launched without PDL, so
that a duration holds no wait). Prints rows; writes JSON.

    python benchmarks/route_span.py --out $OUT/route_span.json
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path

import torch
from common import dump, import_package, per_call_us, stages_of
from common import route as route_of
from profile_decode import kernel_rows


def without_pdl(fn, *args, **kwargs):
    return fn(*args, **{**kwargs, "pdl": False})


def time_tokens(args, package, stages, route, tiles, layer, tokens) -> list[dict]:
    """Route alone, row copy alone and the whole dispatch at `tokens`, for each variant."""
    experts = layer.w13.shape[0]
    built = route.route_layout
    rows = []
    x = torch.randn(tokens, layer.w13.shape[2], device="cuda").bfloat16()
    _, topk_ids = route_of(package, layer, x)
    block_m = tiles.bucket(tokens).block_m
    reference = stages.dispatch(x, topk_ids)[2]
    dispatch = sys.modules[f"{package.__name__}.triton_dispatch"]
    routed = dispatch.route_contiguous
    dispatch.route_contiguous = lambda *args, routing=reference, **kwargs: routing  # noqa: ARG005
    try:
        copy_us = round(per_call_us(partial(stages.dispatch, x, topk_ids)), 2)
    finally:
        dispatch.route_contiguous = routed
    print({"tokens": tokens, "pdl": tiles.PDL, "copy_us": copy_us}, flush=True)
    for variant in args.variants.split(","):
        if variant != "built":
            span, one_pass = map(int, variant.split("/"))
            # the variant's options over the ones the generated call passes (one_pass)
            route.route_layout = lambda *a, s=span, o=one_pass, **k: built(
                *a, **{**k, "span": s, "one_pass": o}
            )
        try:
            routing = stages.dispatch(x, topk_ids)[2]
            row = {
                "tokens": tokens,
                "variant": variant,
                "pdl": tiles.PDL,
                "copy_us": copy_us,
                "route_us": round(
                    per_call_us(
                        partial(route.route_contiguous, topk_ids, experts, block_m, tiles.PDL)
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
    return rows


def profile(package, stages, layer, tokens: int) -> list[dict]:
    """Each kernel of one dispatch of `tokens` random tokens, median duration."""
    x = torch.randn(tokens, layer.w13.shape[2], device="cuda").bfloat16()
    _, topk_ids = route_of(package, layer, x)
    return kernel_rows(partial(stages.dispatch, x, topk_ids))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--package", default="bench_v3_fp8_triton")
    parser.add_argument("--tokens", default="256,1024,4096,16384")
    parser.add_argument("--variants", default="built,64/1024,256/1024")
    parser.add_argument("--pdl", default="on", help="any of on, off, route-off, copy-off")
    parser.add_argument("--profile", action="store_true", help="kernels of one dispatch")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    package = import_package(args.package)
    route = sys.modules[f"{package.__name__}.triton_route"]
    tiles = sys.modules[f"{package.__name__}.tiles"]
    stages = stages_of(package)
    layer = package.MoELayer(device="cuda").random_(0)
    rows, profiles = [], []
    dispatch = sys.modules[f"{package.__name__}.triton_dispatch"]
    built = {name: getattr(dispatch, name) for name in ("route_contiguous", "permute")}
    for pdl in args.pdl.split(","):
        tiles.PDL = pdl != "off"
        off = {"route-off": "route_contiguous", "copy-off": "permute"}.get(pdl)
        if off:  # that launch without PDL, whatever the dispatch asks
            setattr(dispatch, off, partial(without_pdl, built[off]))
        try:
            for tokens in map(int, args.tokens.split(",")):
                for row in time_tokens(args, package, stages, route, tiles, layer, tokens):
                    rows.append({**row, "pdl": pdl})
                if args.profile and pdl == "off":
                    profiles.append(
                        {"tokens": tokens, "kernels": profile(package, stages, layer, tokens)}
                    )
                    print(profiles[-1], flush=True)
        finally:
            for name, fn in built.items():
                setattr(dispatch, name, fn)
    device = torch.cuda.get_device_name()
    dump(Path(args.out), {"device": device, "rows": rows, "profiles": profiles})


if __name__ == "__main__":
    main()
