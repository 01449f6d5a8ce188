"""How much of a prefill layer's memory-bound work could run under its grouped GEMMs (issue 27):
a probe, not a layer. For a built DeepGEMM package (`gemm_backend = "auto"` or "deep_gemm") at
each T, on the layer's own stages and inputs:

- each stage alone, in a CUDA graph (select = router + top-k; dispatch; the two GEMMs; the
  activation; combine), their sum beside the whole layer's graph;
- the two GEMMs with DeepGEMM limited to N SMs (`deep_gemm.set_num_sms`), alone, and with the
  non-GEMM stages of a second copy of the input running at the same time on a second stream (one
  graph, two streams): if that pair takes about the GEMMs' time, a forward pipelined over token
  chunks or expert groups could hide the other stages; if it takes their sum, it cannot;
- the router as one bf16 GEMM with fp32 accumulation (cuBLAS, x @ W^T) beside the layer's
  select stage (the fp32 router as three bf16 parts, then top-k): what a bf16 router key would
  save.

    python benchmarks/prefill_overlap.py --package bench_v3_fp8_auto --tokens 4096,16384 \
        --sms 132,120,108 --out $OUT/overlap_fp8.json
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch
from common import DEVICE, dump, graphed, import_package, in_turn
from prefill_ab import kernel_times_ms


def stage_calls(package, layer, x):
    """{stage: a call of it on its inputs} for one forward's DeepGEMM path (fp8 stages pass
    activation scales beside the rows, bf16 ones do not)."""
    stages = package.stages
    gate = (layer.gate_parts, layer.gate_bias, layer.gate_counters)
    weights, ids = stages.select(x, *gate)
    dispatched = stages.dispatch_deep_gemm(x, ids)
    routing = dispatched[-1]
    w13 = (layer.w13, layer.w13_scale) if hasattr(layer, "w13_scale") else (layer.w13,)
    w2 = (layer.w2, layer.w2_scale) if hasattr(layer, "w2_scale") else (layer.w2,)
    h = stages.gemm_gate_up_deep_gemm(*dispatched, *w13)
    act = getattr(stages, "activation_deep_gemm", stages.activation)
    hidden = act(h, routing)
    hidden = hidden if isinstance(hidden, tuple) else (hidden,)
    y = stages.gemm_down_deep_gemm(*hidden, routing, *w2)
    return {
        "select": lambda: stages.select(x, *gate),
        "dispatch": lambda: stages.dispatch_deep_gemm(x, ids),
        "gemm_gate_up": lambda: stages.gemm_gate_up_deep_gemm(*dispatched, *w13),
        "activation": lambda: act(h, routing),
        "gemm_down": lambda: stages.gemm_down_deep_gemm(*hidden, routing, *w2),
        "combine": lambda: stages.combine(y, weights, routing),
    }


def side_by_side(main, side):
    """main() on the current stream and side() on a second one, joined: one capturable call."""
    stream = torch.cuda.Stream()

    def both():
        current = torch.cuda.current_stream()
        stream.wait_stream(current)
        with torch.cuda.stream(stream):
            side()
        main()
        current.wait_stream(stream)

    return both


def median(samples: list[float]) -> float:
    return round(statistics.median(samples), 4)


def probe(package, tokens: int, sms: list[int], rounds: int) -> dict:
    import deep_gemm

    dims = package.PLAN["choices"]["dims"]
    layer = package.MoELayer(device=DEVICE).random_(0)
    x = torch.randn(tokens, dims["hidden"], device=DEVICE).bfloat16()
    x2 = torch.randn(tokens, dims["hidden"], device=DEVICE).bfloat16()
    calls, calls2 = stage_calls(package, layer, x), stage_calls(package, layer, x2)
    gemms = [calls["gemm_gate_up"], calls["gemm_down"]]
    others = [calls2[name] for name in ("select", "dispatch", "activation", "combine")]

    def run_all(fns):
        return lambda: [fn() for fn in fns]

    row: dict = {"tokens": tokens}
    full = deep_gemm.get_num_sms()
    replays = {"layer": graphed(lambda: layer(x))}
    replays.update({name: graphed(fn) for name, fn in calls.items()})
    weight_bf16 = layer.gate_parts[0].contiguous()  # the router weight's leading bf16 part
    replays["router_bf16_cublas"] = graphed(lambda: torch.mm(x, weight_bf16.t()))
    for name, samples in in_turn(replays, rounds).items():
        row[f"{name}_ms"] = median(samples)
    row["stages_sum_ms"] = round(sum(row[f"{name}_ms"] for name in calls), 4)
    row["others_ms"] = round(
        sum(row[f"{name}_ms"] for name in ("select", "dispatch", "activation", "combine")), 4
    )
    row["kernels_ms"] = [(k, round(ms, 4)) for k, ms in kernel_times_ms(replays["layer"])]
    replays.clear()
    for count in sms:
        deep_gemm.set_num_sms(count)
        pair = {
            f"gemms_{count}": graphed(run_all(gemms)),
            f"gemms_{count}_beside_others": graphed(side_by_side(run_all(gemms), run_all(others))),
        }
        for name, samples in in_turn(pair, rounds).items():
            row[f"{name}_ms"] = median(samples)
        pair.clear()
    deep_gemm.set_num_sms(full)
    row["num_sms_full"] = full
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--package", required=True)
    parser.add_argument("--tokens", default="4096,16384")
    parser.add_argument("--sms", default="132,120,108", help="DeepGEMM SM counts to try")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    package = import_package(args.package)
    sms = [int(n) for n in args.sms.split(",")]
    rows = []
    for tokens in (int(t) for t in args.tokens.split(",")):
        row = probe(package, tokens, sms, args.rounds)
        rows.append(row)
        print(f"T={tokens}: layer {row['layer_ms']} ms, stages sum {row['stages_sum_ms']}")
        for key, value in row.items():
            if key.endswith("_ms") and key not in ("layer_ms", "stages_sum_ms"):
                print(f"    {key:36s} {value}")
        for kernel, ms in row["kernels_ms"]:
            print(f"      {ms:8.4f}  {kernel}")
        torch.cuda.empty_cache()
        dump(Path(args.out), {"package": args.package, "rows": rows})


if __name__ == "__main__":
    main()
