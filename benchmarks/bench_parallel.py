"""Expert and tensor parallel layers on two GPUs: each layer's time per rank and its stages'.

One process per GPU in an NCCL group. For each package and tokens per rank: the layer on random
weights (the same on every rank as on one GPU), its median time with the ranks in step (a
barrier before each run), the median time of each stage (every stage function wrapped to
synchronize: a dispatch or combine then includes waiting for the other rank), a CUDA-graph
replay where the plan says the layer is graph-safe, and, beside them, one-GPU layers on the
same tokens (`--single`: e.g. the whole layer, and one holding an EP=2 rank's half of the
experts, whose GEMMs do that rank's work). Expert-parallel ranks each take T tokens;
tensor-parallel ranks all take the same T tokens. Floors are the plan's (`moec explain`),
where it has a row for T.

    python benchmarks/bench_parallel.py --packages bench_v3_fp8_ep2_all2all_triton:256,4096 \
        --single bench_v3_fp8_triton,bench_v3half_fp8_triton --out $OUT/parallel.json
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import torch
import torch.multiprocessing as mp
from common import dump, graph_safe, import_package, plan_floors, stage_times_ms

from moec.runtime import cuda_graph, self_check

WORLD = 2
MULTICAST_OFF = {  # NVLink multicast stays off on the shared GPU machines (FACTS.md)
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


def rank_tokens(package, tokens: int, rank: int) -> torch.Tensor:
    """This rank's tokens: rank-specific under expert parallelism, shared under tensor
    parallelism (every rank holds a slice of every expert and sees every token)."""
    hidden = package.PLAN["choices"]["dims"]["hidden"]
    replicated = package.PLAN["choices"]["dims"]["ep"] == 1
    seed = 100 + (0 if replicated else rank)
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(tokens, hidden, generator=generator).bfloat16().cuda()


def measure(package, layer, tokens: int, rank: int, barrier) -> dict:
    x = rank_tokens(package, tokens, rank)

    def timed(fn):
        return round(self_check.median_ms(fn, "cuda", 20, warmup=3, barrier=barrier), 4)

    row = {"tokens": tokens, "ms": timed(lambda: layer(x))}
    row["stages_ms"] = stage_times_ms(package, layer, x)
    if graph_safe(package):
        static = x.clone()
        replay, _ = cuda_graph.capture(lambda: layer(static), warmup=2)
        row["graph_ms"] = timed(replay)
    return row


def run_rank(rank: int, init_file: str, jobs, singles: list[str], out_file: str) -> None:
    os.environ.update(MULTICAST_OFF)
    torch.cuda.set_device(rank)
    torch.distributed.init_process_group(
        "nccl", init_method=f"file://{init_file}", rank=rank, world_size=WORLD
    )
    barrier = torch.distributed.barrier
    results = []
    try:
        for name, token_list in jobs:
            package = import_package(name)
            try:
                layer = package.MoELayer(device="cuda", group=torch.distributed.group.WORLD)
                layer.random_(11)
                rows = [measure(package, layer, t, rank, barrier) for t in token_list]
                results.append({"package": name, "rows": rows})
            except Exception as failure:  # report it, go on with the next package
                results.append({"package": name, "error": repr(failure)[:600]})
            layer = None
            torch.cuda.empty_cache()
            barrier()
        token_list = sorted({t for _, ts in jobs for t in ts})
        for single in singles:  # one-GPU layers on each rank's tokens, every rank on its GPU
            package = import_package(single)
            layer = package.MoELayer(device="cuda").random_(11)
            no_barrier = torch.cuda.synchronize
            rows = [measure(package, layer, t, rank, no_barrier) for t in token_list]
            results.append({"package": single, "one_gpu": True, "rows": rows})
            layer = None
            torch.cuda.empty_cache()
        torch.save(results, f"{out_file}.{rank}")
    finally:
        torch.distributed.destroy_process_group()


def report(results: list[list[dict]]) -> list[dict]:
    """Rank 0's and rank 1's rows side by side: the slower rank's time is the layer's."""
    merged = []
    for per_rank in zip(*results, strict=True):
        name = per_rank[0]["package"]
        entry = {"package": name, "one_gpu": per_rank[0].get("one_gpu", False)}
        errors = [r["error"] for r in per_rank if "error" in r]
        if errors:
            entry["error"] = errors[0]
            print(f"\n{name}: {errors[0]}")
            merged.append(entry)
            continue
        floors = plan_floors(import_package(name))
        entry["rows"] = []
        print(f"\n{name}")
        for rows in zip(*(r["rows"] for r in per_rank), strict=True):
            tokens = rows[0]["tokens"]
            floor = floors.get(tokens, {})
            stages = {
                stage: max(r["stages_ms"].get(stage, 0.0) for r in rows)
                for stage in rows[0]["stages_ms"]
            }
            row = {
                "tokens": tokens,
                "ms_per_rank": [r["ms"] for r in rows],
                "graph_ms_per_rank": [r.get("graph_ms") for r in rows],
                "floor_ms": floor.get("floor_ms"),
                "stages_ms": stages,
                "stage_floors_ms": floor.get("stages", {}),
            }
            entry["rows"].append(row)
            graph = row["graph_ms_per_rank"]
            print(
                f"  T={tokens}/rank: {max(row['ms_per_rank']):.4f} ms"
                + (f", graph {max(graph):.4f} ms" if all(graph) else "")
                + (f", floor {row['floor_ms']:.4f} ms" if row["floor_ms"] else "")
            )
            for stage, ms in stages.items():
                stage_floor = row["stage_floors_ms"].get(stage)
                shown = f"   floor {stage_floor:.4f}" if stage_floor is not None else ""
                print(f"    {stage:<16} {ms:>8.4f} ms{shown}")
        merged.append(entry)
    return merged


def parse_jobs(text: str) -> list[tuple[str, list[int]]]:
    jobs = []
    for item in text.split():
        name, _, tokens = item.partition(":")
        jobs.append((name, [int(t) for t in tokens.split(",")] if tokens else [256, 4096]))
    return jobs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--packages", required=True, help="space-separated name[:T,T,...] (tokens per rank)"
    )
    parser.add_argument("--single", default="", help="one-GPU packages to time beside (a,b)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if torch.cuda.device_count() < WORLD:
        sys.exit(f"needs {WORLD} CUDA devices, found {torch.cuda.device_count()}")
    jobs = parse_jobs(args.packages)
    os.environ.update(MULTICAST_OFF)
    with tempfile.TemporaryDirectory() as folder:
        out_file = str(Path(folder) / "out")
        mp.start_processes(
            run_rank,
            args=(
                str(Path(folder) / "init"),
                jobs,
                [n for n in args.single.split(",") if n],
                out_file,
            ),
            nprocs=WORLD,
            start_method="spawn",
        )
        results = [torch.load(f"{out_file}.{rank}") for rank in range(WORLD)]
    dump(
        Path(args.out),
        {"device": torch.cuda.get_device_name(), "world": WORLD, "layers": report(results)},
    )


if __name__ == "__main__":
    main()
