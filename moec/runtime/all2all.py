"""Expert parallelism over torch.distributed all_to_all_single (NCCL on GPUs, gloo on CPU).

Each rank holds `local_experts` whole experts (rank r: experts r * local_experts ..).
send_tokens sends each token once to every rank that owns one of its top-k experts, with its
top-k ids and weights; a sent row packs the token's values, its 1 x group scales, ids and
weights into one row of bytes, so the rows travel in one exchange after the counts. The
receiver sees each received row as a token whose ids of other ranks' experts are -1: the
layout, the GEMMs and the weighted sum of each received row's expert outputs (fp32, rounded
once to the model dtype) run as on one GPU. send_back returns those partial sums; the token's
rank then adds its partials (the exchange's returned_row_of, weight 1) and the shared experts'
output (fp32, rounded once). Row counts travel first (a host sync), so neither step fits a CUDA
graph. Shapes: T tokens here, K top-k, R rows received, W ranks.
"""

import math
from typing import NamedTuple

import torch
import torch.distributed as dist


class Exchange(NamedTuple):
    """What dispatch sent and received, for combine to bring the partial sums back."""

    send: list[int]  # rows sent to each rank
    received: list[int]  # rows received from each rank
    weights: torch.Tensor  # [R, K] fp32 top-k weights of the received rows
    returned_row_of: torch.Tensor  # [T, W] int32: row of t's partial from rank w, -1 for none
    returned_weights: torch.Tensor  # [T, W] fp32: 1 where t went to rank w, else 0


def exchange_rows(rows: torch.Tensor, received: list[int], send: list[int], group) -> torch.Tensor:
    """all_to_all of rows: `send[r]` rows go to rank r, `received[r]` rows come from it."""
    out = rows.new_empty((sum(received), *rows.shape[1:]))
    width = math.prod(rows.shape[1:])  # exchanged flat: a rank may send and receive no rows
    wire = torch.uint8 if rows.element_size() == 1 else rows.dtype  # fp8 travels as bytes
    dist.all_to_all_single(
        out.view(wire).view(-1),
        rows.contiguous().view(wire).view(-1),
        [count * width for count in received],
        [count * width for count in send],
        group=group,
    )
    return out


ALIGN = 16
"""Bytes each part of a packed row starts on: any dtype's view of it is aligned."""


def _row_layout(parts: list[torch.Tensor]) -> tuple[list[int], list[int], int]:
    """Where each [*, n_i] part sits in a packed row: (start byte, width in bytes) of each, and
    the row's bytes; each part starts on an ALIGN boundary."""
    widths = [part.shape[1] * part.element_size() for part in parts]
    padded = [-(-width // ALIGN) * ALIGN for width in widths]
    starts = [sum(padded[:i]) for i in range(len(parts))]
    return starts, widths, sum(padded)


def pack_rows(parts: list[torch.Tensor], index: torch.Tensor) -> torch.Tensor:
    """Rows `index` of each [T, n_i] part side by side as bytes: [len(index), row bytes] uint8
    (_row_layout)."""
    starts, widths, row_bytes = _row_layout(parts)
    packed = torch.empty(len(index), row_bytes, dtype=torch.uint8, device=index.device)
    for part, start, width in zip(parts, starts, widths, strict=True):
        # An empty part counts as contiguous whatever its strides (a rank given no tokens, top-k
        # = 1), and a byte view needs a unit last stride: such a part is copied with fresh ones.
        part = part.contiguous()
        if part.stride(-1) != 1:
            part = part.clone(memory_format=torch.contiguous_format)
        packed[:, start : start + width] = part.view(torch.uint8)[index]
    return packed


def unpack_rows(packed: torch.Tensor, like: list[torch.Tensor]) -> list[torch.Tensor]:
    """The parts of packed rows (pack_rows' layout for parts shaped and typed as `like`), as
    views of `packed`."""
    starts, widths, _ = _row_layout(like)
    return [
        packed[:, start : start + width].view(part.dtype)
        for part, start, width in zip(like, starts, widths, strict=True)
    ]


def send_tokens(x, x_scale, topk_ids, topk_weights, local_experts: int, group):
    """Send each token row (and its 1 x group scales) once to every rank owning one of its
    experts. Returns (rows [R, H], row scales [R, H/group] or x_scale (per tensor), the local
    expert of each received (row, k) [R, K] int32 (-1: another rank's), Exchange)."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    tokens = topk_ids.shape[0]
    owner = topk_ids.long() // local_experts  # [T, K] rank owning each chosen expert
    wanted = torch.zeros(world, tokens, dtype=torch.bool, device=x.device)
    wanted.scatter_(0, owner.t(), True)  # [W, T]: does rank w need token t
    send_counts = wanted.sum(dim=1)
    received_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(received_counts, send_counts, group=group)
    counts = torch.cat((send_counts, received_counts)).tolist()  # the host sync: split sizes
    send, received = counts[:world], counts[world:]
    _, token_of_sent = wanted.nonzero(as_tuple=True)  # grouped by rank, then token

    scaled_rows = x_scale is not None and x_scale.dim() == 2  # else one scale (or none) for all
    parts = [x, *([x_scale] if scaled_rows else []), topk_ids, topk_weights]
    arrived = exchange_rows(pack_rows(parts, token_of_sent), received, send, group)
    rows, *row_scale, ids, weights = unpack_rows(arrived, parts)  # [R, H], ..., [R, K], [R, K]
    row_scales = row_scale[0] if scaled_rows else x_scale
    local = ids.long() - rank * local_experts
    local_ids = torch.where((local >= 0) & (local < local_experts), local, -1).to(torch.int32)
    # the sent rows come back in the order they left: token t's row from rank w is number
    # (sent rows before it) of the returned rows
    flat = wanted.view(-1)
    returned_row = torch.where(flat, torch.cumsum(flat, 0) - 1, -1).view(world, tokens)
    exchange = Exchange(
        send,
        received,
        weights.float(),
        returned_row.t().contiguous().to(torch.int32),
        wanted.t().float(),
    )
    return rows, row_scales, local_ids, exchange


def send_back(partial, exchange: Exchange, group) -> torch.Tensor:
    """The partial sums of the received rows [R, H] back to the ranks they came from: [S, H]
    in the order the rows were sent (Exchange.returned_row_of indexes it)."""
    return exchange_rows(partial, exchange.send, exchange.received, group)
