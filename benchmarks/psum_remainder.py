"""What each expert's partial last 128-row block costs DeepGEMM's grouped fp8 GEMMs on sm90
(issue 27's lead for a grouped GEMM of moec's own).

With `use_psum_layout=True` DeepGEMM starts every expert at a 128-aligned row and, on sm90,
streams each row block's weight tile whole and computes its rows 64 at a time (a math warpgroup
whose 64 rows are all padding skips its MMAs; only its sm100 kernels trim a block's MMA to 16-row
steps). So the same routed rows cost more when the experts' counts are not multiples of 128.
This times the layer's two GEMMs (DeepSeek-V3: gate/up N=4096 K=7168, down N=7168 K=2048; 256
routed experts plus the shared one fused as group 257 with T rows) on the same number of rows
laid out as
  even    T*8/256 rows per expert (no partial block at T=4096 and 16384),
  random  the counts of T*8 uniformly random expert choices (a partial block per expert),
in turn, 3 rounds, CUDA-event medians. If the time follows the row blocks, not the rows, a GEMM
that finishes a partial block with a smaller tile gains up to the difference.

--tails 1,32,64,65,128 adds, per T, cases *tail+N*: T*8/256 + N rows for every routed expert, so
each expert has one partial block of N rows (N = 128: two whole blocks). What one such block
costs beside a whole one says what binds it: DeepGEMM's sm90 kernel already skips the MMAs of a
math warpgroup whose 64 rows are all padding, so if a block of 1 row costs what one of 64 rows
costs, and that is near a whole block's cost, the tail is bound by streaming the expert's weight
tile through the SM, not by its MMAs, and trimming the MMA further cannot pay.

    cd benchmarks && python psum_remainder.py --tokens 4096,16384 --out $OUT/psum_remainder.json
"""

from __future__ import annotations

import argparse
import json
import statistics

import deep_gemm
import torch

BLOCK = 128
HIDDEN, INTER, EXPERTS, TOPK = 7168, 2048, 256, 8


def layout(counts: list[int]) -> tuple[torch.Tensor, int]:
    """Each group's end row, every group starting at a 128-aligned row; the rows allocated."""
    ends, start = [], 0
    for count in counts:
        ends.append(start + count)
        start = -(-(start + count) // BLOCK) * BLOCK
    return torch.tensor(ends, dtype=torch.int32, device="cuda"), start


def uniform_counts(routed: int) -> list[int]:
    """Each routed expert's rows for `routed` uniformly random expert choices (T x top-k)."""
    choices = torch.randint(0, EXPERTS, (routed,), device="cuda")
    return torch.bincount(choices, minlength=EXPERTS).tolist()


def fp8(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16).to(torch.float8_e4m3fn)


def weights(n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every group's [N, K] e4m3 weight and its 128x128 block scales."""
    scale = torch.rand(EXPERTS + 1, n // BLOCK, k // BLOCK, device="cuda").add(0.5)
    return fp8(EXPERTS + 1, n, k), scale


def operands(rows: int, n: int, k: int, w):
    """The activations (e4m3, 1x128 scales MN-major as sm90 takes them) and the output."""
    a_scale = torch.rand(k // BLOCK, rows, device="cuda").add(0.5).t()
    out = torch.empty(rows, n, device="cuda", dtype=torch.bfloat16)
    return (fp8(rows, k), a_scale), w, out


def write_rows(path: str, rows: list[dict], **more) -> None:
    """The run's rows as JSON, with the GPU's name (and any other fields given)."""
    with open(path, "w") as handle:
        json.dump({"gpu": torch.cuda.get_device_name(), "rows": rows, **more}, handle, indent=2)


def timed(fn, repeats: int = 20) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", default="4096,16384")
    parser.add_argument("--tails", default="", help="tail sizes N for the tail+N cases")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.manual_seed(0)
    rows_out = []
    for tokens in map(int, args.tokens.split(",")):
        routed = tokens * TOPK
        random_counts = uniform_counts(routed)
        cases = {"even": [routed // EXPERTS] * EXPERTS, "random": random_counts}
        for tail in filter(None, args.tails.split(",")):
            cases[f"tail+{tail}"] = [routed // EXPERTS + int(tail)] * EXPERTS
        shapes = {"gate_up": (2 * INTER, HIDDEN), "down": (HIDDEN, INTER)}
        ws = {gemm: weights(n, k) for gemm, (n, k) in shapes.items()}
        built = {}
        for name, counts in cases.items():
            counts = counts + [tokens]  # the shared expert, fused as the last group
            ends, rows = layout(counts)
            blocks = sum(-(-c // BLOCK) for c in counts)
            gemms = {gemm: operands(rows, n, k, ws[gemm]) for gemm, (n, k) in shapes.items()}
            built[name] = (ends, rows, blocks, gemms)
        times = {name: {"gate_up": [], "down": []} for name in cases}
        for _ in range(args.rounds):
            for name, (ends, _, _, gemms) in built.items():
                for gemm, (a, w, out) in gemms.items():

                    def call(a=a, w=w, out=out, ends=ends):
                        deep_gemm.m_grouped_fp8_gemm_nt_contiguous(
                            a, w, out, ends, disable_ue8m0_cast=True, use_psum_layout=True
                        )

                    times[name][gemm].append(timed(call))
        for name, (_, rows, blocks, _) in built.items():
            row = dict(
                tokens=tokens,
                layout=name,
                useful_rows=sum(cases[name]) + tokens,
                allocated_rows=rows,
                row_blocks=blocks,
                gate_up_ms=round(min(times[name]["gate_up"]), 4),
                down_ms=round(min(times[name]["down"]), 4),
            )
            row["both_ms"] = round(row["gate_up_ms"] + row["down_ms"], 4)
            rows_out.append(row)
            print(json.dumps(row), flush=True)
        del built, ws
        torch.cuda.empty_cache()
    if args.out:
        write_rows(args.out, rows_out)


if __name__ == "__main__":
    main()
