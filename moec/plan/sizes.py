"""Bytes of typed tensors at a concrete token count.

Symbolic dims (T, H, E, K, I, 2I, Is, 2Is, M, max_m, S router slices, "H/128", ...) are evaluated against a
table built from the layer. Grouped tensors have two sizes: the rows actually used (T * K, for
the cost floor) and the worst case the buffers must hold (for peak memory).
"""

from __future__ import annotations

import math

from moec.plan.layer import Layer
from moec.plan.layouts import compact_rows, masked_max_m
from moec.plan.tuning import router_slices
from moec.plan.types import DType, Layout, TensorType
from moec.vocab import GemmLayout


def symbols(layer: Layer, tokens: int) -> dict[str, int]:
    return {
        "T": tokens,
        "H": layer.hidden,
        "E": layer.routed_experts,
        "K": layer.grouped_top_k,
        "I": layer.intermediate,
        "2I": 2 * layer.intermediate,
        "Is": layer.shared_intermediate,
        "2Is": 2 * layer.shared_intermediate,
        "1": 1,
        "S": router_slices(layer, tokens),
        "V": layer.vocab,
        "Kr": layer.top_k,
    }


def dim(name: str, table: dict[str, int]) -> int:
    """Value of a symbolic dim such as "H", "H/128" (ceiling division) or "T*K"."""
    if "*" in name:
        return math.prod(dim(part, table) for part in name.split("*"))
    if "/" in name:
        top, bottom = name.split("/")
        return math.ceil(table[top] / int(bottom))
    return table[name] if name in table else int(name)


def scale_bytes(tensor: TensorType, rows: int, cols: int) -> float:
    """Bytes of the scales of `rows` x `cols` values: fp32 or UE8M0 bytes per group; UE8M0
    packed four per int32 rounds each row's groups up to a multiple of 4; TMA-aligned
    (MN-major) scales pad the rows so each group's column starts on 16 bytes."""
    scale = tensor.scale
    if scale is None:
        return 0.0
    if scale.granularity == "per-tensor":
        return 4.0
    group = int(scale.granularity.split("x")[1])
    groups = math.ceil(cols / group)
    if scale.dtype is DType.ue8m0x4:
        row_bytes, element = math.ceil(groups / 4) * 4, 4
    elif scale.dtype is DType.ue8m0:
        row_bytes, element = groups, 1
    else:
        row_bytes, element = groups * 4, 4
    if scale.tma_aligned:
        unit = 16 // element
        rows = math.ceil(rows / unit) * unit
    return float(rows * row_bytes)


def tensor_bytes(tensor: TensorType, table: dict[str, int], rows: int | None = None) -> float:
    """Bytes of `tensor` (values and scales). For grouped layouts `rows` gives the row count."""
    if tensor.layout is Layout.row_major:
        count = math.prod(dim(d, table) for d in tensor.shape)
        cols = dim(tensor.shape[-1], table)
        lead = count // cols if cols else 0
        return count * tensor.dtype.bytes + scale_bytes(tensor, lead, cols)
    if len(tensor.shape) == 1:  # routing metadata: an int32 per row (M) or per expert (E)
        return (rows or 0) * 4 if tensor.shape == ("M",) else dim(tensor.shape[0], table) * 4
    cols = dim(tensor.shape[-1], table)
    used = rows if rows is not None else 0
    return used * cols * tensor.dtype.bytes + scale_bytes(tensor, used, cols)


def useful_rows(layer: Layer, tokens: int) -> int:
    """Rows of the grouped GEMMs that carry a token (no padding)."""
    return tokens * layer.grouped_top_k


def buffer_rows(layer: Layer, tokens: int, layout: GemmLayout, block_m: int) -> int:
    """Rows the grouped buffers are allocated with: the worst case of the layout.

    With expert parallelism a rank's experts can receive the tokens of all ep ranks (each
    token at most once per expert, and at most min(k, local experts) rows per token)."""
    arriving = tokens * layer.ep
    if layout == GemmLayout.masked:
        return layer.grouped_experts * masked_max_m(arriving)
    per_token = min(layer.grouped_top_k, layer.grouped_experts)
    return compact_rows(arriving * per_token, layer.grouped_experts, block_m)


def weight_bytes(tensor: TensorType, table: dict[str, int], experts: float | None = None) -> float:
    """Bytes of a weight; with `experts`, of that many experts of a [E, ...] weight."""
    shape = tensor.shape
    if experts is not None:
        shape = shape[1:]
    count = math.prod(dim(d, table) for d in shape)
    size = count * tensor.dtype.bytes
    return size * experts if experts is not None else size
