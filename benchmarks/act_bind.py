"""What binds the fp8 activation at prefill (issue 27): its parts taken away one at a time.

Runs 98-101 left this open: the fp8_block activation (silu(gate) * up over the gate/up GEMM's
rows, quantized to e4m3 in 1x128 groups, one fp32 scale per group) moves 3.2-3.35 TB/s on the
H200 where the bf16 one, writing twice the bytes, moves 4.1-4.3, and its division is not the
cause (run 99). This times one kernel over the rows in use (T x 9: routed plus the fused shared
expert, in order) with each part switched on in turn:

  read     gate and up loaded, one fp32 sum per program stored (the read alone)
  bf16     silu(gate) * up stored in bf16 (the bf16 activation: twice the fp8 bytes)
  cast     the same cast to e4m3 with no scale (no amax, no division, no scale store)
  amax     + each group's amax and scale, stored; the values cast undivided
  full     + the division by the scale: the package's activation (div_rn, to_e4m3)
  full_2d  full, the row loaded as a [BLOCK_I / 128, 128] tile (one group per tile row), so
           that the amax reduces along the tile's own rows and no reshape is compiled

and checks that full_2d writes full's bits. Where the time jumps between two modes is what
binds it; if full_2d is faster, the package's kernel can take its form.

    cd benchmarks && python act_bind.py --tokens 4096,16384 --out $OUT/act_bind.json
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import triton
import triton.language as tl
from common import DEVICE, dump, median_ms

from moec.runtime.triton_numerics import group_scale, to_e4m3

INTER, GROUP, TOP_K = 2048, 128, 8  # DeepSeek-V3's intermediate size, 1x128 groups, top-8
MODES = ("read", "bf16", "cast", "amax", "full", "full_2d")
TILES = ((1, 2048, 4), (2, 1024, 4), (1, 1024, 4), (2, 2048, 8), (4, 512, 4), (1, 2048, 8))


@triton.jit
def _act_kernel(h_ptr, out_ptr, scale_ptr, M, N: tl.constexpr, MODE: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_I: tl.constexpr):  # fmt: skip
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_i = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)
    valid = offs_m < M
    rows = offs_m.to(tl.int64)
    h_ptrs = h_ptr + rows[:, None] * (2 * N) + offs_i[None, :]
    gate = tl.load(h_ptrs, mask=valid[:, None], other=0.0).to(tl.float32)
    up = tl.load(h_ptrs + N, mask=valid[:, None], other=0.0).to(tl.float32)
    out_ptrs = out_ptr + rows[:, None] * N + offs_i[None, :]
    if MODE == "read":
        total = tl.sum(tl.sum(gate + up, axis=1), axis=0)
        tl.store(scale_ptr + tl.program_id(0) * tl.num_programs(1) + tl.program_id(1), total)
    elif MODE == "bf16":
        tl.store(out_ptrs, (gate * tl.sigmoid(gate) * up).to(tl.bfloat16), mask=valid[:, None])
    elif MODE == "cast":
        tl.store(out_ptrs, to_e4m3(gate * tl.sigmoid(gate) * up, False), mask=valid[:, None])
    else:
        out = tl.reshape(gate * tl.sigmoid(gate) * up, (BLOCK_M, BLOCK_I // 128, 128))
        scale = group_scale(tl.max(tl.abs(out), axis=2), False)  # the packages' own numerics
        if MODE == "full":
            out = tl.math.div_rn(out, scale[:, :, None])
        q = to_e4m3(tl.reshape(out, (BLOCK_M, BLOCK_I)), False)
        tl.store(out_ptrs, q, mask=valid[:, None])
        offs_g = tl.program_id(1) * (BLOCK_I // 128) + tl.arange(0, BLOCK_I // 128)
        tl.store(scale_ptr + rows[:, None] * (N // 128) + offs_g[None, :], scale,
                 mask=valid[:, None])  # fmt: skip


@triton.jit
def _act_2d_kernel(h_ptr, out_ptr, scale_ptr, M, N: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_I: tl.constexpr):  # fmt: skip
    """full, each program BLOCK_M rows as a [BLOCK_M * BLOCK_I / 128, 128] tile of groups."""
    GROUPS: tl.constexpr = BLOCK_I // 128
    offs_t = tl.arange(0, BLOCK_M * GROUPS)  # the tile's rows: one group each
    offs_m = tl.program_id(0) * BLOCK_M + offs_t // GROUPS
    offs_g = tl.program_id(1) * GROUPS + offs_t % GROUPS
    valid = (offs_m < M)[:, None]
    rows = offs_m.to(tl.int64)
    cols = offs_g[:, None] * 128 + tl.arange(0, 128)[None, :]
    h_ptrs = h_ptr + rows[:, None] * (2 * N) + cols
    gate = tl.load(h_ptrs, mask=valid, other=0.0).to(tl.float32)
    up = tl.load(h_ptrs + N, mask=valid, other=0.0).to(tl.float32)
    out = gate * tl.sigmoid(gate) * up
    scale = group_scale(tl.max(tl.abs(out), axis=1), False)
    q = to_e4m3(tl.math.div_rn(out, scale[:, None]), False)
    tl.store(out_ptr + rows[:, None] * N + cols, q, mask=valid)
    tl.store(scale_ptr + rows * (N // 128) + offs_g, scale, mask=offs_m < M)


def run_mode(mode, h, out, scale, tile):
    """One launch of `mode` over every row of h with tile (BLOCK_M, BLOCK_I, num_warps)."""
    block_m, block_i, warps = tile
    rows = h.shape[0]
    grid = (triton.cdiv(rows, block_m), INTER // block_i)
    if mode == "full_2d":
        _act_2d_kernel[grid](h, out, scale, rows, INTER, BLOCK_M=block_m, BLOCK_I=block_i,
                             num_warps=warps)  # fmt: skip
    else:
        _act_kernel[grid](h, out, scale, rows, INTER, MODE=mode, BLOCK_M=block_m,
                          BLOCK_I=block_i, num_warps=warps)  # fmt: skip


def moved_bytes(mode: str, rows: int) -> int:
    """The bytes `mode` reads and writes over `rows` rows."""
    read = rows * 2 * INTER * 2
    written = {"read": 0, "bf16": rows * INTER * 2, "cast": rows * INTER}
    return read + written.get(mode, rows * (INTER + INTER // GROUP * 4))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", default="4096,16384")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    result = {"gpu": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu", "rows": []}
    for tokens in [int(t) for t in args.tokens.split(",")]:
        rows = tokens * (TOP_K + 1)  # the rows in use: routed plus the fused shared expert
        h = torch.randn(rows, 2 * INTER, device=DEVICE).bfloat16()
        fp8_out = torch.empty(rows, INTER, device=DEVICE, dtype=torch.float8_e4m3fn)
        bf16_out = torch.empty(rows, INTER, device=DEVICE, dtype=torch.bfloat16)
        scale = torch.empty(rows, INTER // GROUP, device=DEVICE)
        references = {}
        for tile in TILES:
            for mode in MODES:
                target = bf16_out if mode == "bf16" else fp8_out

                def call(mode=mode, h=h, target=target, scale=scale, tile=tile):
                    run_mode(mode, h, target, scale, tile)

                call()
                if mode in ("full", "full_2d"):
                    references[(mode, tile)] = (target.view(torch.uint8).clone(), scale.clone())
                us = min(median_ms(call) for _ in range(args.rounds)) * 1e3
                row = {"tokens": tokens, "mode": mode, "tile": list(tile), "us": round(us, 2),
                       "TB/s": round(moved_bytes(mode, rows) / us / 1e6, 3)}  # fmt: skip
                if mode == "full_2d":
                    bits, scales = references[("full", tile)]
                    row["bytes_differing_from_full"] = int(
                        (references[(mode, tile)][0] != bits).sum()
                    )
                    row["scales_differing"] = int((references[(mode, tile)][1] != scales).sum())
                result["rows"].append(row)
                print(row, flush=True)
        dump(Path(args.out), result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
