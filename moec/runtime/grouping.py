"""Where each (token, k) assignment sits in the grouped layout, computed with torch ops.

contiguous: rows grouped by expert, each expert's rows padded to a multiple of `block_m`, so a
GEMM tile of `block_m` rows never mixes experts; `m_indices` gives each row's expert (-1 for
padding), `ends` each expert's end row (the same layout told by E numbers: DeepGEMM's "psum"
form). The buffers hold the worst case over all routings (`compact_rows`).
masked: `[E, max_m, cols]`, expert e owns rows e * max_m ..; `counts` says how many are valid.

Both keep token order within an expert (a stable sort), so every backend builds the same rows.
An id outside [0, E) (an expert-parallel rank's view of another rank's expert, -1) has no row:
its row_of is -1. Shapes: T tokens, K assignments per token, E experts, M rows of the layout.
"""

from typing import NamedTuple

import torch


class ContiguousRouting(NamedTuple):
    """Indices of the contiguous layout."""

    row_of: torch.Tensor  # [T, K] int32: row of each assignment
    token_of_row: torch.Tensor  # [M] int32: token of each row, -1 for padding
    counts: torch.Tensor  # [E] int32: rows of each expert (without padding)
    m_indices: torch.Tensor  # [M] int32: expert of each row, -1 for padding
    starts: torch.Tensor  # [E] int64: first row of each expert (a multiple of block_m)
    ends: torch.Tensor  # [E] int32: row after each expert's last, start + count (DeepGEMM's psum)
    num_rows: torch.Tensor  # [1] int32: rows in use (the rest of the worst-case M is unused)


class MaskedRouting(NamedTuple):
    """Indices of the masked layout."""

    row_of: torch.Tensor  # [T, K] int32: row of each assignment in the flattened [E * max_m]
    token_of_row: torch.Tensor  # [E * max_m] int32: token of each row, -1 for unused rows
    counts: torch.Tensor  # [E] int32: valid rows of each expert (masked_m)
    max_m: int  # rows per expert in the [E, max_m, *] buffers


def compact_rows(assignments: int, experts: int, block_m: int) -> int:
    """Most padded rows any routing of `assignments` rows over `experts` experts can need: each
    non-empty expert wastes at most block_m - 1 rows of padding."""
    nonempty = min(assignments, experts)
    return block_m * (nonempty + (assignments - nonempty) // block_m)


def masked_max_m(tokens: int) -> int:
    """Rows per expert of the masked layout: every token could pick the same expert."""
    return (tokens // 256 + 1) * 256


def _sorted_assignments(topk_ids: torch.Tensor, experts: int):
    """Assignments grouped by expert (stable), ids outside [0, E) last as expert E: (flat ids,
    order, sorted experts, counts [E + 1], rank of each sorted assignment within its expert)."""
    flat = topk_ids.reshape(-1).long()  # [T*K]
    flat = torch.where((flat >= 0) & (flat < experts), flat, experts)
    order = torch.argsort(flat, stable=True)  # assignment index, grouped by expert
    sorted_experts = flat[order]
    # [E + 1] rows per expert; scatter_add, not bincount, which syncs with the host on CUDA
    counts = torch.zeros(experts + 1, dtype=torch.int64, device=flat.device).scatter_add_(
        0, flat, torch.ones_like(flat)
    )
    first = torch.cumsum(counts, 0) - counts  # first sorted position of each expert
    rank = torch.arange(flat.numel(), device=flat.device) - first[sorted_experts]
    return flat, order, sorted_experts, counts, rank


def _rows(topk_ids, order, sorted_rows, rows: int):
    """row_of [T, K] and token_of_row [rows] from each sorted assignment's row (-1: none, written
    to a spare last row that is dropped)."""
    tokens, top_k = topk_ids.shape
    row_of = torch.empty(tokens * top_k, dtype=torch.int64, device=topk_ids.device)
    row_of[order] = sorted_rows
    token_of_row = torch.full((rows + 1,), -1, dtype=torch.int32, device=topk_ids.device)
    token_of_row[sorted_rows] = (order // top_k).to(torch.int32)
    return row_of.view(tokens, top_k).to(torch.int32), token_of_row[:rows]


def route_contiguous(topk_ids: torch.Tensor, experts: int, block_m: int) -> ContiguousRouting:
    """The contiguous layout of topk_ids [T, K] over `experts` experts, padded to `block_m`."""
    flat, order, sorted_experts, counts, rank = _sorted_assignments(topk_ids, experts)
    counts = counts[:experts]  # without the no-expert bin
    padded = (counts + block_m - 1) // block_m * block_m
    starts = torch.cumsum(padded, 0) - padded  # [E]
    rows = compact_rows(flat.numel(), experts, block_m)
    mine = sorted_experts < experts
    sorted_rows = torch.where(mine, starts[sorted_experts.clamp(max=experts - 1)] + rank, -1)
    m_indices = torch.full((rows + 1,), -1, dtype=torch.int32, device=flat.device)
    m_indices[sorted_rows] = torch.where(mine, sorted_experts, -1).to(torch.int32)
    row_of, token_of_row = _rows(topk_ids, order, sorted_rows, rows)
    num_rows = padded.sum().reshape(1).to(torch.int32)
    ends = (starts + counts).to(torch.int32)
    return ContiguousRouting(
        row_of, token_of_row, counts.to(torch.int32), m_indices[:rows], starts, ends, num_rows
    )


def route_masked(topk_ids: torch.Tensor, experts: int) -> MaskedRouting:
    """The masked layout of topk_ids [T, K] over `experts` experts."""
    _, order, sorted_experts, counts, rank = _sorted_assignments(topk_ids, experts)
    max_m = masked_max_m(topk_ids.shape[0])
    sorted_rows = torch.where(sorted_experts < experts, sorted_experts * max_m + rank, -1)
    row_of, token_of_row = _rows(topk_ids, order, sorted_rows, experts * max_m)
    return MaskedRouting(row_of, token_of_row, counts[:experts].to(torch.int32), max_m)


def rows_shape(routing, experts: int) -> tuple[int, ...]:
    """Leading dims of a tensor in the layout: (M,) contiguous, (E, max_m) masked."""
    if isinstance(routing, MaskedRouting):
        return (experts, routing.max_m)
    return (routing.token_of_row.numel(),)


def permute(x: torch.Tensor, x_scale, routing, experts: int):
    """Token rows x [T, H] (and their 1 x group scales [T, H/group]) copied into the layout:
    padding rows are zero, their scales one; a per-tensor scale [1] passes through."""
    leading = rows_shape(routing, experts)
    valid = routing.token_of_row >= 0
    source = routing.token_of_row[valid].long()
    # row numbers, not the boolean mask: one masked element of an fp8 tensor is a masked_fill,
    # which torch has no fp8 kernel for
    rows = valid.nonzero().squeeze(1)
    a = x.new_zeros((routing.token_of_row.numel(), x.shape[1]))
    a[rows] = x[source]
    a_scale = x_scale
    if x_scale is not None and x_scale.dim() == 2:
        a_scale = x_scale.new_ones((routing.token_of_row.numel(), x_scale.shape[1]))
        a_scale[rows] = x_scale[source]
        a_scale = a_scale.view(*leading, x_scale.shape[1])
    return a.view(*leading, x.shape[1]), a_scale


def combine(y: torch.Tensor, topk_weights, routing, shared, out_dtype) -> torch.Tensor:
    """out[t] = sum_k w[t, k] * y[row_of[t, k]] (+ shared[t]), in fp32, rounded once."""
    return weighted_rows(y, routing.row_of, topk_weights, shared, out_dtype)


def weighted_rows(y: torch.Tensor, row_of, weights, shared, out_dtype) -> torch.Tensor:
    """out[t] = sum_k weights[t, k] * y[row_of[t, k]] (+ shared[t]) for row_of [T, K] (-1: no
    term) into rows of y [M, H] (a masked [E, max_m, H] as [E * max_m, H]): fp32 in k order,
    rounded once."""
    rows = y.reshape(-1, y.shape[-1])  # [M, H]
    out = torch.zeros(weights.shape[0], rows.shape[1], dtype=torch.float32, device=y.device)
    for k in range(weights.shape[1]):
        row = row_of[:, k].long()
        term = rows[row.clamp(min=0)].float() * weights[:, k : k + 1]
        out += torch.where((row >= 0)[:, None], term, 0.0)
    if shared is not None:
        out += shared.float()
    return out.to(out_dtype)
