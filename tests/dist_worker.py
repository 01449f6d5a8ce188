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
