"""Read checkpoint tensors by name: a state dict, a safetensors or torch file, a folder of
safetensors shards (with or without model.safetensors.index.json), or (name, tensor) pairs."""

import json
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import torch


class WeightError(ValueError):
    """Every missing, unexpected or mis-shaped tensor of one load, listed together."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("cannot load the weights:\n  " + "\n  ".join(problems))


def read_tensors(source, prefix: str) -> Iterator[tuple[str, torch.Tensor]]:
    """(name after prefix, tensor) for every tensor of `source` whose name starts with prefix."""
    if isinstance(source, (str, Path)):
        path = Path(source)
        if path.is_dir():
            yield from _read_folder(path, prefix)
        elif path.suffix == ".safetensors":
            yield from _read_safetensors(path, prefix)
        elif path.exists():
            yield from _strip(
                torch.load(path, map_location="cpu", weights_only=True).items(), prefix
            )
        else:
            raise WeightError([f"{path}: no such file or folder"])
    elif isinstance(source, Mapping):
        yield from _strip(source.items(), prefix)
    elif isinstance(source, Iterable):
        yield from _strip(source, prefix)
    else:
        raise WeightError([f"cannot read weights from a {type(source).__name__}"])


def _strip(items, prefix: str) -> Iterator[tuple[str, torch.Tensor]]:
    for name, tensor in items:
        if name.startswith(prefix):
            yield name[len(prefix) :], tensor


def _read_safetensors(path: Path, prefix: str, names: set[str] | None = None):
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        for name in handle.keys():  # noqa: SIM118  (a safe_open handle is no dict)
            if name.startswith(prefix) and (names is None or name in names):
                yield name[len(prefix) :], handle.get_tensor(name)


def _read_folder(path: Path, prefix: str):
    index = path / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        shards: dict[str, set[str]] = {}
        for name, shard in weight_map.items():
            if name.startswith(prefix):
                shards.setdefault(shard, set()).add(name)
        for shard in sorted(shards):
            yield from _read_safetensors(path / shard, prefix, shards[shard])
        return
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise WeightError([f"{path}: no *.safetensors files"])
    for file in files:
        yield from _read_safetensors(file, prefix)
