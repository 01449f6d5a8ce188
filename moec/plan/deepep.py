"""DeepEP V1's buffers, sized by the plan: what each rank allocates, and the SMs its normal kernels
take. The formulas are DeepEP's own size hints (deepseek-ai/DeepEP 29d31c0, csrc/config.hpp:
`Config::get_nvl_buffer_size_hint`, `get_rdma_buffer_size_hint`, `LowLatencyLayout`), written
out here so `moec explain` can show the sizes on a machine without deep_ep. The generated code
passes these sizes to `deep_ep.Buffer` and checks them against deep_ep's hints on the GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from moec.plan.layer import Layer
from moec.spec.deepep_rules import NVL_PEERS
from moec.vocab import DispatchMode

NORMAL_SMS = 24
"""SMs of DeepEP's normal (prefill) kernels: nothing in the layer runs beside the exchange, so
it may take more than DeepEP's default of 20; 24 is what DeepEP's README runs with."""

NORMAL_QPS = 24
"""Queue pairs per rank in normal mode: DeepEP's default (they carry RDMA traffic only)."""


_RECV_CHUNK = {  # ranks -> (NVL receive chunk, RDMA receive chunk) of dispatch / combine configs
    2: (256, 128),
    4: (256, 128),
    8: (256, 128),
    16: (288, 128),
    24: (288, 128),
    32: (288, 128),
    48: (288, 128),
    64: (288, 128),
    96: (480, 128),
    128: (560, 128),
    144: (720, 128),
    160: (720, 128),
}
_ALIGN = 128  # NUM_BUFFER_ALIGNMENT_BYTES
_MAX_TOP_K = _MAX_SCALES = 128  # slots per token in the normal kernels' buffers
_SOURCE_META = 8  # sizeof(SourceMeta): two ints
_INT, _FLOAT, _INDEX, _INT4 = 4, 4, 8, 16  # topk_idx_t is int64


@dataclass(frozen=True)
class DeepEPBuffer:
    """One rank's `deep_ep.Buffer`: NVLink bytes, RDMA bytes, low-latency mode, SMs, QPs."""

    nvl_bytes: int
    rdma_bytes: int
    low_latency: bool
    sms: int
    """SMs of the normal kernels (Buffer.set_num_sms); the low-latency kernels size themselves."""
    qps: int
    """Queue pairs per rank (num_qps_per_rank): the local expert count in low-latency mode."""
    max_tokens: int | None = None
    """Low-latency mode: the per-rank token bound the buffers hold."""

    def describe(self) -> str:
        mib = 2**20
        parts = [f"NVLink {self.nvl_bytes / mib:.1f} MiB", f"RDMA {self.rdma_bytes / mib:.1f} MiB"]
        if self.low_latency:
            parts.append(f"low-latency, {self.max_tokens} tokens per rank, {self.qps} QPs")
        else:
            parts.append(f"{self.sms} SMs")
        return ", ".join(parts) + " per rank"


def _align(value: int) -> int:
    return (value + _ALIGN - 1) // _ALIGN * _ALIGN


def normal_nvl_bytes(hidden_bytes: int, ranks: int, sms: int = NORMAL_SMS) -> int:
    """Config::get_nvl_buffer_size_hint: per channel (sms / 2) and NVLink peer, a receive queue of
    tokens with their hidden row, source meta, top-k slots and scale slots."""
    rdma_ranks, nvl_ranks = max(ranks // NVL_PEERS, 1), min(ranks, NVL_PEERS)
    lanes = sms // 2 * nvl_ranks
    chunk = _RECV_CHUNK[ranks][0]
    per_token = hidden_bytes + _SOURCE_META + _MAX_TOP_K * (_INDEX + _FLOAT) + _MAX_SCALES * _FLOAT
    return _align(lanes * (2 * rdma_ranks + 3) * _INT + lanes * chunk * per_token)


def normal_rdma_bytes(hidden_bytes: int, ranks: int, sms: int = NORMAL_SMS) -> int:
    """Config::get_rdma_buffer_size_hint: 0 within one node; across nodes, per channel and RDMA
    peer, send and receive queues of the same slots plus a 16-byte flag."""
    if ranks <= NVL_PEERS:
        return 0
    lanes = sms // 2 * (ranks // NVL_PEERS)
    chunk = _RECV_CHUNK[ranks][1]
    per_token = (
        hidden_bytes + _SOURCE_META + _MAX_TOP_K * (_INDEX + _FLOAT) + _MAX_SCALES * _FLOAT + _INT4
    )
    return _align(lanes * (NVL_PEERS * 2 + 2) * 2 * _INT + lanes * chunk * per_token * 2)


def low_latency_rdma_bytes(max_tokens: int, hidden: int, experts: int) -> int:
    """LowLatencyLayout: two send, two receive and two signalling buffers; a dispatch message
    is a 16-byte header and the larger of a bf16 row and an e4m3 row with its fp32 scales, a
    combine message a bf16 row with per-128-channel min/max pairs."""
    scales = hidden // 128
    dispatch_msg = _INT4 + max(hidden * 2, hidden + scales * _FLOAT)
    combine_msg = scales * 4 + hidden * 2
    send = max(max_tokens * dispatch_msg, experts * max_tokens * combine_msg)
    receive = experts * max_tokens * max(dispatch_msg, combine_msg)
    signal = _align(experts * _INT)
    total = 2 * send + 2 * receive + 2 * signal
    return (total + _ALIGN) // _ALIGN * _ALIGN  # DeepEP rounds up past an aligned total too


def buffer_for(layer: Layer) -> DeepEPBuffer:
    """The buffer one rank of this layer allocates (dispatch = deepep_normal / _low_latency)."""
    if layer.dispatch == DispatchMode.deepep_low_latency:
        assert layer.tokens_per_rank is not None, "rules: low latency needs max_tokens_per_rank"
        rdma = low_latency_rdma_bytes(layer.tokens_per_rank, layer.hidden, layer.routed_experts)
        return DeepEPBuffer(0, rdma, True, 0, layer.local_experts, layer.tokens_per_rank)
    hidden_bytes = layer.hidden * max(layer.dtype.bytes, 2)
    return DeepEPBuffer(
        normal_nvl_bytes(hidden_bytes, layer.ep),
        normal_rdma_bytes(hidden_bytes, layer.ep),
        False,
        NORMAL_SMS,
        NORMAL_QPS,
    )
