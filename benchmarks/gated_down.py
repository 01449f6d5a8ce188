"""Experiment: the down GEMM computing its fp8 operand from the gate/up output in its K loop
(triton_gemm.grouped_gemm with `activation`), instead of the activation kernel writing it first.
One launch fewer per forward; each of the down GEMM's column programs recomputes the activation of
its rows, which costs little while the rows are few.

For each T: the layer as built and the layer with the activation stage folded into the down GEMM
(the package's stage functions replaced), each captured in a CUDA graph and timed in turn (best of
two), their outputs compared bit for bit, and at decode sizes the kernels of one replay.

    python benchmarks/gated_down.py --out $OUT/gated_down.json

Run 32 (benchmarks/RESULTS.md) ran it at commit 6c87c3c, where triton_gemm had the `activation`
option: bit-identical, and 1.8-9x slower; the option was removed, so this script no longer runs
against later packages.
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path

import torch
from common import dump, graphed, import_package, median_ms
from profile_decode import kernel_rows


def fold_activation(package):
    """Replace the package's activation and down stages by the one-launch version; returns a
    function that puts the originals back."""
    stages = sys.modules[f"{package.__name__}.stages"]
    gemm = sys.modules[f"{package.__name__}.triton_gemm"]
    tiles = sys.modules[f"{package.__name__}.tiles"]
    gated = sys.modules[f"{package.__name__}.gated_activation"].triton_gated
    original = stages.activation, stages.gemm_down

    def activation(h, routing):
        return h, None

    def gemm_down(h, _scale, routing, w2, w2_scale):
        return gemm.grouped_gemm_contiguous(
            h,
            None,
            w2,
            w2_scale,
            routing,
            scheme="fp8_block",
            config=tiles.bucket(routing.row_of.shape[0]).down,
            out_dtype=stages.DTYPE,
            pdl=tiles.PDL,
            activation=gated,
        )

    stages.activation, stages.gemm_down = activation, gemm_down

    def restore():
        stages.activation, stages.gemm_down = original

    return restore


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--package", default="bench_v3_fp8_triton")
    parser.add_argument("--tokens", default="1,2,4,8,16,64,256,1024")
    parser.add_argument("--profile-max", type=int, default=4)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    package = import_package(args.package)
    layer = package.MoELayer(device="cuda").random_(0)
    rows = []
    for tokens in map(int, args.tokens.split(",")):
        x = torch.randn(tokens, layer.w13.shape[2], device="cuda").bfloat16()
        reference = layer(x)
        restore = fold_activation(package)
        folded_out = layer(x)
        folded = graphed(partial(layer, x))
        restore()
        plain = graphed(partial(layer, x))
        times = {"plain": [], "folded": []}
        for _ in range(2):
            times["plain"].append(median_ms(plain, warmup=5, repeats=50))
            times["folded"].append(median_ms(folded, warmup=5, repeats=50))
        row = {
            "tokens": tokens,
            "plain_ms": round(min(times["plain"]), 4),
            "folded_ms": round(min(times["folded"]), 4),
            "equal": bool(torch.equal(folded_out, reference)),
            "max_abs_diff": float((folded_out.float() - reference.float()).abs().max()),
        }
        if tokens <= args.profile_max:
            row["folded_kernels"] = kernel_rows(folded)
        rows.append(row)
        print(row, flush=True)
    dump(Path(args.out), {"device": torch.cuda.get_device_name(), "rows": rows})


if __name__ == "__main__":
    main()
