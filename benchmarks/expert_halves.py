"""Can the activation hide under the expert GEMMs if the experts run in two halves? (issue 27)

A pipelined forward over token chunks reads every expert's weights once per chunk, which at
prefill (about 11 GB for DeepSeek-V3) costs more than it hides. Splitting the experts in two
halves instead reads each weight once: the gate/up GEMM of half A, then of half B, while the
activation of half A runs beside it on a second stream; the activation of half B beside the down
GEMM of half A. This times, on the layer's shapes (256 routed experts with the counts of uniform
random choices, plus the shared expert fused as group 257 with T rows; DeepGEMM's psum layout,
as the plan runs them; the package's own activation + quantization kernel), each captured in
one CUDA graph, in turn:

  whole     gate/up, activation, down over all experts (what the layer runs)
  halves    the same as two halves, one after the other (what the split costs by itself)
  overlap   the halves on two streams, the activations beside the other half's GEMM

whole - overlap is what a split forward could gain on these stages; the dispatch of half B
under the gate/up GEMM of half A would add to it at the same rate.

    cd benchmarks && python expert_halves.py --package bench_v3_fp8_auto --scheme fp8 \
        --tokens 2048,4096,16384 --out $OUT/expert_halves_fp8.json
"""

from __future__ import annotations

import argparse
import json
import statistics

import deep_gemm
import torch
from common import graphed, import_package, in_turn
from psum_remainder import BLOCK, EXPERTS, HIDDEN, INTER, TOPK, fp8, layout, write_rows

GROUPS = EXPERTS + 1  # the shared expert fused as the last group


class Half:
    """One group range's operands: activations, gate/up output, activation output, down output."""

    def __init__(self, counts: list[int], scheme: str, mn_major):
        self.ends, self.rows = layout(counts)
        starts = [-(-end // BLOCK) * BLOCK for end in [0, *self.ends.tolist()[:-1]]]
        used = [r for s, c in zip(starts, counts, strict=True) for r in range(s, s + c)]
        self.row_of = torch.tensor(used, dtype=torch.int32, device="cuda").view(-1, 1)
        rows = self.rows
        if scheme == "fp8":
            self.a = (fp8(rows, HIDDEN), mn_major(rows, HIDDEN // BLOCK, device="cuda").fill_(1))
        else:
            self.a = torch.randn(rows, HIDDEN, device="cuda", dtype=torch.bfloat16)
        self.h = torch.randn(rows, 2 * INTER, device="cuda", dtype=torch.bfloat16)
        self.y = torch.empty(rows, HIDDEN, device="cuda", dtype=torch.bfloat16)


def weights(scheme: str, n: int, k: int, groups: slice):
    """Random [N, K] weights of the groups (e4m3 with 128x128 block scales, or bf16)."""
    count = len(range(GROUPS)[groups])
    if scheme == "fp8":
        return fp8(count, n, k), torch.rand(count, n // BLOCK, k // BLOCK, device="cuda").add(0.5)
    return torch.randn(count, n, k, device="cuda", dtype=torch.bfloat16)


def measure(tokens: int, scheme: str, package, rounds: int) -> dict:
    """One T: the three replays, timed in turn."""
    act_config, mn_major = package.tiles.ACT, package.scale_layout.mn_major
    activation = package.gated_activation.triton_gated
    quant = "group" if scheme == "fp8" else "none"
    counts = torch.bincount(
        torch.randint(0, EXPERTS, (tokens * TOPK,), device="cuda"), minlength=EXPERTS
    ).tolist() + [tokens]
    blocks = [-(-c // BLOCK) for c in counts]  # split where the row blocks are halved
    split = next(i for i in range(GROUPS) if sum(blocks[: i + 1]) * 2 >= sum(blocks))
    parts = {"whole": (slice(0, GROUPS),), "halves": (slice(0, split + 1), slice(split + 1, None))}
    w13 = {name: [weights(scheme, 2 * INTER, HIDDEN, g) for g in groups]
           for name, groups in parts.items()}  # fmt: skip
    w2 = {name: [weights(scheme, HIDDEN, INTER, g) for g in groups]
          for name, groups in parts.items()}  # fmt: skip
    halves = {name: [Half(counts[g], scheme, mn_major) for g in groups]
              for name, groups in parts.items()}  # fmt: skip

    def gemm(a, w, out, ends):
        if scheme == "fp8":
            deep_gemm.m_grouped_fp8_gemm_nt_contiguous(
                a, w, out, ends, disable_ue8m0_cast=True, use_psum_layout=True
            )
        else:
            deep_gemm.m_grouped_bf16_gemm_nt_contiguous(a, w, out, ends, use_psum_layout=True)

    def act(half):
        out = package.triton_act._act_into(
            half.h, {"row_of": half.row_of}, activation=activation, config=act_config,
            out_dtype=torch.bfloat16, quant=quant, mn_major_scales=True, pdl=False,
        )  # fmt: skip
        return out if quant == "group" else out[0]

    def serial(name):
        def run():
            for half, w in zip(halves[name], w13[name], strict=True):
                gemm(half.a, w, half.h, half.ends)
            acts = [act(half) for half in halves[name]]
            for half, w, a in zip(halves[name], w2[name], acts, strict=True):
                gemm(a, w, half.y, half.ends)

        return run

    side = torch.cuda.Stream()
    (first, second), (w13a, w13b), (w2a, w2b) = halves["halves"], w13["halves"], w2["halves"]

    def overlap():
        main = torch.cuda.current_stream()
        gemm(first.a, w13a, first.h, first.ends)
        side.wait_stream(main)
        with torch.cuda.stream(side):
            act_a = act(first)  # beside the gate/up GEMM of the second half
        gemm(second.a, w13b, second.h, second.ends)
        main.wait_stream(side)
        side.wait_stream(main)
        with torch.cuda.stream(side):
            act_b = act(second)  # beside the down GEMM of the first half
        gemm(act_a, w2a, first.y, first.ends)
        main.wait_stream(side)
        gemm(act_b, w2b, second.y, second.ends)

    replays = {"whole": graphed(serial("whole")), "halves": graphed(serial("halves")),
               "overlap": graphed(overlap)}  # fmt: skip
    samples = in_turn(replays, rounds)
    row = {
        "scheme": scheme,
        "tokens": tokens,
        "split_group": split,
        "row_blocks": [sum(blocks[: split + 1]), sum(blocks[split + 1 :])],
        **{name: round(min(ms), 4) for name, ms in samples.items()},
        "spread": {name: round(max(ms) - min(ms), 4) for name, ms in samples.items()},
    }
    row["gain_ms"] = round(row["whole"] - row["overlap"], 4)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--package", default="bench_v3_fp8_auto")
    parser.add_argument("--scheme", choices=("fp8", "bf16"), default="fp8")
    parser.add_argument("--tokens", default="2048,4096,16384")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    package = import_package(args.package)
    torch.manual_seed(0)
    results = []
    for tokens in map(int, args.tokens.split(",")):
        results.append(measure(tokens, args.scheme, package, args.rounds))
        print(json.dumps(results[-1]), flush=True)
        torch.cuda.empty_cache()
    if args.out:
        gains = statistics.median(r["gain_ms"] for r in results)
        write_rows(args.out, results, median_gain_ms=gains)


if __name__ == "__main__":
    main()
