"""torch's own grouped bf16 GEMM (`torch._grouped_mm`, CUTLASS on sm90) beside DeepGEMM's psum
layout on the layer's two GEMMs (issue 27: a grouped GEMM faster than DeepGEMM's own).

`torch._grouped_mm` takes each group's end row (`offs`) with the groups packed back to back, so
no expert starts at a 128-aligned row: its tiles are not DeepGEMM's, and neither is the padding.
DeepSeek-V3 shapes (gate/up N=4096 K=7168, down N=7168 K=2048), 256 routed experts with the
counts of T*8 uniformly random expert choices plus the shared expert fused as group 257 with T
rows, the same bf16 rows and weights for both; 3 rounds in turn, best of 20-launch medians. The
check is the useful rows' max |difference| / max |DeepGEMM|.

    cd benchmarks && python grouped_mm_probe.py --tokens 2048,4096,16384 --out $OUT/grouped_mm.json
"""

from __future__ import annotations

import argparse
import json

import deep_gemm
import torch
from psum_remainder import (
    EXPERTS,
    HIDDEN,
    INTER,
    TOPK,
    bf16,
    layout,
    timed,
    uniform_counts,
    write_rows,
)


def packed_rows(a_psum: torch.Tensor, counts: list[int], ends: torch.Tensor) -> torch.Tensor:
    """The psum layout's useful rows, packed back to back (each group's rows in order)."""
    starts = (ends - torch.tensor(counts, device=ends.device, dtype=ends.dtype)).tolist()
    return torch.cat([a_psum[s : s + c] for s, c in zip(starts, counts, strict=True)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", default="2048,4096,16384")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.manual_seed(0)
    shapes = {"gate_up": (2 * INTER, HIDDEN), "down": (HIDDEN, INTER)}
    rows_out = []
    for tokens in map(int, args.tokens.split(",")):
        counts = uniform_counts(tokens * TOPK) + [tokens]
        ends, allocated = layout(counts)
        offs = torch.tensor(counts, device="cuda").cumsum(0).to(torch.int32)
        for gemm, (n, k) in shapes.items():
            w = bf16(EXPERTS + 1, n, k)
            a_psum = bf16(allocated, k)
            a_packed = packed_rows(a_psum, counts, ends)
            out_psum = torch.empty(allocated, n, device="cuda", dtype=torch.bfloat16)

            def deep(a=a_psum, w=w, out=out_psum, ends=ends):
                deep_gemm.m_grouped_bf16_gemm_nt_contiguous(a, w, out, ends, use_psum_layout=True)

            def cutlass(a=a_packed, w=w, offs=offs):
                return torch._grouped_mm(a, w.transpose(1, 2), offs=offs)

            deep()
            ref = packed_rows(out_psum, counts, ends).float()
            check = (cutlass().float() - ref).abs().max().item() / ref.abs().max().item()
            times = {"deep_gemm_psum": [], "torch_grouped_mm": []}
            for _ in range(args.rounds):
                times["deep_gemm_psum"].append(timed(deep))
                times["torch_grouped_mm"].append(timed(cutlass))
            row = dict(
                tokens=tokens,
                gemm=gemm,
                useful_rows=sum(counts),
                **{name: round(min(t), 4) for name, t in times.items()},
                check=check,
            )
            rows_out.append(row)
            print(json.dumps(row), flush=True)
            del w, a_psum, a_packed, out_psum
            torch.cuda.empty_cache()
    if args.out:
        write_rows(args.out, rows_out)


if __name__ == "__main__":
    main()
