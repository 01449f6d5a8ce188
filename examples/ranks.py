r"""One rank of a moec layer built for several ranks (expert or tensor parallel): run it with
torchrun, one process per rank (per GPU on a CUDA host, gloo on a CPU).

    moec build examples/tiny-cpu.toml -o build --set name=tiny_ep2 \
        --set parallel.ep_size=2 --set parallel.dispatch=all2all
    torchrun --nproc-per-node 2 examples/ranks.py build/tiny_ep2

Each rank builds the package's MoELayer on the process group, gives it weights (random ones
here, the same on every rank for one seed; `load_weights(folder)` reads only this rank's
experts), and runs tokens: an expert-parallel rank its own (the layer exchanges the rows between
the ranks itself), a tensor-parallel rank the same tokens as every other rank (each computes a
slice of every expert, and the layer adds the slices: a rank with other tokens, or none, breaks
the sum or waits for it).
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: torchrun --nproc-per-node N examples/ranks.py PACKAGE_FOLDER")
    folder = Path(sys.argv[1]).resolve()
    sys.path.insert(0, str(folder.parent))
    package = importlib.import_module(folder.name)
    cuda = package.SPEC["target"]["device"] == "cuda"
    if cuda:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl" if cuda else "gloo")
    try:
        rank = dist.get_rank()
        device = torch.device("cuda", torch.cuda.current_device()) if cuda else "cpu"
        layer = package.MoELayer(group=dist.group.WORLD, device=device).random_(0)
        hidden = package.SPEC["model"]["hidden_size"]
        dtype = getattr(torch, package.SPEC["target"]["dtype"])
        tensor_parallel = package.SPEC["parallel"]["tp_size"] > 1
        own = 0 if tensor_parallel else rank  # an expert-parallel rank: its own batch and size
        tokens = 8 + own
        x = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(own))
        out = layer(x.to(device=device, dtype=dtype))
        print(
            f"rank {rank} of {dist.get_world_size()}: {tokens} tokens -> {list(out.shape)}",
            flush=True,
        )
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
