"""The whole layer with its experts' padding rows zeroed (padding_data.py's question, in the
layer; issue 27). DeepGEMM's gate/up GEMM computes each expert's padding rows of the dispatch's
layout, which the layer never writes: they hold what the memory held. Three CUDA graphs of one
layer, replayed in turn:

  as built  the layout as the package makes it;
  memset    the same, plus a zero fill of a spare buffer the size of the layout (the zeroing's
            cost alone);
  zeroed    the layout itself zero-filled before the dispatch writes its rows, so the padding
            rows the GEMM reads are 0.

zeroed - memset is what zero padding rows give the GEMM; the fraction of non-zero bytes in the
padding rows of *as built* says what the layer's own padding held in this run, in its graph and
in an eager forward after one of another size.

    cd benchmarks && python padding_layer.py --package bench_v3_fp8_auto --tokens 4096,16384 \
        --out $OUT/padding_layer.json
"""

from __future__ import annotations

import argparse
import importlib
import statistics
from pathlib import Path

import torch
from common import dump, graphed, import_package, in_turn
from padding_data import sustained


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--package", default="bench_v3_fp8_auto")
    parser.add_argument("--tokens", default="4096,16384")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    package = import_package(args.package)
    permute = importlib.import_module(f"{package.__name__}.triton_permute")
    dispatch = importlib.import_module(f"{package.__name__}.triton_dispatch")
    layer = package.MoELayer(device="cuda").random_(0)
    hidden = layer.w13.shape[-1]
    state = {"variant": "as built", "spare": None, "seen": None}
    empty_rows, route_and_permute = permute.empty_rows, dispatch.dispatch

    def patched_empty_rows(x, leading, *rest, **kwargs):
        out, scale = empty_rows(x, leading, *rest, **kwargs)
        if state["variant"] == "zeroed":
            out.zero_()
        elif state["variant"] == "memset":
            if state["spare"] is None or state["spare"].numel() < out.numel():
                state["spare"] = torch.empty(out.numel(), dtype=torch.uint8, device=out.device)
            state["spare"].zero_()
        return out, scale

    def recorded_dispatch(*a, **kw):
        result = route_and_permute(*a, **kw)
        state["seen"] = result  # (a, a_scale, routing) of the last dispatch captured
        return result

    permute.empty_rows, dispatch.dispatch = patched_empty_rows, recorded_dispatch
    rows = []
    for tokens in map(int, args.tokens.split(",")):
        generator = torch.Generator("cuda").manual_seed(tokens)
        x = torch.randn(tokens, hidden, device="cuda", generator=generator).bfloat16()
        replays, outputs, nonzero = {}, {}, None
        for variant in ("as built", "memset", "zeroed"):
            state["variant"] = variant
            out = {}

            def forward(out=out, x=x):
                out["y"] = layer(x)

            replays[variant] = graphed(forward)
            replays[variant]()
            torch.cuda.synchronize()
            outputs[variant] = out["y"].clone()
            if variant == "as built":
                a, _, routing = state["seen"]
                used = int(routing.num_rows[0])
                pad = routing.token_of_row[:used] < 0
                padding = a.view(torch.uint8)[:used][pad]
                nonzero = float((padding != 0).float().mean()) if padding.numel() else 0.0
        # Eager, after a forward of another size: the allocator hands the layout memory that
        # held other tensors, so its padding rows are what they left.
        layer(torch.randn(tokens // 2, hidden, device="cuda").bfloat16())
        state["variant"] = "as built"
        layer(x)
        a, _, routing = state["seen"]
        used = int(routing.num_rows[0])
        eager_padding = a.view(torch.uint8)[:used][routing.token_of_row[:used] < 0]
        eager_nonzero = float((eager_padding != 0).float().mean()) if eager_padding.numel() else 0.0
        del a, routing, eager_padding
        state["seen"] = None
        times = in_turn(replays, args.rounds)
        for variant, replay in replays.items():
            ms, mhz, watts = sustained(replay, 0.5)
            row = dict(
                tokens=tokens,
                variant=variant,
                ms=round(statistics.median(times[variant]), 4),
                rounds_ms=[round(t, 4) for t in times[variant]],
                sustained_ms=round(ms, 4),
                sm_mhz=mhz,
                power_w=watts,
                same_output=bool(torch.equal(outputs[variant], outputs["as built"])),
            )
            if variant == "as built":
                row["padding_nonzero_bytes"] = round(nonzero, 4)
                row["eager_padding_nonzero_bytes"] = round(eager_nonzero, 4)
            rows.append(row)
            print(row, flush=True)
        del replays, outputs
        torch.cuda.empty_cache()
    if args.out:
        dump(Path(args.out), {"gpu": torch.cuda.get_device_name(), "rows": rows})


if __name__ == "__main__":
    main()
