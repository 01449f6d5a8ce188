"""How fast can a swap-AB tile stream one token's expert weights? A stripped copy of the decode
GEMM's K loop (no routing, no gathered rows), timed over DeepSeek-V3's nine experts of one
token, to tell which part of the fp8 kernel keeps it below the bf16 kernel's bandwidth:

    bf16        acc = dot(w, a, acc)                        (the bf16 kernel's loop)
    fp8         acc = dot(w, a, acc), fp8 operands          (no scales)
    fp8_scaled  acc += dot(w, a) * (a_s * w_s)              (the fp8_block kernel's loop: a
                                                             token scale and a weight scale
                                                             loaded per step)

each with BLOCK_K 128 (one 128-byte fp8 segment of every weight row per step) or 256. Times
are per call (ten calls in one CUDA graph); TB/s counts the weight bytes.

    python benchmarks/decode_stream.py --out $OUT/stream.json
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

import torch
import triton
import triton.language as tl
from common import dump, per_call_us

SHAPES = {"gate_up": (9, 4096, 7168), "down": (9, 7168, 2048)}  # experts, N, K
TOKENS = 16  # the MMA's N: one token padded to the smallest tile


@triton.jit
def _stream_kernel(
    w_ptr,  # [E, N, K]
    a_ptr,  # [K, TOKENS]
    a_scale_ptr,  # [K / 128, TOKENS] fp32
    w_scale_ptr,  # [E, K / 128] fp32
    out_ptr,  # [E, N, TOKENS] fp32
    N,
    K,
    MODE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    TOKENS: tl.constexpr,
):
    tiles_n = tl.cdiv(N, BLOCK_N)
    expert = tl.program_id(0) // tiles_n
    offs_n = (tl.program_id(0) % tiles_n) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    offs_t = tl.arange(0, TOKENS)
    w_rows = w_ptr + expert.to(tl.int64) * N * K + offs_n[:, None].to(tl.int64) * K
    acc = tl.zeros((BLOCK_N, TOKENS), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        w = tl.load(w_rows + (k0 + offs_k)[None, :])
        a = tl.load(a_ptr + (k0 + offs_k)[:, None] * TOKENS + offs_t[None, :])
        if MODE == "fp8_scaled":
            a_s = tl.load(a_scale_ptr + (k0 // 128) * TOKENS + offs_t)
            w_s = tl.load(w_scale_ptr + expert * (K // 128) + k0 // 128)
            acc += tl.dot(w, a, max_num_imprecise_acc=BLOCK_K) * (a_s * w_s)[None, :]
        else:
            acc = tl.dot(w, a, acc)
    out = out_ptr + expert.to(tl.int64) * N * TOKENS + offs_n[:, None] * TOKENS + offs_t[None, :]
    tl.store(out, acc)


def timed(mode: str, shape, block_n: int, block_k: int, stages: int) -> dict:
    experts, n, k = shape
    dtype = torch.bfloat16 if mode == "bf16" else torch.float8_e4m3fn
    w = torch.randn(experts, n, k, device="cuda").to(dtype)
    a = torch.randn(k, TOKENS, device="cuda").to(dtype)
    a_scale = torch.rand(k // 128, TOKENS, device="cuda")
    w_scale = torch.rand(experts, k // 128, device="cuda")
    out = torch.empty(experts, n, TOKENS, device="cuda")
    grid = (experts * triton.cdiv(n, block_n),)

    def call():
        _stream_kernel[grid](
            w, a, a_scale, w_scale, out, n, k, MODE=mode, BLOCK_N=block_n, BLOCK_K=block_k,
            TOKENS=TOKENS, num_warps=4, num_stages=stages,
        )  # fmt: skip

    us = per_call_us(call)
    return {"us": round(us, 2), "TB/s": round(w.numel() * w.element_size() / us / 1e6, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    rows = []
    grid = (SHAPES, ("bf16", "fp8", "fp8_scaled"), (64, 128), (128, 256), (3, 4, 6))
    for gemm, mode, block_n, block_k, stages in itertools.product(*grid):
        row = {"gemm": gemm, "mode": mode, "BLOCK_N": block_n, "BLOCK_K": block_k}
        row["num_stages"] = stages
        try:
            row.update(timed(mode, SHAPES[gemm], block_n, block_k, stages))
        except Exception as error:  # a tile that does not fit: a row
            row["error"] = repr(error)[:120]
        rows.append(row)
        print(row, flush=True)
    dump(Path(args.out), {"device": torch.cuda.get_device_name(), "rows": rows})


if __name__ == "__main__":
    main()
