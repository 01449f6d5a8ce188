"""A GPU spec made a CPU one: `--set target.device=cpu` (or `--cpu`) on a spec written for CUDA.

The keys that only mean something on a GPU are dropped or replaced, before the spec is checked,
each change one line saying what changed and why: `target.arch` and `target.gpu` go (a CPU has
no CUDA architecture and no tuned tile table), DeepGEMM's GEMMs become the torch backend's (the
same layer, as its reference computes it), DeepEP's dispatch becomes `all2all` (the same rows
exchanged over torch.distributed, gloo on a CPU). A key the same command line sets itself is
left as it is: it is the user's choice, and the rules judge it.

The CLI prints the changes on stderr (`report_to`); from Python they are `LoadedSpec.changes`.
"""

from __future__ import annotations

import json
from typing import Any, TextIO

_DROPPED = {
    ("target", "arch"): "a CPU target has no CUDA architecture",
    ("target", "gpu"): "it picks a CUDA GPU's tuned Triton tiles",
}
_REPLACED = {
    ("experts", "gemm_backend", "deep_gemm"): (
        "torch",
        "DeepGEMM runs on CUDA GPUs of sm90 or newer; the torch backend computes the same layer",
    ),
    ("parallel", "dispatch", "deepep_normal"): (
        "all2all",
        "DeepEP runs on CUDA GPUs; all2all exchanges the same rows over gloo on a CPU",
    ),
    ("parallel", "dispatch", "deepep_low_latency"): (
        "all2all",
        "DeepEP runs on CUDA GPUs; all2all exchanges the same rows over gloo on a CPU",
    ),
}

_stream: TextIO | None = None
_told: set[str] = set()


def for_cpu(
    raw: dict[str, Any], set_paths: set[str]
) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """`raw` (the spec's data, overrides applied) without its GPU-only keys when the command
    line set target.device = "cpu"; the changes, as (key, "key = value: what and why")."""
    target = raw.get("target")
    if "target.device" not in set_paths or not isinstance(target, dict):
        return raw, []
    if target.get("device") != "cpu":
        return raw, []
    changes = []
    for (table, key), why in _DROPPED.items():
        values = raw.get(table)
        if isinstance(values, dict) and key in values and f"{table}.{key}" not in set_paths:
            value = values.pop(key)
            said = f"{table}.{key} = {_show(value)}: left out for the CPU: {why}"
            changes.append((f"{table}.{key}", said))
    for (table, key, was), (now, why) in _REPLACED.items():
        values = raw.get(table)
        if (
            isinstance(values, dict)
            and values.get(key) == was
            and f"{table}.{key}" not in set_paths
        ):
            values[key] = now
            said = f"{table}.{key} = {_show(was)}: now {_show(now)} for the CPU: {why}"
            changes.append((f"{table}.{key}", said))
    return raw, changes


def report_to(stream: TextIO | None) -> None:
    """Print each change of the specs loaded from now on to `stream`, once (None: not)."""
    global _stream
    _stream = stream
    _told.clear()


def tell(changes: tuple[str, ...]) -> None:
    """Print the lines `changes` where report_to says, each once."""
    if _stream is None:
        return
    for line in changes:
        if line not in _told:
            _told.add(line)
            print(line, file=_stream)


def _show(value: Any) -> str:
    return json.dumps(value) if isinstance(value, str) else str(value)
