"""Time the generated DeepSeek-V3 layer on the GPU, beside the torch backend and the floors.

For T in {1, 16, 64, 256, 1024, 2048, 4096, 8192, 16384}: a fresh random input, routing from the
layer's random router weights, median of CUDA-event timings (eager, and replaying a CUDA graph
where the plan says the layer is graph safe), the torch backend on the same weights (its output is
also the correctness reference: max relative error reported), the plan's floor (uniform routing,
all bytes the plan moves) and DESIGN.md's floor (the experts this input actually touches, FLOPs at
the H200 fp8 / bf16 rate). Prints a table; writes JSON.

    python benchmarks/bench_moe.py --scheme fp8_block --tuned moec/plan/tuned/h200.json --out $OUT/bench_fp8.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from functools import partial
from pathlib import Path

import torch
from common import (
    DEVICE,
    TOKENS,
    apply_buckets,
    chosen_experts,
    design_floor_ms,
    dump,
    graph_safe,
    graphed,
    import_package,
    layer_flops,
    median_ms,
    plan_floors,
    stage_times_ms,
)

PACKAGES = {
    "fp8_block": ("bench_v3_fp8_triton", "bench_v3_fp8_torch"),
    "fp8_block_separate": ("bench_v3_fp8sep_triton", "bench_v3_fp8sep_torch"),
    "fp8_block_overlapped": ("bench_v3_fp8ovl_triton", "bench_v3_fp8sep_torch"),
    "fp8_block_deep_gemm": ("bench_v3_fp8_deep_gemm", "bench_v3_fp8_torch"),
    "bf16_deep_gemm": ("bench_v3_bf16_deep_gemm", "bench_v3_bf16_torch"),
    "bf16": ("bench_v3_bf16_triton", "bench_v3_bf16_torch"),
    "fp8_block_auto": ("bench_v3_fp8_auto", "bench_v3_fp8_torch"),
    "bf16_auto": ("bench_v3_bf16_auto", "bench_v3_bf16_torch"),
    "v2lite_fp8_block": ("bench_v2lite_fp8_triton", "bench_v2lite_fp8_torch"),
    "v2lite_fp8_block_overlapped": ("bench_v2lite_fp8ovl_triton", "bench_v2lite_fp8_torch"),
    "mxfp8": ("bench_small_mxfp8_triton", "bench_small_mxfp8_torch"),
    "mxfp4": ("bench_small_mxfp4_triton", "bench_small_mxfp4_torch"),
}


def expert_bytes(package) -> float:
    """Bytes of one routed expert's weights (values and scales) in this package."""
    layer_dims = package.PLAN["choices"]["dims"]
    hidden, inter = layer_dims["hidden"], layer_dims["intermediate"]
    scheme = layer_dims["routed"]["scheme"]
    values = 3 * hidden * inter * (0.5 if scheme == "mxfp4" else 2 if scheme == "bf16" else 1)
    scales = {
        "fp8_block": 3 * hidden * inter / 128**2 * 4,
        "mxfp8": 3 * hidden * inter / 32 * 4,
        "mxfp4": 3 * hidden * inter / 32 * 4,
    }
    return values + scales.get(scheme, 0)


def apply_variant(package, no_pdl: bool, fp8_acc: int | None, split_dispatch: bool) -> None:
    """A/B switches of the Triton layer: launches without PDL, another fp8 promotion interval,
    the dispatch in two launches at every T (no one-launch decode path)."""
    if split_dispatch:
        dispatch = sys.modules[f"{package.__name__}.triton_dispatch"]
        original = dispatch.dispatch
        dispatch.dispatch = lambda *args, **kwargs: original(*args, **{**kwargs, "one_launch": 0})
    tiles = sys.modules.get(f"{package.__name__}.tiles")
    if tiles is None:
        return
    if no_pdl:
        tiles.PDL = False
    if fp8_acc:
        for bucket in tiles.BUCKETS:
            bucket.gate_up["FP8_ACC"] = fp8_acc
            bucket.down["FP8_ACC"] = fp8_acc


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scheme", default="fp8_block", choices=sorted(PACKAGES))
    parser.add_argument("--tuned", default=None, help="tuned bucket table (JSON) to apply")
    parser.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    parser.add_argument("--torch-max-tokens", type=int, default=16384)
    parser.add_argument("--out", required=True)
    parser.add_argument(
        "--no-pdl", action="store_true", help="launch without programmatic dependent launch"
    )
    parser.add_argument("--fp8-acc", type=int, default=None, help="FP8_ACC of every GEMM config")
    parser.add_argument(
        "--split-dispatch", action="store_true", help="dispatch in two launches at every T"
    )
    parser.add_argument(
        "--times-table",
        default=None,
        help="a tuned table (JSON, e.g. ~/.cache/moec/tuned/nvidia-h200.json) to record the "
        "layer's best time per T into, under backends/<key>, for gemm_backend auto",
    )
    parser.add_argument("--times-source", default="bench_moe.py", help="how they were measured")
    args = parser.parse_args()
    fast_name, slow_name = PACKAGES[args.scheme]
    fast, slow = import_package(fast_name), import_package(slow_name)
    dims = fast.PLAN["choices"]["dims"]
    scheme = dims["routed"]["scheme"]
    key = f"{scheme}/H{dims['hidden']}/I{dims['intermediate']}/E{dims['local_experts']}/K{dims['top_k']}"
    if args.tuned and Path(args.tuned).exists():
        tuned = json.loads(Path(args.tuned).read_text())
        table = tuned.get(key)
        if table:
            apply_buckets(fast, table, tuned.get(f"elementwise/{key}"))
            print(f"applied tuned buckets for {key}")
    apply_variant(fast, args.no_pdl, args.fp8_acc, args.split_dispatch)
    layer = fast.MoELayer(device=DEVICE).random_(0)
    reference = slow.MoELayer(device=DEVICE).random_(0)
    floors = plan_floors(fast)
    fp8 = scheme != "bf16"
    rows = []
    for tokens in map(int, args.tokens.split(",")):
        start = time.time()
        x = torch.randn(tokens, dims["hidden"], device=DEVICE).bfloat16()
        out = layer(x)
        eager = median_ms(partial(layer, x))
        graph = None
        if graph_safe(fast) and tokens <= 1024 and DEVICE == "cuda":
            static = x.clone()
            try:
                replay = graphed(partial(layer, static))
                graph = median_ms(replay)
            except Exception as failure:  # report, keep timing the rest
                print(f"T={tokens}: CUDA graph capture failed: {failure!r}"[:400], flush=True)
        torch_ms, error, norm_error, rerouted, expected = None, None, None, None, None
        if tokens <= args.torch_max_tokens:
            try:
                expected = reference(x)
            except Exception as failure:
                print(f"T={tokens}: torch backend failed: {failure!r}"[:400], flush=True)
                expected = None
        if expected is not None:
            error = (
                (out.float() - expected.float()).abs().max() / expected.float().abs().max()
            ).item()
            difference = out.double() - expected.double()
            norm_error = (difference.norm() / expected.double().norm()).item()
            # tokens whose expert set differs: logits within rounding of a tie pick another
            # expert (the two routers sum in different orders), and that token's row differs
            # wholly, which the max-norm error above shows and the norm-wise one averages
            ours, theirs = chosen_experts(fast, layer, x), chosen_experts(slow, reference, x)
            rerouted = int((ours != theirs).any(dim=1).sum())
            repeats = 20 if tokens <= 1024 else 3
            torch_ms = median_ms(partial(reference, x), warmup=1, repeats=repeats)
        floor, hit = design_floor_ms(fast, layer, x, expert_bytes(fast), fp8)
        per_stage = stage_times_ms(fast, layer, x) if DEVICE == "cuda" else {}
        best = min(t for t in (eager, graph) if t is not None)
        row = {
            "tokens": tokens,
            "triton_ms": round(eager, 4),
            "triton_graph_ms": None if graph is None else round(graph, 4),
            "torch_ms": None if torch_ms is None else round(torch_ms, 4),
            "design_floor_ms": round(floor, 4),
            "plan_floor_ms": floors.get(tokens, {}).get("floor_ms"),
            "experts_hit": hit,
            "ratio_to_floor": round(best / floor, 3),
            "tflops": round(layer_flops(fast, tokens) / best / 1e9, 1),
            "max_rel_error_vs_torch": error,
            "norm_rel_error_vs_torch": norm_error,
            "tokens_routed_differently": rerouted,
            "stages_ms": per_stage,
            "stage_floors_ms": {
                stage: round(ms, 4)
                for stage, ms in floors.get(tokens, {}).get("stages", {}).items()
            },
        }
        rows.append(row)
        print(json.dumps(row), f"({time.time() - start:.0f} s)", flush=True)
    dump(
        Path(args.out),
        {
            "scheme": args.scheme,
            "package": fast_name,
            "tuned": args.tuned,
            "pdl": not args.no_pdl,
            "fp8_acc": args.fp8_acc,
            "split_dispatch": args.split_dispatch,
            "rows": rows,
            "device": torch.cuda.get_device_name() if DEVICE == "cuda" else DEVICE,
            "torch": torch.__version__,
            "triton": __import__("triton").__version__,
        },
    )
    if args.times_table:
        record_times(Path(args.times_table), key, fast, rows, args.times_source)
    print(
        f"\n{args.scheme}: T | triton ms | graph ms | torch ms | floor ms | x floor | TFLOP/s | "
        "err (max) | err (norm) | rerouted tokens"
    )
    for r in rows:
        print(
            f"{r['tokens']:>6} | {r['triton_ms']:>9} | {r['triton_graph_ms']} | {r['torch_ms']} | {r['design_floor_ms']} | {r['ratio_to_floor']} | {r['tflops']} | {r['max_rel_error_vs_torch']} | {r['norm_rel_error_vs_torch']} | {r['tokens_routed_differently']}"
        )


def record_times(path: Path, key: str, package, rows: list[dict], source: str) -> None:
    """Merge the layer's best time per T into `path` under backends/<key>, for its backend."""
    choices = package.PLAN["choices"]
    if package.PLAN.get("above"):
        print(f"{path}: not recorded: {choices['name']} switches GEMM backends with T")
        return
    table = json.loads(path.read_text()) if path.exists() else {}
    entry = table.setdefault(f"backends/{key}", {"source": source, "ms": {}})
    entry["source"] = source
    entry["ms"][choices["gemm_backend"]] = {
        str(r["tokens"]): min(t for t in (r["triton_ms"], r["triton_graph_ms"]) if t is not None)
        for r in rows
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(table, indent=2) + "\n")
    print(f"{path}: recorded {choices['gemm_backend']} under backends/{key}")


if __name__ == "__main__":
    main()
