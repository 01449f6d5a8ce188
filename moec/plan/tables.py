"""Tuned tile tables: which GPU a layer's tables belong to, which entry a layer takes, and the
checks of what a table holds (the files themselves are read by moec/plan/environment.py).

A table is a JSON file per GPU, as `moec tune` writes it: for each layer key (`table_key`),
the list of token buckets, and under "elementwise/<key>" the tiles of the memory-bound kernels.
Under "backends/<key>" a table may hold the whole layer's time per token count for each GEMM
backend (benchmarks/bench_moe.py on that GPU), from which `gemm_backend = "auto"` chooses per
token bucket.
The GPU is the spec's target.gpu, else the one the arch's shipped table was tuned on (sm90:
nvidia-h200). Its tables are looked up in order in the user's tuning folder ($MOEC_TUNING_DIR,
default ~/.cache/moec/tuned/<gpu>.json), then among the tables moec ships (moec/plan/tuned/);
the first that holds the layer's key is used, else the tile pass takes its default table.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moec.errors import MoecError, problem
from moec.plan.layer import Layer

if TYPE_CHECKING:
    from moec.plan.environment import Environment

TUNED_DIR = Path(__file__).resolve().parent / "tuned"
SHIPPED_TABLES = {"nvidia-h200": "h200.json"}
"""Tables moec ships (in TUNED_DIR), by the GPU they were tuned on."""
ARCH_GPU = {"sm90": "nvidia-h200"}
"""The GPU whose tables a CUDA arch uses when the spec names none (target.gpu)."""
BUCKET_KEYS = {
    "max_tokens": "an integer, or null in the last bucket",
    "block_m": "an integer",
    "gate_up": "an object of tiles",
    "down": "an object of tiles",
}
"""What every bucket of a table holds (a bucket may hold more, e.g. its measured "ms"), each
key with the kind of value it takes (a key of _VALUE_OK)."""
POWER_OF_TWO_KEYS = frozenset({"BLOCK_M", "BLOCK_N", "BLOCK_K", "BLOCK_T", "BLOCK_H", "BLOCK_I"})
"""Tile keys Triton needs as powers of two (block shapes; warps below)."""
MAX_WARPS = 32
"""num_warps of one program at most: 1024 threads, the most a CUDA thread block holds on every
GPU (Triton would fail only at the launch)."""
COUNT_KEYS = frozenset({"GROUP_SIZE_M", "num_stages", "FP8_ACC", "PROGRAMS", "TERMS_AT_ONCE"})
"""Tile keys that are positive integers."""
FLAG_KEYS = frozenset({"SWAP_AB", "TMA", "WARP_SPECIALIZE"})
"""Tile keys that are booleans."""
GEMM_KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_SIZE_M", "num_warps", "num_stages")
"""What every grouped GEMM config of a bucket holds."""
ELEMENTWISE_KEYS = {
    "permute": ("BLOCK_M", "BLOCK_H", "num_warps"),
    "act": ("BLOCK_M", "BLOCK_I", "num_warps"),
    "combine": ("BLOCK_T", "BLOCK_H", "num_warps"),
}
"""What the tiles of each memory-bound kernel hold (combine may add TERMS_AT_ONCE)."""
MAX_BLOCK_ELEMENTS = 1 << 20
"""Elements of one block tensor of a Triton kernel at most (triton.language's
TRITON_MAX_TENSOR_NUMEL): a larger tile fails when Triton compiles the kernel."""
SHARED_MEMORY_BYTES = {
    "sm80": 166912,
    "sm89": 101376,
    "sm90": 232448,
    "sm100": 232448,
    "sm120": 101376,
}
"""Shared memory one program (CUDA thread block) may hold, opt-in maximum, by arch (CUDA
programming guide: 163, 99, 227, 227, 99 KiB)."""
OPERAND_BYTES = {
    "bf16": (2, 2),
    "fp8_per_tensor": (1, 1),
    "fp8_block": (1, 1),
    "mxfp8": (1, 1),
    "mxfp4": (1, 0.5),
}
"""Bytes per element of a grouped GEMM's operands as loaded (A, W), by scheme (at least: a bf16
layer's A may be wider)."""


@dataclass(frozen=True)
class TunedTable:
    """The entries of one tuned table for one layer."""

    gpu: str
    key: str
    where: str
    """The file, as the plan's decision shows it."""
    buckets: list[dict[str, Any]]
    elementwise: dict[str, dict[str, int]] | None
    """Tiles of permute, act and combine, if the table has them for this layer."""


def table_key(layer: Layer) -> str:
    """Key of a layer's GEMM shapes (fused shared experts share the routed experts' table)."""
    return (
        f"{layer.routed.scheme}/H{layer.hidden}/I{layer.intermediate}/"
        f"E{layer.local_experts}/K{layer.top_k}"
    )


def gpu_name(device_name: str) -> str:
    """A GPU's name in tables and target.gpu: its device name (torch.cuda.get_device_name) in
    lowercase, each run of other characters one hyphen: "NVIDIA H200" -> nvidia-h200."""
    return re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-")


def target_gpu(layer: Layer) -> str | None:
    """The GPU whose tables a CUDA layer uses: target.gpu, else its arch's shipped GPU."""
    if layer.device != "cuda":
        return None
    return layer.gpu or ARCH_GPU.get(layer.arch or "")


def find_table(layer: Layer, env: Environment) -> TunedTable | str:
    """The first table of the layer's GPU that holds its key, or why there is none."""
    key, gpu = table_key(layer), target_gpu(layer)
    if gpu is None:
        return f"target.gpu is unset and moec ships no table for {layer.arch} (key {key})"
    found = _first_holding(env, gpu, key)
    if isinstance(found, str):
        return found
    entries, where = found
    buckets = _checked_buckets(entries[key], where, key)
    elementwise = entries.get(f"elementwise/{key}")
    if elementwise is not None:
        _check_elementwise(elementwise, where, key)
    return TunedTable(gpu, key, where, buckets, elementwise)


def _first_holding(env: Environment, gpu: str, key: str) -> tuple[dict[str, Any], str] | str:
    """The entries of the first table of `gpu` that holds `key`, and where that table is; or
    where it looked."""
    looked = []
    for where, entries in env.tables(gpu):
        looked.append(where)
        if entries is not None and key in entries:
            return entries, where
    return f"no table of {gpu} has {key} (looked in {', '.join(looked)})"


@dataclass(frozen=True)
class BackendTimes:
    """The whole layer's measured time per token count, per GEMM backend, on one GPU."""

    gpu: str
    where: str
    source: str
    """How they were measured (the RESULTS.md run)."""
    ms: dict[str, dict[int, float]]
    """backend -> tokens -> ms."""


def find_backend_times(layer: Layer, env: Environment) -> BackendTimes | str:
    """The first table of the layer's GPU with backend timings for its key, or why none."""
    key, gpu = f"backends/{table_key(layer)}", target_gpu(layer)
    if gpu is None:
        return f"target.gpu is unset and moec ships no table for {layer.arch}"
    found = _first_holding(env, gpu, key)
    if isinstance(found, str):
        return found
    entries, where = found
    return _checked_times(entries[key], gpu, where, key)


def _checked_times(entry: Any, gpu: str, where: str, key: str) -> BackendTimes:
    """{"source": str, "ms": {backend: {tokens: ms}}}, with positive times."""
    ms = entry.get("ms") if isinstance(entry, dict) else None
    source = entry.get("source") if isinstance(entry, dict) else None
    if not isinstance(source, str) or not isinstance(ms, dict) or not ms:
        raise table_error(where, f'has no "source" and "ms" by backend under {key}')
    times: dict[str, dict[int, float]] = {}
    for backend, per_tokens in ms.items():
        try:
            times[backend] = {int(t): float(v) for t, v in per_tokens.items()}
        except (AttributeError, TypeError, ValueError):
            raise table_error(
                where, f"has times of {backend} under {key} that are not numbers"
            ) from None
        values = times[backend].values()
        if (
            not times[backend]
            or min(times[backend]) < 1
            or not all(0 < v < math.inf for v in values)
        ):
            raise table_error(
                where, f"has token counts or times of {backend} under {key} that are not positive"
            )
    return BackendTimes(gpu, where, source, times)


TABLE_KEY = re.compile(r"(?:(?:elementwise|backends)/)?[a-z0-9_]+/H[0-9]+/I[0-9]+/E[0-9]+/K[0-9]+")
"""An entry's key in a tuned table (layer_key, or its elementwise/ and backends/ forms)."""


def is_tuned_table(data: bytes) -> bool:
    """Whether `data` is a table `moec tune` writes: a JSON object of layer keys only, which
    moec may rewrite. Any other file is the user's."""
    try:
        entries = json.loads(data.decode("utf-8"))
    except ValueError:
        return False
    return (
        isinstance(entries, dict)
        and bool(entries)
        and all(TABLE_KEY.fullmatch(key) for key in entries)
    )


def table_error(where: str, what: str) -> MoecError:
    """A tuned table that cannot be used: the user's to fix (`moec tune`, or remove it)."""
    return MoecError(
        [
            problem(
                "target.gpu",
                f"the tuned table {where} {what}",
                "run `moec tune` again, or remove the file",
            )
        ],
        kind="backend",
    )


def _checked_buckets(records: Any, where: str, key: str) -> list[dict[str, Any]]:
    """The buckets of one entry: each with BUCKET_KEYS, the last one open-ended."""
    if not isinstance(records, list) or not records:
        raise table_error(where, f"has no bucket list under {key}")
    for index, record in enumerate(records):
        what = f"bucket {index} of {key}"
        _check_object(record, BUCKET_KEYS, BUCKET_KEYS.get, where, what, "an object", False)
    if records[-1]["max_tokens"] is not None:
        raise table_error(where, f'has a last bucket of {key} without "max_tokens": null')
    limit = 0
    for index, record in enumerate(records):
        bucket = f"bucket {index} of {key}"
        tokens = record["max_tokens"]
        if index < len(records) - 1 and not (_positive_int(tokens) and tokens > limit):
            raise table_error(
                where,
                f"has {bucket} with max_tokens = {tokens!r}, not an integer above the previous "
                f"bucket's ({limit})",
            )
        limit = tokens
        for gemm in ("gate_up", "down"):
            _check_tiles(record[gemm], GEMM_KEYS, where, f"{bucket}, {gemm}")
        block_m = record["block_m"]
        rows = {record[gemm]["BLOCK_M"] for gemm in ("gate_up", "down")}
        if isinstance(block_m, bool) or rows != {block_m}:
            raise table_error(
                where,
                f"has {bucket} with block_m = {block_m!r}, not the BLOCK_M both GEMMs take "
                f"({' and '.join(map(str, sorted(rows)))})",
            )
    return records


def check_launch_limits(
    table: TunedTable,
    buckets: list[dict[str, Any]],
    arch: str | None,
    schemes: tuple[str, ...],
    groups: dict[str, int],
) -> None:
    """Refuse tiles of `table` that the target cannot launch, naming the file and the entry:
    blocks over Triton's tensor size, BLOCK_K the `schemes` (those the Triton GEMMs run with
    these tiles) do not take, tiles whose pipelined operands alone exceed the shared memory of
    `arch`, and quantizing kernels whose column block is no multiple of their group (`groups`:
    elementwise kernel -> group size). Only `buckets` (those the layer runs) are checked."""
    for index, bucket in enumerate(buckets):
        for gemm in ("gate_up", "down"):
            wrong = _gemm_launch_problem(bucket[gemm], arch, schemes)
            if wrong:
                raise table_error(table.where, f"has bucket {index} of {table.key}, {gemm} {wrong}")
    if not table.elementwise:
        return
    for kernel, (rows, columns, _) in ELEMENTWISE_KEYS.items():
        config = table.elementwise[kernel]
        what = f"elementwise/{table.key}, {kernel}"
        if config[rows] * config[columns] > MAX_BLOCK_ELEMENTS:
            raise table_error(
                table.where,
                f"has {what} with {rows} x {columns} = {config[rows]} x {config[columns]}, more "
                f"than the {MAX_BLOCK_ELEMENTS} elements a Triton block holds",
            )
        group = groups.get(kernel)
        if group and config[columns] % group:
            raise table_error(
                table.where,
                f"has {what} with {columns} = {config[columns]}, not a multiple of {group}: this "
                f"kernel quantizes the layer's activations in groups of {group}",
            )


def _gemm_launch_problem(config: dict[str, Any], arch: str | None, schemes) -> str:
    """Why one grouped GEMM config cannot launch on `arch` for `schemes` ("" when it can)."""
    m, n, k = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"]
    for (first, a), (second, b) in (
        (("BLOCK_M", m), ("BLOCK_N", n)),
        (("BLOCK_M", m), ("BLOCK_K", k)),
        (("BLOCK_N", n), ("BLOCK_K", k)),
    ):
        if a * b > MAX_BLOCK_ELEMENTS:
            return (
                f"with {first} x {second} = {a} x {b}, more than the {MAX_BLOCK_ELEMENTS} "
                "elements a Triton block holds"
            )
    for scheme in schemes:
        if scheme == "fp8_block" and 128 % k:
            return f"with BLOCK_K = {k}, which does not divide 128 (fp8_block's scale blocks)"
        if scheme in ("mxfp8", "mxfp4") and k % 32:
            return f"with BLOCK_K = {k}, not a multiple of 32 ({scheme}'s scale groups)"
        for flag in ("SWAP_AB", "TMA"):
            if scheme in ("mxfp8", "mxfp4") and config.get(flag):
                return f"with {flag} = true, which the {scheme} GEMM does not take"
    stages, limit = config["num_stages"], SHARED_MEMORY_BYTES.get(arch or "")
    if stages < 2 or limit is None:
        return ""
    for scheme in schemes:
        a, w = OPERAND_BYTES[scheme]
        need = int((stages - 1) * (m * k * a + n * k * w))
        if need > limit:
            return (
                f"with num_stages = {stages}: {stages - 1} tiles of A and W in flight alone take "
                f"{need} bytes of shared memory ({scheme}, BLOCK_M/N/K {m}/{n}/{k}), more than "
                f"a program may hold on {arch} ({limit})"
            )
    return ""


def _check_elementwise(entry: Any, where: str, key: str) -> None:
    """The permute, act and combine tiles of an "elementwise/<key>" entry."""
    if not isinstance(entry, dict) or sorted(entry) != sorted(ELEMENTWISE_KEYS):
        raise table_error(
            where, f"has elementwise/{key} without exactly {', '.join(ELEMENTWISE_KEYS)}"
        )
    for kernel, required in ELEMENTWISE_KEYS.items():
        _check_tiles(entry[kernel], required, where, f"elementwise/{key}, {kernel}")


def _check_tiles(config: Any, required: tuple[str, ...], where: str, what: str) -> None:
    """One kernel's tiles: the required keys, and every value of the kind its key takes."""
    _check_object(config, required, _tile_kind, where, what, "an object of tiles", True)


def _check_object(
    record: Any, required, kind_of, where: str, what: str, noun: str, strict: bool
) -> None:
    """One object of a table (`what`, which is `noun`): the `required` keys, and every value of
    the kind its key takes (`kind_of`: a key's kind, a key of _VALUE_OK, or None for a key of no
    kind, which a `strict` object may not hold)."""
    if not isinstance(record, dict):
        raise table_error(where, f"has {what} that is not {noun}")
    missing = [name for name in required if name not in record]
    if missing:
        raise table_error(where, f"has {what} without {', '.join(missing)}")
    for name, value in record.items():
        kind = kind_of(name)
        if kind is None:
            if strict:
                raise table_error(where, f"has {what} with an unknown tile key {name!r}")
            continue
        if not _VALUE_OK[kind](value):
            raise table_error(where, f"has {what} with {name} = {value!r}, not {kind}")


MAX_TILE_VALUE = 1 << 16
"""The largest tile value a table may hold: above any block shape, warp or stage count a GPU
takes (a larger one would fail only when Triton compiles the kernel)."""


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _tile_count(value: Any) -> bool:
    return _positive_int(value) and value <= MAX_TILE_VALUE


_VALUE_OK = {
    "an integer, or null in the last bucket": lambda value: isinstance(value, (int, type(None))),
    "an integer": lambda value: isinstance(value, int),
    "an object of tiles": lambda value: isinstance(value, dict),
    "true or false": lambda value: isinstance(value, bool),
    f"a power of two up to {MAX_TILE_VALUE}": lambda value: (
        _tile_count(value) and value & (value - 1) == 0
    ),
    f"a positive integer up to {MAX_TILE_VALUE}": _tile_count,
    f"a power of two up to {MAX_WARPS} (1024 threads, a CUDA program's limit)": lambda value: (
        _positive_int(value) and value <= MAX_WARPS and value & (value - 1) == 0
    ),
}
"""What each kind of bucket or tile value accepts, by the words an error says it with."""


def _tile_kind(name: str) -> str | None:
    """The kind of value a tile key takes (a key of _VALUE_OK); None for no tile key."""
    if name in FLAG_KEYS:
        return "true or false"
    if name == "num_warps":
        return f"a power of two up to {MAX_WARPS} (1024 threads, a CUDA program's limit)"
    if name in POWER_OF_TWO_KEYS:
        return f"a power of two up to {MAX_TILE_VALUE}"
    return f"a positive integer up to {MAX_TILE_VALUE}" if name in COUNT_KEYS else None
