"""Worker of the multi-GPU tests: one rank of an NCCL group, one GPU each."""

from __future__ import annotations

import os

import torch
from dist_worker import edit_bias, import_package

from moec.runtime import cuda_graph, self_check

# NVLink multicast stays off on the shared GPU machines (FACTS.md).
MULTICAST_OFF = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


def run_layers(rank: int, world: int, init_file: str, jobs, x_all, split, out_file):
    """For each (folder, name, replicated[, bias]): build the layer on GPU `rank` (random
    weights), run it on this rank's tokens (all of them when replicated), time it; save the
    outputs (on the CPU) and the times."""
    os.environ.update(MULTICAST_OFF)
    torch.cuda.set_device(rank)
    torch.distributed.init_process_group(
        "nccl", init_method=f"file://{init_file}", rank=rank, world_size=world
    )
    try:
        outputs, times, graphs = [], [], []
        for folder, name, replicated, *bias in jobs:
            package = import_package(folder, f"{name}_rank")
            layer = package.MoELayer(device="cuda", group=torch.distributed.group.WORLD)
            layer.random_(11)
            edit_bias(layer, bias[0] if bias else {})
            x = x_all if replicated else x_all[split[rank] : split[rank + 1]]
            x = x.cuda()
            out = layer(x)
            outputs.append(out.cpu())
            times.append(median_ms(lambda layer=layer, x=x: layer(x)))
            graphs.append(graph_run(layer, x, out) if graph_safe(package) else None)
            del layer
            torch.cuda.empty_cache()
        torch.save({"outputs": outputs, "times": times, "graphs": graphs}, f"{out_file}.{rank}")
    finally:
        torch.distributed.destroy_process_group()


def median_ms(fn) -> float:
    """Median time of fn() over 10 runs after two warm-ups, every rank in step (a barrier
    before each run)."""
    return self_check.median_ms(fn, "cuda", 10, warmup=2, barrier=torch.distributed.barrier)


def graph_safe(package) -> bool:
    return any(
        d["what"] == "CUDA graph" and d["choice"] == "yes" for d in package.PLAN["decisions"]
    )


def graph_run(layer, x, eager_out) -> dict:
    """Capture the layer in a CUDA graph (every rank together), replay it: whether the replay
    gives the eager output bit for bit, and its median time (or why capturing failed)."""
    try:
        return _graph_run(layer, x, eager_out)
    except Exception as failure:  # reported by the test that asked for it
        return {"equal": False, "error": repr(failure)[:400]}


def _graph_run(layer, x, eager_out) -> dict:
    static = x.clone()
    replay, out = cuda_graph.capture(lambda: layer(static), warmup=2)
    replay()
    torch.cuda.synchronize()
    same = bool(torch.equal(out, eager_out))
    return {"equal": same, "ms": median_ms(replay)}
