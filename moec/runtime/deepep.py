"""Expert parallelism through DeepEP V1 (github deepseek-ai/DeepEP, `deep_ep.Buffer`).

Each rank holds `local_experts` whole experts (rank r: experts r * local_experts ..).

normal (prefill): `send_tokens` sends each token row (bf16, or e4m3 with its 1 x 128 scales)
once to every rank owning one of its experts, with its top-k ids and weights; DeepEP hands back
the received rows in source-rank order with top-k ids local to this rank (-1: another rank's
expert). The caller lays the received rows out by local expert as tokens of this rank, and
weights and sums each received row's expert outputs (fp32, rounded once); `combine` has DeepEP
send those partial sums back and add them on the token's rank with the shared experts' output
(fp32, one rounding). DeepEP waits on the host for the received row count, so this mode is not
CUDA-graph safe.

low latency (decode): `send_tokens_low_latency` sends one bf16 row per (token, expert), which
DeepEP quantizes to e4m3 with 1 x 128 scales on the way (or keeps bf16), straight into the
masked layout [local experts, ranks * max_tokens, H] with the valid row count of each expert;
`combine_low_latency` sends the expert outputs back and DeepEP weights and sums them on the
token's rank. Fixed shapes and no host waits: CUDA-graph safe.

One buffer per process group and mode serves every layer of the process (DeepEP allocates it
collectively, so every rank builds it at its first dispatch); the plan sizes it.
"""

import os
from typing import NamedTuple

import deep_ep
import torch
import torch.distributed as dist

from .grouping import MaskedRouting

_BUFFERS: dict[tuple[int, bool], "deep_ep.Buffer"] = {}


class NormalExchange(NamedTuple):
    """What normal dispatch received, for combine to send the partial sums back."""

    buffer: "deep_ep.Buffer"
    handle: tuple  # DeepEP's layout of the exchange
    weights: torch.Tensor  # [R, K] fp32 top-k weights of the received rows


class LowLatencyExchange(NamedTuple):
    """What low-latency dispatch sent, for combine to bring the expert outputs back."""

    buffer: "deep_ep.Buffer"
    handle: tuple
    topk_idx: torch.Tensor  # [T, K] deep_ep.topk_idx_t: this rank's tokens' experts
    topk_weights: torch.Tensor  # [T, K] fp32


def _buffer(group, *, nvl_bytes: int, rdma_bytes: int, low_latency: bool, qps: int, sms: int):
    """The process group's DeepEP buffer for this mode, allocated (collectively) on first use."""
    group = group if group is not None else dist.group.WORLD
    key = (id(group), low_latency)
    buffer = _BUFFERS.get(key)
    if buffer is not None:
        if buffer.num_nvl_bytes < nvl_bytes or buffer.num_rdma_bytes < rdma_bytes:
            raise RuntimeError(
                f"this process's DeepEP buffer ({buffer.num_nvl_bytes} NVLink, "
                f"{buffer.num_rdma_bytes} RDMA bytes) is smaller than this layer needs "
                f"({nvl_bytes}, {rdma_bytes}): build every layer of one model from one spec"
            )
        return buffer
    if sms:
        deep_ep.Buffer.set_num_sms(sms)
    buffer = deep_ep.Buffer(
        group, nvl_bytes, rdma_bytes, low_latency_mode=low_latency, num_qps_per_rank=qps
    )
    _BUFFERS[key] = buffer
    return buffer


def normal_buffer(group, *, nvl_bytes: int, rdma_bytes: int, sms: int, qps: int, hidden_bytes: int):
    """The normal-mode buffer; its sizes checked against the installed deep_ep's hints."""
    ranks = dist.get_world_size(group)
    deep_ep.Buffer.set_num_sms(sms)
    hints = [
        config.get_nvl_buffer_size_hint(hidden_bytes, ranks)
        for config in (
            deep_ep.Buffer.get_dispatch_config(ranks),
            deep_ep.Buffer.get_combine_config(ranks),
        )
    ]
    if max(hints) > nvl_bytes:
        raise RuntimeError(
            f"deep_ep {getattr(deep_ep, '__version__', '')} asks for {max(hints)} NVLink bytes, "
            f"the plan sized {nvl_bytes}: a DeepEP other than V1 1.2.x (rebuild moec's package)"
        )
    return _buffer(
        group, nvl_bytes=nvl_bytes, rdma_bytes=rdma_bytes, low_latency=False, qps=qps, sms=sms
    )


def send_tokens(x, x_scale, topk_ids, topk_weights, local_experts: int, buffer):
    """Normal dispatch. Returns (rows [R, H], row scales [R, H/128] or None, the local expert
    of each received (row, k) [R, K] int32 (-1: another rank's), NormalExchange)."""
    ranks = buffer.group_size
    topk_idx = topk_ids.to(deep_ep.topk_idx_t)
    per_rank, per_rdma_rank, per_expert, in_rank, _ = buffer.get_dispatch_layout(
        topk_idx, local_experts * ranks
    )
    payload = x if x_scale is None else (x, x_scale)
    received, ids, weights, _, handle, _ = buffer.dispatch(
        payload,
        num_tokens_per_rank=per_rank,
        num_tokens_per_rdma_rank=per_rdma_rank,
        is_token_in_rank=in_rank,
        num_tokens_per_expert=per_expert,
        topk_idx=topk_idx,
        topk_weights=topk_weights.float(),
        config=deep_ep.Buffer.get_dispatch_config(ranks),
    )
    rows, row_scales = received if x_scale is not None else (received, None)
    return rows, row_scales, ids.to(torch.int32), NormalExchange(buffer, handle, weights.float())


def combine(partial, exchange: NormalExchange, shared):
    """DeepEP sends the received rows' partial sums [R, H] (model dtype) back; each token's
    rank adds them and `shared` (fp32, rounded once to the model dtype)."""
    ranks = exchange.buffer.group_size
    out, _, _ = exchange.buffer.combine(
        partial,
        exchange.handle,
        bias=None if shared is None else shared.contiguous(),
        config=deep_ep.Buffer.get_combine_config(ranks),
    )
    return out


def low_latency_buffer(
    group, *, rdma_bytes: int, qps: int, max_tokens: int, hidden: int, experts: int
):
    """The low-latency buffer; its size checked against the installed deep_ep's hint."""
    ranks = dist.get_world_size(group)
    hint = deep_ep.Buffer.get_low_latency_rdma_size_hint(max_tokens, hidden, ranks, experts)
    if hint > rdma_bytes:
        raise RuntimeError(
            f"deep_ep {getattr(deep_ep, '__version__', '')} asks for {hint} RDMA bytes, the plan "
            f"sized {rdma_bytes}: a DeepEP other than V1 1.2.x (rebuild moec's package)"
        )
    # DeepEP asserts NVSHMEM_QP_DEPTH >= 2 * (max_tokens + 1); its default depth is 1024
    depth = max(int(os.environ.get("NVSHMEM_QP_DEPTH", "1024")), 2 * (max_tokens + 1))
    os.environ["NVSHMEM_QP_DEPTH"] = str(depth)
    return _buffer(group, nvl_bytes=0, rdma_bytes=rdma_bytes, low_latency=True, qps=qps, sms=0)


def send_tokens_low_latency(
    x,
    topk_ids,
    topk_weights,
    buffer,
    *,
    max_tokens: int,
    experts: int,
    fp8: bool,
    pow2_scales: bool,
):
    """Low-latency dispatch of bf16 x [T, H]. Returns (a [E_local, ranks * max_tokens, H] e4m3 or
    bf16, its 1 x 128 fp32 scales MN-major (or None), MaskedRouting, LowLatencyExchange).

    The routing's `counts` are the received rows of each local expert; `row_of` is [T, K] of -1
    (this rank's assignments sit on the ranks of their experts; only DeepEP's handle knows where)
    and `token_of_row` is empty: the masked GEMMs and the activation read counts and shapes."""
    topk_idx = topk_ids.to(deep_ep.topk_idx_t)
    received, counts, handle, _, _ = buffer.low_latency_dispatch(
        x, topk_idx, max_tokens, experts, use_fp8=fp8, round_scale=pow2_scales, use_ue8m0=False
    )
    a, a_scale = received if fp8 else (received, None)
    routing = MaskedRouting(
        row_of=torch.full_like(topk_ids, -1, dtype=torch.int32),
        token_of_row=counts.new_empty((0,)),
        counts=counts,
        max_m=a.shape[1],
    )
    return a, a_scale, routing, LowLatencyExchange(buffer, handle, topk_idx, topk_weights.float())


def combine_low_latency(y, exchange: LowLatencyExchange, shared, out_dtype):
    """out[t] = sum over t's experts of w * y (DeepEP: fp32, rounded to out_dtype) + shared[t]."""
    out, _, _ = exchange.buffer.low_latency_combine(
        y, exchange.topk_idx, exchange.topk_weights, exchange.handle
    )
    if shared is not None:
        out = (out.float() + shared.float()).to(out_dtype)
    return out
