"""Experiment: does fetching the fused shared expert's weights into L2 before the router shorten a
decode step? The shared expert is every token's, so its weights are known before routing; the
router, select and dispatch kernels (about 15 us at T=1) leave the memory bus mostly idle.

A prefetch kernel issues PTX L2 prefetches over the shared expert's slice of w13 (and w2) and
exits: per 128-byte line (`prefetch.global.L2`, evict_last or normal) or Hopper's bulk
`cp.async.bulk.prefetch.L2` in 4 KiB chunks. It runs before the forward on the same stream
("before"), or beside it on a second stream joined before the gate/up GEMM ("gemm") or at the
end ("end"). Each variant is one CUDA graph, replayed and timed as bench_moe.py times a layer.
Result (benchmarks/RESULTS.md, runs 27-30): every variant is slower than no prefetch. Runs 29-30
also tried the grouped GEMM prefetching before its PDL wait (commit 37bf699, `--experiment
gemm`): at most 1-3 us at T=1, within the run-to-run spread, and slower at T >= 2; removed.

    python benchmarks/prefetch_decode.py --out $OUT/prefetch.json
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path

import torch
import triton
import triton.language as tl
from common import dump, graphed, import_package, median_ms, route

SIDE = None  # the second stream, made in main
LINE_ASM = {
    "line_last": "prefetch.global.L2::evict_last [$1]; mov.u32 $0, 0;",
    "line_normal": "prefetch.global.L2 [$1]; mov.u32 $0, 0;",
    "bulk": "cp.async.bulk.prefetch.L2.global [$1], 4096; mov.u32 $0, 0;",
}
CHUNK = {"line_last": 128, "line_normal": 128, "bulk": 4096}


@triton.jit
def _prefetch_kernel(base_ptr, chunks, CHUNK: tl.constexpr, ASM: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    offs = tl.minimum(offs, chunks - 1)  # inline asm takes no mask: repeat the last chunk
    tl.inline_asm_elementwise(
        ASM, "=r,l", [base_ptr + offs.to(tl.int64) * CHUNK], dtype=tl.int32, is_pure=False, pack=1
    )


def prefetcher(kind: str, tensors: list[torch.Tensor]):
    """A function issuing L2 prefetches over each (contiguous) tensor."""
    views = [t.contiguous().view(torch.uint8).reshape(-1) for t in tensors]

    def run():
        for view in views:
            chunks = view.numel() // CHUNK[kind]
            _prefetch_kernel[(triton.cdiv(chunks, 1024),)](
                view, chunks, CHUNK=CHUNK[kind], ASM=LINE_ASM[kind], BLOCK=1024, num_warps=4
            )

    return run


def forward(package, layer, x, prefetch, join: str):
    """The layer's forward (layer.py), with `prefetch` on a second stream from its start, joined
    before the gate/up GEMM ("gemm") or at the end ("end"), or on this stream before it ("before");
    prefetch None: the plain forward."""
    if prefetch is None:
        return layer(x)
    if join == "before":
        prefetch()
        return layer(x)
    stages = sys.modules[f"{package.__name__}.stages"]
    main_stream = torch.cuda.current_stream()
    SIDE.wait_stream(main_stream)
    with torch.cuda.stream(SIDE):
        prefetch()
    topk_weights, topk_ids = route(package, layer, x)
    a, a_scale, routing = stages.dispatch(x, topk_ids)
    if join == "gemm":
        main_stream.wait_stream(SIDE)
    h = stages.gemm_gate_up(a, a_scale, routing, layer.w13, layer.w13_scale)
    hq, hq_scale = stages.activation(h, routing)
    y = stages.gemm_down(hq, hq_scale, routing, layer.w2, layer.w2_scale)
    out = stages.combine(y, topk_weights, routing)
    if join == "end":
        main_stream.wait_stream(SIDE)
    return out


def timed_row(replay, run, reference, **fields) -> dict:
    best = min(median_ms(replay, warmup=5, repeats=50) for _ in range(2))
    out = run()
    torch.cuda.synchronize()
    row = {**fields, "ms": round(best, 4), "same_output": bool(torch.equal(out, reference))}
    print(row, flush=True)
    return row


def main() -> None:
    global SIDE
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--package", default="bench_v3_fp8_triton")
    parser.add_argument("--tokens", default="1,4")
    parser.add_argument("--kinds", default="line_normal,line_last")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    SIDE = torch.cuda.Stream()
    package = import_package(args.package)
    layer = package.MoELayer(device="cuda").random_(0)
    tokens_list = list(map(int, args.tokens.split(",")))
    shared = layer.w13.shape[0] - 1  # the fused shared expert: the last expert
    targets = {
        "w13": [layer.w13[shared]],
        "w13+w2": [layer.w13[shared], layer.w2[shared]],
    }
    rows = []
    for tokens in tokens_list:
        x = torch.randn(tokens, layer.w13.shape[2], device="cuda").bfloat16()
        reference = layer(x)
        variants = {"none": (None, "")}
        for kind in args.kinds.split(","):
            for what, tensors in targets.items():
                for join in ("before", "gemm", "end"):
                    variants[f"{kind}:{what}:join-{join}"] = (prefetcher(kind, tensors), join)
        for name, (prefetch, join) in variants.items():
            run = partial(forward, package, layer, x, prefetch, join)
            rows.append(timed_row(graphed(run), run, reference, tokens=tokens, variant=name))
    dump(Path(args.out), {"device": torch.cuda.get_device_name(), "rows": rows})


if __name__ == "__main__":
    main()
