"""A CPU stand-in for DeepEP V1's `Buffer` (the calls moec makes), over torch.distributed, so
the generated DeepEP stages run on gloo ranks in CI. It follows the documented semantics
(docs/backends.md, "DeepEP V1"), not DeepEP's kernels:

- normal dispatch: each token once per destination rank, received in source-rank order, top-k
  ids local to the receiver (-1 and weight 0 for other ranks' experts); combine adds the
  returned rows and the bias in fp32, rounded once.
- low-latency dispatch: one row per (token, expert), packed per local expert in source-rank
  order into [local experts, ranks * max_tokens, H], quantized to e4m3 with 1 x 128 fp32 scales
  (MN-major) when asked; combine weights and sums each token's rows in fp32.

It checks what DeepEP asserts on the way (dtypes, contiguity, the token bound), and counts its
calls in CALLS. The real DeepEP runs in tests/gpu.
"""

import math

import torch
import torch.distributed as dist

__version__ = "stand-in"
topk_idx_t = torch.int64
CALLS: list[str] = []
E4M3_MAX = 448.0


class Config:
    def __init__(self, num_sms, nvl_send, nvl_recv, rdma_send, rdma_recv):
        self.num_sms = num_sms

    def get_nvl_buffer_size_hint(self, hidden_bytes: int, ranks: int) -> int:
        return 0  # the plan's sizes are checked against the real hints on the GPU


def _exchange(chunks: list[torch.Tensor], group) -> list[torch.Tensor]:
    """all_to_all of row blocks: chunks[r] goes to rank r; returns the block from each rank."""
    width = chunks[0].shape[1:]
    sent = torch.tensor([c.shape[0] for c in chunks])
    got = torch.empty_like(sent)
    dist.all_to_all_single(got, sent, group=group)
    wire = torch.uint8 if chunks[0].element_size() == 1 else chunks[0].dtype
    per_row = math.prod(width)
    flat = torch.cat([c.contiguous().view(wire).reshape(-1) for c in chunks])
    out = flat.new_empty(int(got.sum()) * per_row)
    dist.all_to_all_single(
        out, flat, [int(n) * per_row for n in got], [int(n) * per_row for n in sent], group=group
    )
    return list(out.view(chunks[0].dtype).view(-1, *width).split(got.tolist()))


class Buffer:
    num_sms = 20

    def __init__(
        self, group, num_nvl_bytes=0, num_rdma_bytes=0, low_latency_mode=False, num_qps_per_rank=24
    ):
        CALLS.append("Buffer")
        self.group = group
        self.rank, self.group_size = group.rank(), group.size()
        self.num_nvl_bytes, self.num_rdma_bytes = num_nvl_bytes, num_rdma_bytes
        self.low_latency_mode = low_latency_mode

    @staticmethod
    def set_num_sms(num_sms: int) -> None:
        assert num_sms % 2 == 0, "The SM count must be even"
        Buffer.num_sms = num_sms

    @staticmethod
    def get_dispatch_config(ranks: int) -> Config:
        return Config(Buffer.num_sms, 24, 256, 6, 128)

    @staticmethod
    def get_combine_config(ranks: int) -> Config:
        return Config(Buffer.num_sms, 10, 256, 6, 128)

    @staticmethod
    def get_low_latency_rdma_size_hint(max_tokens, hidden, ranks, experts) -> int:
        return 0

    # --- normal mode ------------------------------------------------------------------------

    def get_dispatch_layout(self, topk_idx, num_experts, previous_event=None, async_finish=False):
        CALLS.append("get_dispatch_layout")
        assert topk_idx.dtype == topk_idx_t and topk_idx.is_contiguous()
        local = num_experts // self.group_size
        owner = torch.where(topk_idx >= 0, topk_idx // local, self.group_size)
        in_rank = torch.zeros(topk_idx.shape[0], self.group_size + 1, dtype=torch.bool)
        in_rank.scatter_(1, owner, True)
        in_rank = in_rank[:, : self.group_size].contiguous()
        valid = topk_idx[topk_idx >= 0]
        per_expert = torch.bincount(valid, minlength=num_experts).int()
        return in_rank.sum(0).int(), None, per_expert, in_rank, None

    def dispatch(
        self,
        x,
        handle=None,
        num_tokens_per_rank=None,
        num_tokens_per_rdma_rank=None,
        is_token_in_rank=None,
        num_tokens_per_expert=None,
        topk_idx=None,
        topk_weights=None,
        expert_alignment=1,
        num_worst_tokens=0,
        config=None,
        previous_event=None,
        async_finish=False,
        allocate_on_comm_stream=False,
    ):
        CALLS.append("dispatch")
        values, scales = x if isinstance(x, tuple) else (x, None)
        assert values.is_contiguous() and values.dtype in (torch.bfloat16, torch.float8_e4m3fn)
        assert (scales is None) == (values.dtype == torch.bfloat16)
        assert topk_weights.dtype == torch.float32 and topk_idx.dtype == topk_idx_t
        tokens = [is_token_in_rank[:, r].nonzero().view(-1) for r in range(self.group_size)]
        rows = _exchange([values[t] for t in tokens], self.group)
        ids = _exchange([topk_idx[t] for t in tokens], self.group)
        weights = _exchange([topk_weights[t] for t in tokens], self.group)
        local = num_tokens_per_expert.numel() // self.group_size
        ids, weights = torch.cat(ids), torch.cat(weights)
        mine = (ids >= 0) & (ids // local == self.rank)
        recv_ids = torch.where(mine, ids % local, -1)
        recv_weights = torch.where(mine, weights, 0.0)
        received = torch.cat(rows)
        if scales is not None:
            received = (received, torch.cat(_exchange([scales[t] for t in tokens], self.group)))
        counts = torch.bincount(recv_ids[recv_ids >= 0], minlength=local).tolist()
        handle = (tokens, [r.shape[0] for r in rows], values.shape[0])
        return received, recv_ids, recv_weights, counts, handle, None

    def combine(self, x, handle, topk_weights=None, bias=None, config=None, **unused):
        CALLS.append("combine")
        assert x.dtype == torch.bfloat16 and x.is_contiguous()
        tokens, received, count = handle
        back = _exchange(list(x.split(received)), self.group)
        out = torch.zeros(count, x.shape[1], dtype=torch.float32)
        for t, rows in zip(tokens, back, strict=True):
            out.index_add_(0, t, rows.float())
        if bias is not None:
            out += bias.float()
        return out.to(torch.bfloat16), None, None

    # --- low-latency mode -------------------------------------------------------------------

    def low_latency_dispatch(
        self,
        x,
        topk_idx,
        num_max_dispatch_tokens_per_rank,
        num_experts,
        use_fp8=True,
        round_scale=False,
        use_ue8m0=False,
        **unused,
    ):
        CALLS.append("low_latency_dispatch")
        assert self.low_latency_mode and x.dtype == torch.bfloat16 and x.is_contiguous()
        assert x.shape[0] <= num_max_dispatch_tokens_per_rank and not use_ue8m0
        ranks, max_tokens = self.group_size, num_max_dispatch_tokens_per_rank
        local = num_experts // ranks
        token, k = (topk_idx >= 0).nonzero(as_tuple=True)  # assignments, token order
        expert = topk_idx[token, k]
        sends = [(expert // local == r).nonzero().view(-1) for r in range(ranks)]
        rows = _exchange([x[token[s]] for s in sends], self.group)
        experts = _exchange([(expert[s] % local).view(-1, 1) for s in sends], self.group)
        hidden = x.shape[1]
        recv = torch.zeros(local, ranks * max_tokens, hidden, dtype=torch.bfloat16)
        counts = torch.zeros(local, dtype=torch.int32)
        places = []  # per source rank: (expert, row) of each received assignment
        for block, ids in zip(rows, experts, strict=True):
            place = []
            for row, e in zip(block, ids.view(-1).tolist(), strict=True):
                recv[e, counts[e]] = row
                place.append((e, int(counts[e])))
                counts[e] += 1
            places.append(place)
        handle = (places, [(token[s], k[s]) for s in sends], x.shape[0])
        if not use_fp8:
            return recv, counts, handle, None, None
        groups = recv.float().view(local, ranks * max_tokens, hidden // 128, 128)
        scale = groups.abs().amax(-1).clamp(min=1e-4) / E4M3_MAX
        if round_scale:
            scale = torch.exp2(torch.ceil(torch.log2(scale)))
        values = (groups / scale[..., None]).view(recv.shape).to(torch.float8_e4m3fn)
        mn_major = torch.empty(local, hidden // 128, ranks * max_tokens).transpose(1, 2)
        mn_major.copy_(scale)
        return (values, mn_major), counts, handle, None, None

    def low_latency_combine(self, x, topk_idx, topk_weights, handle, **unused):
        CALLS.append("low_latency_combine")
        assert x.dtype == torch.bfloat16 and topk_weights.dtype == torch.float32
        places, sent, count = handle
        rows = [
            x[[e for e, _ in p], [r for _, r in p]] if p else x.new_empty((0, x.shape[-1]))
            for p in places
        ]
        back = _exchange(rows, self.group)
        out = torch.zeros(count, x.shape[-1], dtype=torch.float32)
        for (token, k), block in zip(sent, back, strict=True):
            out.index_add_(0, token, topk_weights[token, k][:, None] * block.float())
        return out.to(torch.bfloat16), None, None
