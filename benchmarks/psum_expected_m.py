"""DeepGEMM's `expected_m_for_psum_layout` hint on the layer's two grouped GEMMs (issue 27).

In the psum layout DeepGEMM picks its tiles by a model of the GEMM as one problem of all the
rows (expected_m = m, one group) unless told the rows a group expects: then it models
num_groups problems of expected_m rows each, which can pick another block_n or cluster shape.
DeepSeek-V3 shapes, 256 routed experts with the counts of T*8 uniformly random expert choices
plus the shared expert fused as group 257 with T rows; each hint in turn, 3 rounds, best of
20-launch medians; the check is each hint's output against no hint's (the tiles change only
the summation order within a K block's promotion, so it is 0 or a few bf16 ulps).

    cd benchmarks && python psum_expected_m.py --schemes fp8,bf16 --out $OUT/psum_expected_m.json
"""

from __future__ import annotations

import argparse
import json
import os

import deep_gemm
import torch
from psum_remainder import (
    HIDDEN,
    INTER,
    TOPK,
    layout,
    operands,
    timed,
    uniform_counts,
    weights,
    write_rows,
)


def call(scheme: str, a, w, out, ends, hint: int | None) -> None:
    extra = {} if hint is None else {"expected_m_for_psum_layout": hint}
    if scheme == "bf16":
        deep_gemm.m_grouped_bf16_gemm_nt_contiguous(a, w, out, ends, use_psum_layout=True, **extra)
    else:
        deep_gemm.m_grouped_fp8_gemm_nt_contiguous(
            a, w, out, ends, disable_ue8m0_cast=True, use_psum_layout=True, **extra
        )


def time_hints(scheme, tokens, gemm, shape, ends, rows, hints, args) -> list[dict]:
    """One GEMM under each hint in turn: its best time and its output against no hint's."""
    n, k = shape
    a, w, out = operands(rows, n, k, weights(n, k, scheme), scheme)

    def run(hint: int | None) -> None:
        call(scheme, a, w, out, ends, hint)

    run(None)
    reference = out.float().clone()
    scale = reference.abs().max().item()
    checks = {}
    for hint in hints:
        run(hint)
        checks[hint] = (out.float() - reference).abs().max().item() / scale
    times: dict[int | None, list[float]] = {hint: [] for hint in hints}
    for _ in range(args.rounds):
        for hint in hints:
            times[hint].append(timed(lambda hint=hint: run(hint)))
    found = []
    for hint in hints:
        row = dict(
            scheme=scheme,
            tokens=tokens,
            gemm=gemm,
            expected_m=hint,
            ms=round(min(times[hint]), 4),
            check_vs_none=checks[hint],
        )
        found.append(row)
        print(json.dumps(row), flush=True)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", default="2048,4096,16384")
    parser.add_argument("--schemes", default="fp8,bf16")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--print-configs", action="store_true")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.print_configs:
        os.environ["DG_PRINT_CONFIGS"] = "1"
    torch.manual_seed(0)
    shapes = {"gate_up": (2 * INTER, HIDDEN), "down": (HIDDEN, INTER)}
    rows_out = []
    for scheme in args.schemes.split(","):
        for tokens in map(int, args.tokens.split(",")):
            counts = uniform_counts(tokens * TOPK) + [tokens]
            ends, rows = layout(counts)
            mean = -(-sum(counts) // len(counts))
            hints = [None, mean, 2 * mean, max(1, mean // 2), tokens]
            for gemm, (n, k) in shapes.items():
                rows_out += time_hints(scheme, tokens, gemm, (n, k), ends, rows, hints, args)
                torch.cuda.empty_cache()
    if args.out:
        write_rows(args.out, rows_out)


if __name__ == "__main__":
    main()
