"""Expert parallelism over torch.distributed all_to_all_single (NCCL on GPUs, gloo on CPU).

Each rank holds `local_experts` whole experts (rank r: experts r * local_experts ..). dispatch
sends every (token, k) assignment's row to the rank owning its expert; combine sends the expert
rows back in the same order and sums them on the token's rank. Row counts travel first (a host
sync), so neither step can be captured in a CUDA graph.
"""

from typing import NamedTuple

import torch
import torch.distributed as dist


class Exchange(NamedTuple):
    """How this rank's T*K assignments were sent to the ranks owning their experts."""

    order: torch.Tensor  # [T*K] assignment index in send order (grouped by owner rank)
    send: list[int]  # rows sent to each rank
    received: list[int]  # rows received from each rank
    tokens: int
    top_k: int


def exchange_rows(rows: torch.Tensor, received: list[int], send: list[int], group) -> torch.Tensor:
    """all_to_all of rows: `send[r]` rows go to rank r, `received[r]` rows come from it."""
    out = rows.new_empty((sum(received), *rows.shape[1:]))
    if rows.element_size() == 1:  # fp8 travels as bytes
        dist.all_to_all_single(
            out.view(torch.uint8), rows.contiguous().view(torch.uint8), received, send, group=group
        )
    else:
        dist.all_to_all_single(out, rows.contiguous(), received, send, group=group)
    return out


def send_assignments(x, x_scale, topk_ids, local_experts: int, group):
    """Send each assignment's token row (and its 1 x group scales) to the rank owning its
    expert. Returns (rows [R, H], row scales [R, H/group] or x_scale, local expert ids [R]
    int32, Exchange)."""
    world = dist.get_world_size(group)
    tokens, top_k = topk_ids.shape
    flat = topk_ids.reshape(-1).long()
    owner = flat // local_experts  # rank holding each assignment's expert
    order = torch.argsort(owner, stable=True)
    send_counts = torch.bincount(owner, minlength=world)
    received_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(received_counts, send_counts, group=group)
    send, received = send_counts.tolist(), received_counts.tolist()  # host sync: split sizes
    local_ids = (flat[order] % local_experts).to(torch.int32)
    local_ids = exchange_rows(local_ids, received, send, group)
    rows = exchange_rows(x[order // top_k], received, send, group)
    row_scales = x_scale
    if x_scale is not None and x_scale.dim() == 2:
        row_scales = exchange_rows(x_scale[order // top_k], received, send, group)
    return rows, row_scales, local_ids, Exchange(order, send, received, tokens, top_k)


def return_rows(y, routing, exchange: Exchange, group) -> torch.Tensor:
    """Each expert row back to the rank of its token: [T, K, H], in the token's k order."""
    rows = y.reshape(-1, y.shape[-1])[routing.row_of[:, 0].long()]  # [R, H] in received order
    returned = exchange_rows(rows, exchange.send, exchange.received, group)  # [T*K, H]
    per_assignment = torch.empty_like(returned)
    per_assignment[exchange.order] = returned
    return per_assignment.view(exchange.tokens, exchange.top_k, rows.shape[1])


def combine(y, topk_weights, routing, exchange: Exchange, shared, group, out_dtype):
    """out[t] = sum_k w[t, k] * row(t, k) (+ shared[t]), in fp32, rounded once."""
    rows = return_rows(y, routing, exchange, group).float()
    out = (rows * topk_weights.unsqueeze(-1)).sum(dim=1)
    if shared is not None:
        out += shared.float()
    return out.to(out_dtype)
