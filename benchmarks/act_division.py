"""The fp8 activation's division by its group scale: what it costs at prefill (issue 27).

Run 98 found the fp8_block activation (silu(gate) * up, quantized to e4m3 with 1x128 scales)
moving 3.2-3.35 TB/s where the bf16 one, writing twice the bytes, moves 4.1-4.3: the fp8 kernel
is bound by its arithmetic, and of that the correctly rounded division of every element by its
group's scale (div.rn.f32, a dozen instructions and a range check) is the largest part. This
times the same activation over the rows in use with the division done four ways, and checks
which of them give div_rn's bits:

  div_rn      q = div_rn(x, s), as the package's kernel
  markstein   y = div_rn(1, s) once per group; q = x * y; q = q + (x - q * s) * y by fma,
              twice: Markstein's correction of a faithful quotient with a correctly rounded
              reciprocal gives the correctly rounded quotient
  recip       q = x * y alone (not correctly rounded: the bound of what any exact form saves)
  none        q = x (no division: the rest of the kernel's cost)

and a check over many (x, s) pairs, extremes included, of markstein's quotient bits against
div_rn's before the e4m3 cast.

    cd benchmarks && python act_division.py --tokens 4096,16384 --out $OUT/act_division.json
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
MODES = ("div_rn", "markstein", "recip", "none")


@triton.jit
def _divide(x, s, MODE: tl.constexpr):
    """x / s for x [R, G, GROUP] and s [R, G] (each group's scale), by MODE."""
    s = s[:, :, None]
    if MODE == "div_rn":
        return tl.math.div_rn(x, s)
    elif MODE == "none":
        return x
    y = tl.math.div_rn(tl.full(s.shape, 1.0, tl.float32), s)
    q = x * y
    if MODE == "markstein":
        corrected = q
        for _ in tl.static_range(2):
            corrected = tl.math.fma(tl.math.fma(-corrected, s, x), y, corrected)
        q = tl.where(y == 0.0, q, corrected)  # an infinite scale: x * 0, as div_rn
    return q


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
    out = gate * tl.sigmoid(gate) * up
    out = tl.reshape(out, (BLOCK_M, BLOCK_I // 128, 128))
    scale = group_scale(tl.max(tl.abs(out), axis=2), False)  # the packages' own numerics
    q = to_e4m3(tl.reshape(_divide(out, scale, MODE), (BLOCK_M, BLOCK_I)), False)
    tl.store(out_ptr + rows[:, None] * N + offs_i[None, :], q, mask=valid[:, None])
    offs_g = tl.program_id(1) * (BLOCK_I // 128) + tl.arange(0, BLOCK_I // 128)
    tl.store(scale_ptr + rows[:, None] * (N // 128) + offs_g[None, :], scale, mask=valid[:, None])


@triton.jit
def _quotient_kernel(x_ptr, s_ptr, out_ptr, MODE: tl.constexpr, BLOCK: tl.constexpr):
    """q = x / s by MODE for groups of 128 values sharing one s: the fp32 bits, no cast."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.reshape(tl.load(x_ptr + offs), (BLOCK // 128, 1, 128))
    s = tl.reshape(tl.load(s_ptr + tl.program_id(0) * (BLOCK // 128) + tl.arange(0, BLOCK // 128)),
                   (BLOCK // 128, 1))  # fmt: skip
    tl.store(out_ptr + offs, tl.reshape(_divide(x, s, MODE), (BLOCK,)))


def quotient_check(pairs: int) -> dict:
    """markstein's and recip's quotients against div_rn's, bit for bit, on `pairs` values: x
    of every magnitude e4m3 quantization sees (|x| <= 448 s) and s from 1e-10 / 448 up."""
    block, groups = 4096, pairs // 128
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    s = torch.exp2(torch.empty(groups, device=DEVICE).uniform_(-42, 40, generator=gen))
    s = torch.where(torch.arange(groups, device=DEVICE) % 7 == 0, s.round().clamp(min=1), s)
    frac = torch.empty(groups, 128, device=DEVICE).uniform_(-1, 1, generator=gen)
    frac = frac * torch.exp2(-torch.empty_like(frac).uniform_(0, 40, generator=gen))
    x = (frac * 448.0 * s[:, None]).flatten().contiguous()
    out = {}
    for mode in MODES:
        q = torch.empty_like(x)
        _quotient_kernel[(x.numel() // block,)](x, s, q, MODE=mode, BLOCK=block)
        out[mode] = q
    ref = out["div_rn"].view(torch.int32)
    return {
        mode: int((out[mode].view(torch.int32) != ref).sum()) for mode in ("markstein", "recip")
    } | {"pairs": x.numel()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", default="4096,16384")
    parser.add_argument("--pairs", type=int, default=1 << 27)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    result = {"quotients_differing_from_div_rn": quotient_check(args.pairs), "rows": []}
    print(result["quotients_differing_from_div_rn"], flush=True)
    for tokens in [int(t) for t in args.tokens.split(",")]:
        rows = tokens * (TOP_K + 1)  # the rows in use: routed plus the fused shared expert
        h = torch.randn(rows, 2 * INTER, device=DEVICE).bfloat16()
        reference = None  # div_rn's output at the first tile: every other run is held to it
        for mode in MODES:
            for block_m, block_i, warps in ((1, 2048, 4), (2, 1024, 4), (1, 1024, 4), (2, 2048, 8)):
                out = torch.empty(rows, INTER, device=DEVICE, dtype=torch.float8_e4m3fn)
                scale = torch.empty(rows, INTER // GROUP, device=DEVICE)
                grid = (triton.cdiv(rows, block_m), INTER // block_i)

                def call(h=h, rows=rows, out=out, scale=scale, grid=grid, mode=mode, bm=block_m,
                         bi=block_i, w=warps):  # fmt: skip
                    _act_kernel[grid](h, out, scale, rows, INTER, MODE=mode, BLOCK_M=bm,
                                      BLOCK_I=bi, num_warps=w)  # fmt: skip

                call()
                us = min(median_ms(call) for _ in range(3)) * 1e3
                bits = out.view(torch.uint8)
                reference = bits.clone() if reference is None else reference
                moved = rows * (2 * INTER * 2 + INTER + INTER // GROUP * 4)
                row = {"tokens": tokens, "mode": mode, "tile": [block_m, block_i, warps],
                       "us": round(us, 2), "TB/s": round(moved / us / 1e6, 3),
                       "bytes_differing_from_div_rn": int((bits != reference).sum())}  # fmt: skip
                result["rows"].append(row)
                print(row, flush=True)
        dump(Path(args.out), result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
