"""Worker of tests/test_distributed.py: one rank of a gloo process group on the CPU."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch


def import_package(folder: str, name: str):
    init = Path(folder) / "__init__.py"
    spec = importlib.util.spec_from_file_location(name, init, submodule_search_locations=[folder])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def run_rank(rank: int, world: int, init_file: str, folder: str, name: str, x_all, split, out_file):
    """Build the layer on this rank, run it on this rank's tokens, save the output."""
    torch.distributed.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world
    )
    try:
        package = import_package(folder, name)
        layer = package.MoELayer(group=torch.distributed.group.WORLD).random_(11)
        x = x_all[split[rank] : split[rank + 1]]
        torch.save(layer(x), f"{out_file}.{rank}")
        all_done()
    finally:
        torch.distributed.destroy_process_group()


def run_layers(rank: int, world: int, init_file: str, jobs, x_all, split, out_file):
    """Several layers on one gloo group: for each (folder, name, replicated[, bias]), build it
    on this rank (random weights, then `bias` edits of the router's correction bias), run it on
    this rank's tokens (all of them when replicated); save the list of outputs."""
    torch.distributed.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world
    )
    try:
        outputs = []
        for folder, name, replicated, *bias in jobs:
            package = import_package(folder, f"{name}_rank")
            layer = package.MoELayer(group=torch.distributed.group.WORLD).random_(11)
            edit_bias(layer, bias[0] if bias else {})
            x = x_all if replicated else x_all[split[rank] : split[rank + 1]]
            outputs.append(layer(x))
        torch.save(outputs, f"{out_file}.{rank}")
        all_done()
    finally:
        torch.distributed.destroy_process_group()


def edit_bias(layer, bias: dict[int, float]) -> None:
    """Steer the router: set e_score_correction_bias of some experts (noaux_tc routers)."""
    for expert, value in bias.items():
        layer.gate_bias.data[expert] = value


def run_loaded(rank: int, world: int, init_file: str, folder: str, name: str, checkpoint, x_all):
    """Load this rank's weights from a sharded checkpoint folder, noting the shards it opens;
    run the layer on all tokens; save (output, opened shard names)."""
    torch.distributed.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world
    )
    try:
        package = import_package(folder, f"{name}_loaded")
        reader = package.checkpoint._read_safetensors
        opened = []

        def noting(path, *args, **kwargs):
            opened.append(Path(path).name)
            yield from reader(path, *args, **kwargs)

        package.checkpoint._read_safetensors = noting
        layer = package.MoELayer(group=torch.distributed.group.WORLD).load_weights(checkpoint)
        torch.save((layer(x_all), sorted(opened)), f"{checkpoint}/out.{rank}")
        all_done()
    finally:
        torch.distributed.destroy_process_group()


def all_done() -> None:
    """Wait until every rank is done before any leaves the gloo group: a rank that tore its
    connections down while another still used them made that one abort ("terminate called
    without an active exception", about one run in eight of tests/test_deepep.py). Only on
    success: a rank that failed leaves at once, so that the others fail instead of waiting."""
    torch.distributed.barrier()


def run_recorded(rank: int, world: int, init_file: str, jobs, batches, out_file):
    """The load counter on each rank: for each (folder, name, replicated) of `jobs`, build the
    layer (random weights), run it on this rank's share of every (x_all, split) of `batches`
    (all of x_all when replicated), then note its counts, write the load file
    (`{out_file}.{job}.json`), reset, and run the first batch again; save per job (router
    weight, bias, counts, the file's load, counts after the reset, after the forward after it)."""
    torch.distributed.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world
    )
    try:
        saved = []
        for index, (folder, name, replicated) in enumerate(jobs):
            package = import_package(folder, f"{name}_recorded")
            layer = package.MoELayer(group=torch.distributed.group.WORLD).random_(11)
            shares = [x if replicated else x[split[rank] : split[rank + 1]] for x, split in batches]
            for x in shares:
                layer(x)
            counts = layer.expert_load()
            load = layer.write_expert_load(f"{out_file}.{index}.json")
            layer.reset_expert_load()
            after_reset = layer.expert_load()
            layer(shares[0])
            weight, bias = layer.gate_weight.clone(), layer.gate_bias.clone()
            saved.append((weight, bias, counts, load, after_reset, layer.expert_load()))
        torch.save(saved, f"{out_file}.{rank}")
        all_done()
    finally:
        torch.distributed.destroy_process_group()
