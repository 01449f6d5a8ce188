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

--blocks 128,256 times each case with each row block in turn: DeepGEMM's sm90 grouped kernels
take the block of its contiguous layout's M alignment (`set_mk_alignment_for_contiguous_layout`,
128 by default), and a 256-row block streams each weight tile once for twice the rows, at the cost
of more padding. --schemes fp8,bf16 times the fp8 and the bf16 kernels.

    cd benchmarks && python psum_remainder.py --tokens 4096,16384 --out $OUT/psum_remainder.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import deep_gemm
import torch

BLOCK = 128
HIDDEN, INTER, EXPERTS, TOPK = 7168, 2048, 256, 8


def layout(counts: list[int], block: int = BLOCK) -> tuple[torch.Tensor, int]:
    """Each group's end row, every group starting at a block-aligned row; the rows allocated."""
    ends, start = [], 0
    for count in counts:
        ends.append(start + count)
        start = -(-(start + count) // block) * block
    return torch.tensor(ends, dtype=torch.int32, device="cuda"), start


def uniform_counts(routed: int) -> list[int]:
    """Each routed expert's rows for `routed` uniformly random expert choices (T x top-k)."""
    choices = torch.randint(0, EXPERTS, (routed,), device="cuda")
    return torch.bincount(choices, minlength=EXPERTS).tolist()


def fp8(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16).to(torch.float8_e4m3fn)


def bf16(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16)


def weights(n: int, k: int, scheme: str = "fp8"):
    """Every group's [N, K] weight: e4m3 with its 128x128 block scales, or bf16."""
    if scheme == "bf16":
        return bf16(EXPERTS + 1, n, k)
    scale = torch.rand(EXPERTS + 1, n // BLOCK, k // BLOCK, device="cuda").add(0.5)
    return fp8(EXPERTS + 1, n, k), scale


def operands(rows: int, n: int, k: int, w, scheme: str = "fp8"):
    """The activations (e4m3, 1x128 scales MN-major as sm90 takes them; or bf16) and the output."""
    out = torch.empty(rows, n, device="cuda", dtype=torch.bfloat16)
    if scheme == "bf16":
        return bf16(rows, k), w, out
    a_scale = torch.rand(k // BLOCK, rows, device="cuda").add(0.5).t()
    return (fp8(rows, k), a_scale), w, out


def grouped_gemm(scheme: str, a, w, out, ends) -> None:
    """The layer's grouped GEMM of `scheme` in DeepGEMM's psum layout."""
    if scheme == "bf16":
        deep_gemm.m_grouped_bf16_gemm_nt_contiguous(a, w, out, ends, use_psum_layout=True)
    else:
        deep_gemm.m_grouped_fp8_gemm_nt_contiguous(
            a, w, out, ends, disable_ue8m0_cast=True, use_psum_layout=True
        )


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
    parser.add_argument("--blocks", default="128", help="row blocks (M alignments) to time")
    parser.add_argument("--schemes", default="fp8", help="fp8 and/or bf16")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--print-configs", action="store_true", help="DeepGEMM's chosen tiles")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.print_configs:  # read by DeepGEMM at each config choice, printed once per shape
        os.environ["DG_PRINT_CONFIGS"] = "1"
    torch.manual_seed(0)
    blocks = [int(b) for b in args.blocks.split(",")]
    rows_out = []
    for scheme in args.schemes.split(","):
        for tokens in map(int, args.tokens.split(",")):
            rows_out += time_cases(scheme, tokens, blocks, args)
    deep_gemm.set_mk_alignment_for_contiguous_layout(BLOCK)
    if args.out:
        write_rows(args.out, rows_out)


def time_cases(scheme: str, tokens: int, blocks: list[int], args) -> list[dict]:
    """Every layout case of one T, at every row block, timed in turn."""
    routed = tokens * TOPK
    cases = {"even": [routed // EXPERTS] * EXPERTS, "random": uniform_counts(routed)}
    for tail in filter(None, args.tails.split(",")):
        cases[f"tail+{tail}"] = [routed // EXPERTS + int(tail)] * EXPERTS
    shapes = {"gate_up": (2 * INTER, HIDDEN), "down": (HIDDEN, INTER)}
    ws = {gemm: weights(n, k, scheme) for gemm, (n, k) in shapes.items()}
    built = {}
    for name, counts in cases.items():
        counts = counts + [tokens]  # the shared expert, fused as the last group
        for block in blocks:
            ends, rows = layout(counts, block)
            n_blocks = sum(-(-c // block) for c in counts)
            gemms = {
                gemm: operands(rows, n, k, ws[gemm], scheme) for gemm, (n, k) in shapes.items()
            }
            built[name, block] = (ends, rows, n_blocks, gemms)
    times = {key: {"gate_up": [], "down": []} for key in built}
    failed = {}
    for _ in range(args.rounds):
        for key, (ends, _, _, gemms) in built.items():
            if key in failed:
                continue
            deep_gemm.set_mk_alignment_for_contiguous_layout(key[1])
            for gemm, (a, w, out) in gemms.items():

                def call(a=a, w=w, out=out, ends=ends):
                    grouped_gemm(scheme, a, w, out, ends)

                try:
                    times[key][gemm].append(timed(call))
                except Exception as error:  # a row block DeepGEMM does not take
                    failed[key] = f"{type(error).__name__}: {str(error)[:300]}"
                    break
    rows_out = []
    for (name, block), (_, rows, n_blocks, gemms) in built.items():
        row = dict(
            scheme=scheme,
            tokens=tokens,
            layout=name,
            block_m=block,
            useful_rows=sum(cases[name]) + tokens,
            allocated_rows=rows,
            row_blocks=n_blocks,
        )
        if (name, block) in failed:
            row["error"] = failed[name, block]
        else:
            row["gate_up_ms"] = round(min(times[name, block]["gate_up"]), 4)
            row["down_ms"] = round(min(times[name, block]["down"]), 4)
            row["both_ms"] = round(row["gate_up_ms"] + row["down_ms"], 4)
            if block != BLOCK:
                deep_gemm.set_mk_alignment_for_contiguous_layout(block)
                row["check_vs_128"] = agreement(scheme, cases[name] + [tokens], block, gemms)
        rows_out.append(row)
        print(json.dumps(row), flush=True)
    del built, ws
    torch.cuda.empty_cache()
    return rows_out


def agreement(scheme, counts, block, gemms) -> float:
    """Max |out - out at 128| / max |out at 128| of the down GEMM over the useful rows: the
    same products at another row block must agree (to bf16 output rounding)."""
    ends, _ = layout(counts, block)
    a, w, out = gemms["down"]
    grouped_gemm(scheme, a, w, out, ends)
    got = useful(out, counts, block)
    deep_gemm.set_mk_alignment_for_contiguous_layout(BLOCK)
    ends_ref, rows_ref = layout(counts, BLOCK)
    a_ref = regroup(a, counts, block, BLOCK, rows_ref)
    out_ref = torch.empty(rows_ref, out.shape[1], device="cuda", dtype=torch.bfloat16)
    grouped_gemm(scheme, a_ref, w, out_ref, ends_ref)
    want = useful(out_ref, counts, BLOCK)
    return float((got.float() - want.float()).abs().max() / want.float().abs().max())


def starts(counts, block):
    out, start = [], 0
    for count in counts:
        out.append(start)
        start = -(-(start + count) // block) * block
    return out


def useful(out, counts, block):
    return torch.cat([out[s : s + c] for s, c in zip(starts(counts, block), counts, strict=True)])


def regroup(a, counts, block, new_block, rows):
    """The same useful rows (and their scales) laid out at another alignment."""
    if isinstance(a, tuple):
        data, scale = a
        new_data = torch.zeros(rows, data.shape[1], device="cuda", dtype=data.dtype)
        new_scale = torch.ones(scale.shape[1], rows, device="cuda").t()
        for s, t, c in zip(starts(counts, block), starts(counts, new_block), counts, strict=True):
            new_data[t : t + c] = data[s : s + c]
            new_scale[t : t + c] = scale[s : s + c]
        return new_data, new_scale
    new = torch.zeros(rows, a.shape[1], device="cuda", dtype=a.dtype)
    for s, t, c in zip(starts(counts, block), starts(counts, new_block), counts, strict=True):
        new[t : t + c] = a[s : s + c]
    return new


if __name__ == "__main__":
    main()
