"""One expert-parallel rank's experts under a skewed load, with and without replicas.

DeepSeek-V3 dims (fp8_block, Triton, one CUDA graph per T) on one GPU holding one EP=8 rank's
32 experts: the router's correction bias makes experts 0-3 (one group) hot, chosen by nearly
every token, about 7x the rows of each other expert. The placed layer adds 4 redundant
experts, by parallel.placement = "even" replicas of experts 0-3 (what `moec eplb` makes of that
load on one rank), with replica_choice = "random": each hot expert's rows split over two GEMM
groups. Both layers draw the same random weights per logical expert, so their outputs agree
within the fp8 bound (printed). Per T: time of each (median, the two timed in turn over
rounds), the most rows any GEMM group receives, the relative error between the outputs.

Build the packages first (repo root, moec installed):

    moec build benchmarks/specs/v3.toml -o benchmarks/.packages --set name=bench_rank32_fp8_triton \
      --set quant.scheme=fp8_block --set experts.gemm_backend=triton \
      --set model.n_routed_experts=32 --set experts.shared_experts=separate
    moec build benchmarks/specs/v3.toml -o benchmarks/.packages --set name=bench_rank32r4_fp8_triton \
      --set quant.scheme=fp8_block --set experts.gemm_backend=triton \
      --set model.n_routed_experts=32 --set experts.shared_experts=separate \
      --set parallel.redundant_experts=4 --set parallel.replica_choice=random

then on the GPU: python benchmarks/bench_placement.py --out $OUT/placement.json
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from common import (
    DEVICE,
    TOKENS,
    dump,
    graphed,
    held_by,
    import_package,
    in_turn,
    plan_stage,
    route,
)

PACKAGES = {"base": "bench_rank32_fp8_triton", "placed": "bench_rank32r4_fp8_triton"}
HOT = (0, 1, 2, 3)
HOT_BIAS = 1.0
"""Added to the hot experts' e_score_correction_bias (sigmoid scores are below 1)."""


def most_rows(package, layer, x) -> int:
    """The most rows one GEMM group (physical expert) receives for x."""
    ids = route(package, layer, x)[1]
    if any(s["name"] == "place" for s in package.PLAN["stages"]):
        stages = package.stages
        ids = stages.place(ids, *held_by(layer, plan_stage(package, "place")))
    experts = layer.w13.shape[0]
    return int(torch.bincount(ids.flatten().long(), minlength=experts).max())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    packages = {key: import_package(name) for key, name in PACKAGES.items()}
    layers = {}
    for key, package in packages.items():
        layer = package.MoELayer(device=DEVICE).random_(0)
        layer.gate_bias.data[list(HOT)] += HOT_BIAS
        layers[key] = layer
    rows = []
    for tokens in map(int, args.tokens.split(",")):
        gen = torch.Generator(device=DEVICE).manual_seed(tokens)
        hidden = layers["base"].w13.shape[2]
        x = torch.randn(tokens, hidden, device=DEVICE, generator=gen).bfloat16()
        outputs = {key: layer(x) for key, layer in layers.items()}
        error = (outputs["placed"].float() - outputs["base"].float()).norm()
        error = float(error / outputs["base"].float().norm())
        replays = {key: lambda layer=layer, x=x: layer(x) for key, layer in layers.items()}
        if DEVICE == "cuda":  # else a dry run (MOEC_BENCH_DEVICE=cpu, TRITON_INTERPRET=1)
            replays = {key: graphed(replay) for key, replay in replays.items()}
        samples = in_turn(replays, args.rounds)
        row = {
            "tokens": tokens,
            **{f"{key}_ms": round(sorted(ms)[len(ms) // 2], 4) for key, ms in samples.items()},
            **{f"{key}_most_rows": most_rows(packages[key], layers[key], x) for key in layers},
            "error": error,
        }
        row["placed_over_base"] = round(row["placed_ms"] / row["base_ms"], 3)
        rows.append(row)
        print(row, flush=True)
    print(
        f"{'T':>6}{'base ms':>10}{'placed ms':>11}{'ratio':>7}{'rows':>8}{'placed':>8}{'error':>10}"
    )
    for r in rows:
        print(f"{r['tokens']:>6}{r['base_ms']:>10.4f}{r['placed_ms']:>11.4f}"
              f"{r['placed_over_base']:>7.3f}{r['base_most_rows']:>8}{r['placed_most_rows']:>8}"
              f"{r['error']:>10.2e}")  # fmt: skip
    if args.out:
        dump(args.out, {"packages": PACKAGES, "hot": HOT, "hot_bias": HOT_BIAS, "rows": rows})


if __name__ == "__main__":
    main()
