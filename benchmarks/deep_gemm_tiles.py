"""Which N tile DeepGEMM's grouped GEMMs should take at prefill (issue 27).

DeepGEMM picks its tile (block_n, TMA multicast) by a cost model of L1/L2 traffic that leaves
HBM out; at T=2048-16384 the layer's GEMMs read every expert's weights (about 11 GB for
DeepSeek-V3) at about 140 rows per expert, so the weight traffic is what sets their time, and
the tile the model picks may not be the fastest. `deep_gemm.set_block_size_multiple_of((1, n))`
leaves n (and its multiples up to the kernel's limit) as the only block_n candidates, so each
tile can be timed in turn on the layer's own shapes: DeepSeek-V3's gate/up (N=4096, K=7168) and
down (N=7168, K=2048), 256 routed experts with random counts plus the shared expert fused as
group 257, the psum layout, as the plan runs them. DG_PRINT_CONFIGS=1 prints each choice.

    cd benchmarks && DG_PRINT_CONFIGS=1 python deep_gemm_tiles.py --tokens 4096,16384 \
        --out $OUT/deep_gemm_tiles.json
"""

from __future__ import annotations

import argparse
import json
import time

import deep_gemm
import torch
from psum_remainder import (
    EXPERTS,
    HIDDEN,
    INTER,
    TOPK,
    layout,
    operands,
    timed,
    weights,
    write_rows,
)

SHAPES = {"gate_up": (2 * INTER, HIDDEN), "down": (HIDDEN, INTER)}
FP8_TILES = (0, 96, 112, 128, 144, 160, 192)  # 0: DeepGEMM's own choice
BF16_TILES = (0, 128, 160, 192, 224, 256)


def call(dtype: str, a, w, out, ends):
    if dtype == "fp8":
        return lambda: deep_gemm.m_grouped_fp8_gemm_nt_contiguous(
            a, w, out, ends, disable_ue8m0_cast=True, use_psum_layout=True
        )
    return lambda: deep_gemm.m_grouped_bf16_gemm_nt_contiguous(
        a, w, out, ends, use_psum_layout=True
    )


def bf16_operands(rows: int, n: int, k: int):
    a = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(EXPERTS + 1, n, k, device="cuda", dtype=torch.bfloat16)
    return a, w, torch.empty(rows, n, device="cuda", dtype=torch.bfloat16)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", default="2048,4096,8192,16384")
    parser.add_argument("--dtypes", default="fp8,bf16")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=400, help="stop starting new tiles after")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.manual_seed(0)
    start = time.time()
    rows_out = []
    for dtype in args.dtypes.split(","):
        tiles = FP8_TILES if dtype == "fp8" else BF16_TILES
        for gemm, (n, k) in SHAPES.items():
            w = weights(n, k) if dtype == "fp8" else None
            for tokens in map(int, args.tokens.split(",")):
                routed = tokens * TOPK
                counts = torch.bincount(
                    torch.randint(0, EXPERTS, (routed,), device="cuda"), minlength=EXPERTS
                ).tolist() + [tokens]
                ends, rows = layout(counts)
                if dtype == "fp8":
                    a, w_, out = operands(rows, n, k, w)
                else:
                    a, w_, out = bf16_operands(rows, n, k)
                for tile in tiles:
                    if time.time() - start > args.seconds:
                        break
                    deep_gemm.set_block_size_multiple_of((1, tile or 1))
                    fn = call(dtype, a, w_, out, ends)
                    try:
                        fn()
                        torch.cuda.synchronize()
                    except Exception as error:  # an illegal tile for this shape: say so, go on
                        print(
                            json.dumps(
                                dict(
                                    dtype=dtype,
                                    gemm=gemm,
                                    tokens=tokens,
                                    tile=tile,
                                    error=str(error)[:200],
                                )
                            ),
                            flush=True,
                        )
                        continue
                    ms = min(timed(fn) for _ in range(args.rounds))
                    row = dict(dtype=dtype, gemm=gemm, tokens=tokens, tile=tile, ms=round(ms, 4))
                    rows_out.append(row)
                    print(json.dumps(row), flush=True)
                deep_gemm.set_block_size_multiple_of((1, 1))
                del a, w_, out
            del w
            torch.cuda.empty_cache()
    if args.out:
        write_rows(args.out, rows_out)


if __name__ == "__main__":
    main()
