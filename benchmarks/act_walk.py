"""The activation stage at prefill: which order its programs walk the rows in (issue 27).

Above 1024 tokens the layer runs DeepGEMM's grouped GEMMs on the contiguous layout, and the
activation between them (silu(gate) * up, quantized to e4m3 with 1x128 scales for fp8_block)
reads the gate/up GEMM's [M, 2I] output. Its programs walk the *assignments* (row_of, token by
token), so neighbouring programs read rows of different experts, far apart in memory; at
T=16384 the kernel moves about 2.7 TB/s of useful bytes, against the H200's ~4.3 copy rate
(RESULTS.md, runs 87-88). The other walk goes down the layout's rows in order and skips those
whose token_of_row is -1 (each expert's padding and the unused tail): more programs, read in
order. This times both walks over a grid of tiles, on the layout the package's own dispatch
makes from uniform random top-8 choices plus the fused shared expert, and checks that they write
the same bits into every row in use.

    cd benchmarks && python act_walk.py --package bench_v3_fp8_auto --tokens 4096,16384 \
        --out $OUT/act_walk_fp8.json
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import torch
from common import DEVICE, dump, import_package, median_ms, per_call_us

TILES = [
    {"BLOCK_M": m, "BLOCK_I": i, "num_warps": w}
    for m, i, w in itertools.product((1, 2, 4), (512, 1024, 2048), (4, 8))
]


def layout(package, tokens: int):
    """The package's contiguous layout of `tokens` random tokens, and a gate/up output on it."""
    stages = sys.modules[f"{package.__name__}.stages"]
    experts, top_k = 256, 8
    x = torch.randn(tokens, 7168, device=DEVICE).bfloat16()
    ids = torch.rand(tokens, experts, device=DEVICE).topk(top_k, dim=1).indices.int()
    ids = torch.cat([ids, torch.full_like(ids[:, :1], experts)], dim=1)  # the fused shared
    routing = stages.dispatch_deep_gemm(x, ids)[-1]  # (a, a_scale, routing) or (a, routing)
    h = torch.randn(routing.token_of_row.numel(), 2 * 2048, device=DEVICE).bfloat16()
    return h, routing


def in_layout_order(routing):
    """The routing with row_of replaced by every row of the layout in turn (-1 where
    token_of_row is -1): the kernel's assignment walk then goes down the layout's rows. Each
    program loads one int32 and its row, as for row_of (run 98 timed this walk as a mode of
    the kernel that read token_of_row itself: the same loads)."""
    rows = torch.arange(routing.token_of_row.numel(), device=DEVICE, dtype=torch.int32)
    return routing._replace(row_of=torch.where(routing.token_of_row >= 0, rows, -1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--package", default="bench_v3_fp8_auto")
    parser.add_argument("--tokens", default="4096,16384")
    parser.add_argument("--tiles", type=int, default=len(TILES), help="the first N tiles only")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    package = import_package(args.package)
    act = sys.modules[f"{package.__name__}.triton_act"]
    gated = sys.modules[f"{package.__name__}.gated_activation"].triton_gated
    fp8 = package.PLAN["choices"]["dims"]["routed"]["scheme"] != "bf16"
    quant = {"quant": "group", "group_size": 128, "mn_major_scales": True} if fp8 else {}
    rows = []
    for tokens in (int(t) for t in args.tokens.split(",")):
        torch.manual_seed(tokens)
        h, routing = layout(package, tokens)
        used = routing.token_of_row >= 0
        width = h.shape[1] // 2
        useful = int(used.sum()) * (
            2 * width * 2 + width * (1 if fp8 else 2) + (width // 128) * 4 * fp8
        )
        walks = {"assignments": routing, "layout_rows": in_layout_order(routing)}
        results = {}
        for tile, (walk, walked) in itertools.product(TILES[: args.tiles], walks.items()):

            def call(tile=tile, h=h, walked=walked):
                return act.act_quant_contiguous(
                    h, walked, activation=gated, config=tile, out_dtype=torch.bfloat16, **quant
                )

            out, scale = call()
            results[(walk, tuple(tile.values()))] = (
                out[used],
                None if scale is None else scale[used],
            )
            us = per_call_us(call) if DEVICE == "cuda" else median_ms(call, 1, 2) * 1e3
            rows.append(
                {
                    "tokens": tokens,
                    "walk": walk,
                    **tile,
                    "us": round(us, 2),
                    "useful_TBps": round(useful / us / 1e6, 3),
                }
            )
        first = next(iter(results.values()))
        same = all(
            torch.equal(
                o.view(torch.uint8) if fp8 else o, first[0].view(torch.uint8) if fp8 else first[0]
            )
            and (s is None or torch.equal(s, first[1]))
            for o, s in results.values()
        )
        for walk in walks:
            best = min(
                (r for r in rows if r["tokens"] == tokens and r["walk"] == walk),
                key=lambda r: r["us"],
            )
            print(
                f"T={tokens} {walk:12s} best {best['us']:8.1f} us {best['useful_TBps']:.2f} TB/s "
                f"tile {best['BLOCK_M']},{best['BLOCK_I']},{best['num_warps']}",
                flush=True,
            )
        print(f"T={tokens} same bits in every row in use: {same}", flush=True)
        rows.append(
            {
                "tokens": tokens,
                "same_bits": same,
                "rows_in_use": int(used.sum()),
                "layout_rows": used.numel(),
            }
        )
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    dump(Path(args.out), {"gpu": gpu, "package": args.package, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
