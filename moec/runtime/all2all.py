"""Expert parallelism over torch.distributed all_to_all_single (NCCL on GPUs, gloo on CPU).

Each rank holds `local_experts` whole experts (rank r: experts r * local_experts ..).
dispatch sends each token once to every rank that owns one of its top-k experts, with its
top-k ids and weights; the receiver keeps the (row, k) assignments of its own experts. A sent
row packs the token's values, its 1 x group scales, ids and weights into one row of bytes, so
the rows travel in one exchange after the counts.
combine weights and sums each received row's expert outputs on the expert rank (fp32), sends
that partial sum back in the model dtype, and the token's rank adds the partials (fp32, one
rounding). Row counts travel first (a host sync), so neither step fits a CUDA graph.
Shapes: T tokens here, K top-k, R rows received, P assignments received for local experts.
"""

import math
from typing import NamedTuple

import torch
import torch.distributed as dist


class Exchange(NamedTuple):
    """What dispatch sent and received, for combine to send the partial sums back."""

    token_of_sent: torch.Tensor  # [S] token of each sent row, grouped by destination rank
    send: list[int]  # rows sent to each rank
    received: list[int]  # rows received from each rank
    row_of_assignment: torch.Tensor  # [P] received row of each local assignment
    weight_of_assignment: torch.Tensor  # [P] fp32 top-k weight of each local assignment
    tokens: int


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


def pack_rows(parts: list[torch.Tensor], index: torch.Tensor) -> torch.Tensor:
    """Rows `index` of each [T, n_i] part side by side as bytes: [len(index), row bytes] uint8,
    each part's bytes starting on an ALIGN boundary."""
    widths = [part.shape[1] * part.element_size() for part in parts]
    starts = [sum(-(-w // ALIGN) * ALIGN for w in widths[:i]) for i in range(len(parts))]
    row_bytes = starts[-1] + -(-widths[-1] // ALIGN) * ALIGN
    packed = torch.empty(len(index), row_bytes, dtype=torch.uint8, device=index.device)
    for part, start, width in zip(parts, starts, widths, strict=True):
        packed[:, start : start + width] = part.contiguous().view(torch.uint8)[index]
    return packed


def unpack_rows(packed: torch.Tensor, like: list[torch.Tensor]) -> list[torch.Tensor]:
    """The parts of packed rows (pack_rows' layout for parts shaped and typed as `like`), as
    views of `packed`."""
    widths = [part.shape[1] * part.element_size() for part in like]
    out, start = [], 0
    for part, width in zip(like, widths, strict=True):
        out.append(packed[:, start : start + width].view(part.dtype))
        start += -(-width // ALIGN) * ALIGN
    return out


def send_tokens(x, x_scale, topk_ids, topk_weights, local_experts: int, group):
    """Send each token row (and its 1 x group scales) once to every rank owning one of its
    experts. Returns (rows [R, H], row scales [R, H/group] or x_scale (per tensor), local
    expert of each local assignment [P] int32, Exchange)."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    tokens = topk_ids.shape[0]
    owner = topk_ids.long() // local_experts  # [T, K] rank owning each chosen expert
    wanted = torch.zeros(tokens, world, dtype=torch.bool, device=x.device)
    wanted.scatter_(1, owner, True)  # [T, world]: does rank r need token t
    destination, token_of_sent = wanted.t().nonzero(as_tuple=True)  # grouped by rank, then token
    send_counts = torch.bincount(destination, minlength=world)
    received_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(received_counts, send_counts, group=group)
    send, received = send_counts.tolist(), received_counts.tolist()  # host sync: split sizes

    scaled_rows = x_scale is not None and x_scale.dim() == 2  # else one scale (or none) for all
    parts = [x, *([x_scale] if scaled_rows else []), topk_ids, topk_weights]
    arrived = exchange_rows(pack_rows(parts, token_of_sent), received, send, group)
    rows, *row_scales, ids, weights = unpack_rows(arrived, parts)  # [R, H], ..., [R, K], [R, K]
    row_scales = row_scales[0] if scaled_rows else x_scale
    ids = ids.long()
    row_of_assignment, k = (ids // local_experts == rank).nonzero(as_tuple=True)
    local_ids = (ids[row_of_assignment, k] % local_experts).to(torch.int32)
    exchange = Exchange(
        token_of_sent, send, received, row_of_assignment, weights[row_of_assignment, k], tokens
    )
    return rows, row_scales, local_ids, exchange


def combine(y, routing, exchange: Exchange, shared, group, out_dtype):
    """out[t] = sum over t's experts of w * row (+ shared[t]): weighted partial sums per
    received row on this rank (fp32), sent back in out_dtype, summed on the token's rank."""
    rows = y.reshape(-1, y.shape[-1])[routing.row_of[:, 0].long()].float()  # [P, H]
    received_rows = sum(exchange.received)
    partial = torch.zeros(received_rows, rows.shape[1], dtype=torch.float32, device=y.device)
    partial.index_add_(0, exchange.row_of_assignment, rows * exchange.weight_of_assignment[:, None])
    returned = exchange_rows(partial.to(out_dtype), exchange.send, exchange.received, group)
    out = torch.zeros(exchange.tokens, rows.shape[1], dtype=torch.float32, device=y.device)
    out.index_add_(0, exchange.token_of_sent, returned.float())
    if shared is not None:
        out += shared.float()
    return out.to(out_dtype)
