"""Do the values in the experts' padding rows change what DeepGEMM's grouped fp8 GEMMs cost?
(issue 27). At prefill the H200 runs the layer's GEMMs below its top clock (runs 88-89: 1395-1785
MHz, fp8 at T=16384), so they are bound by power as much as by their work, and a tensor core
draws less power on zeros than on random bits. The sm90 kernels compute every 128-row block
whole (run 94), so each expert's padding rows (up to 30% of the rows at T=4096) go through the
MMAs; the layer never writes them, so they hold whatever the memory held.

The layer's two GEMMs (DeepSeek-V3; 256 routed experts with the counts of uniformly random top-8
choices plus the shared expert fused as group 257; the psum layout) on the same operands but the
padding rows: *random* (random e4m3, as stale data) or *zero*; and the *even* layout (no padding)
for scale. Each variant runs back to back for --warm seconds first (the clock settles), then
CUDA-event medians of gate/up followed by down, the SM clock and board power sampled by
nvidia-smi meanwhile; variants in turn, --rounds rounds.

    cd benchmarks && python padding_data.py --tokens 4096,16384 --out $OUT/padding_data.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time

import deep_gemm
import torch
from psum_remainder import (
    BLOCK,
    EXPERTS,
    HIDDEN,
    INTER,
    TOPK,
    fp8,
    layout,
    uniform_counts,
    weights,
    write_rows,
)

SHAPES = {"gate_up": (2 * INTER, HIDDEN), "down": (HIDDEN, INTER)}


def padding_mask(counts: list[int], rows: int) -> torch.Tensor:
    """True on the rows no expert owns (each group starts at a 128-aligned row)."""
    owned = torch.zeros(rows, dtype=torch.bool)
    start = 0
    for count in counts:
        owned[start : start + count] = True
        start = -(-(start + count) // BLOCK) * BLOCK
    return ~owned.cuda()


def operands(rows: int, ws: dict) -> dict:
    """Each GEMM's (a, a_scale) (random e4m3 in every row), weights and output."""
    out = {}
    for gemm, (n, k) in SHAPES.items():
        a_scale = torch.rand(k // BLOCK, rows, device="cuda").add(0.5).t()
        result = torch.empty(rows, n, device="cuda", dtype=torch.bfloat16)
        out[gemm] = ((fp8(rows, k), a_scale), ws[gemm], result)
    return out


def zeroed(gemms: dict, pad: torch.Tensor) -> dict:
    """The same operands with the padding rows of each a set to 0 (a copy)."""
    out = {}
    for gemm, ((a, a_scale), w, result) in gemms.items():
        a = a.clone()
        a.view(torch.uint8)[pad] = 0  # e4m3 has no masked fill; byte 0 is +0
        out[gemm] = ((a, a_scale), w, torch.empty_like(result))
    return out


class Sampler:
    """nvidia-smi's SM clock (MHz) and board power (W) every 50 ms while in use."""

    def __enter__(self):
        self.proc = subprocess.Popen(
            ["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
             "-lms", "50"],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        return self

    def __exit__(self, *_):
        self.proc.terminate()
        lines = self.proc.communicate()[0].splitlines()
        pairs = [tuple(map(float, line.split(","))) for line in lines if line.count(",") == 1]
        self.clock = statistics.median(p[0] for p in pairs) if pairs else None
        self.power = statistics.median(p[1] for p in pairs) if pairs else None


def sustained(fn, warm: float, repeats: int = 20) -> tuple[float, float | None, float | None]:
    """(median ms of fn after `warm` seconds of running it, SM MHz, W) — clock and power over
    the timed calls."""
    end = time.perf_counter() + warm
    while time.perf_counter() < end:
        for _ in range(10):
            fn()
        torch.cuda.synchronize()
    times = []
    with Sampler() as sampler:
        for _ in range(repeats):
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop))
    return statistics.median(times), sampler.clock, sampler.power


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", default="4096,16384")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warm", type=float, default=0.5)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.manual_seed(0)
    rows_out = []
    for tokens in map(int, args.tokens.split(",")):
        routed = tokens * TOPK
        random_counts = uniform_counts(routed)
        ws = {gemm: weights(n, k) for gemm, (n, k) in SHAPES.items()}
        layouts = {
            "even": [routed // EXPERTS] * EXPERTS + [tokens],  # the shared expert: group 257
            "random": random_counts + [tokens],
        }
        variants = {}
        for name, counts in layouts.items():
            ends, rows = layout(counts)
            pad = padding_mask(counts, rows)
            gemms = operands(rows, ws)
            if name == "even":
                variants[name] = (ends, int(pad.sum()), gemms)
            else:
                variants["random padding"] = (ends, int(pad.sum()), gemms)
                variants["zero padding"] = (ends, int(pad.sum()), zeroed(gemms, pad))
        results: dict[str, list] = {name: [] for name in variants}
        for _ in range(args.rounds):
            for name, (ends, _, gemms) in variants.items():

                def forward(gemms=gemms, ends=ends):
                    for a, w, out in gemms.values():
                        deep_gemm.m_grouped_fp8_gemm_nt_contiguous(
                            a, w, out, ends, disable_ue8m0_cast=True, use_psum_layout=True
                        )

                results[name].append(sustained(forward, args.warm))
        for name, (_, padding, _) in variants.items():
            best = min(results[name], key=lambda r: r[0])
            row = dict(
                tokens=tokens,
                variant=name,
                padding_rows=padding,
                both_ms=round(best[0], 4),
                rounds_ms=[round(r[0], 4) for r in results[name]],
                sm_mhz=best[1],
                power_w=best[2],
            )
            rows_out.append(row)
            print(json.dumps(row), flush=True)
        del variants, ws
        torch.cuda.empty_cache()
    if args.out:
        write_rows(args.out, rows_out)


if __name__ == "__main__":
    main()
