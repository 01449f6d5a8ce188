"""Roofline cost per stage as a function of T tokens, and peak memory of the intermediates.

bytes: the tensors a stage reads and writes (by their types) plus the weights it touches. A
grouped GEMM touches the experts hit by at least one token; under uniform routing the expected
count of E experts hit by T tokens choosing k each is E * (1 - (1 - k/E)^T). With expert
parallelism the E/ep experts of a rank receive the tokens of all ep ranks: E/ep * (1 - (1 -
k/E)^(ep*T)). A converter rewrites only the scales of its tensor (the values pass through
unchanged), so it costs, and allocates, only scale bytes.
floor: max(bytes / bandwidth, FLOPs / rate of the stage's operand type, bytes sent over NVLink /
link bandwidth, bytes sent between nodes / NIC bandwidth), per stage and for the whole layer
(totals, and the sum of each stage's compute time).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from moec.plan.comm import stage_traffic
from moec.plan.devices import Device
from moec.plan.graph import Plan
from moec.plan.layer import Layer
from moec.plan.sizes import buffer_rows, symbols, tensor_bytes, useful_rows, weight_bytes
from moec.plan.stages import Convert, Dispatch, Gemm, Router, SharedExpert, Stage
from moec.plan.types import Layout, TensorType
from moec.vocab import ENDPOINTS, RouterPrecision, StageKind


@dataclass(frozen=True)
class StageCost:
    stage: str
    bytes: float
    flops: float
    compute: str
    floor_ms: float
    link_bytes: float = 0.0
    """Bytes this rank sends to ranks of its node (moec/plan/comm.py)."""
    nic_bytes: float = 0.0
    """Bytes this rank sends to other nodes."""


@dataclass(frozen=True)
class Cost:
    tokens: int
    bytes: float
    flops: float
    floor_ms: float
    peak_bytes: float
    experts_hit: float
    stages: list[StageCost]

    def as_dict(self) -> dict[str, object]:
        data = asdict(self)
        data["stages"] = [asdict(s) for s in self.stages]
        return data


def experts_hit(experts: int, top_k: int, tokens: int, total_experts: int | None = None) -> float:
    """Expected distinct experts (of `experts` local ones) hit by `tokens` tokens (of every
    rank that sends to these experts) choosing `top_k` of `total_experts` each, uniformly."""
    total = total_experts or experts
    if tokens == 0:
        return 0.0
    return experts * (1.0 - (1.0 - top_k / total) ** tokens)


def cost(plan: Plan, device: Device, tokens: int, rows_factor: float = 1.0) -> Cost:
    """Bytes, FLOPs and floor of every stage, and of the layer, at `tokens` tokens; a rank
    whose experts receive `rows_factor` times the mean rows (a placement under a recorded
    load, moec/eplb.py) has its grouped rows scaled by it."""
    layer = plan.layer
    table = symbols(layer, tokens)
    rows = round(useful_rows(layer, tokens) * rows_factor)
    # The rank's local experts see the tokens of every expert-parallel rank.
    hit = experts_hit(layer.local_experts, layer.top_k, tokens * layer.ep, layer.routed_experts)
    if layer.fused_shared and tokens:
        hit += layer.n_shared
    stages = []
    for stage in plan.order():
        if stage.kind in ENDPOINTS:
            continue
        moved = _io_bytes(plan, stage, table, rows) + _weights_touched(stage, table, hit)
        flops, compute = _flops(stage, layer, tokens, rows)
        sent = stage_traffic(plan, stage, tokens)
        floor = max(
            moved / (device.bandwidth_gbs * 1e9),
            flops / (device.rate_tflops(compute) * 1e12) if flops else 0.0,
            sent.link_bytes / (device.link_gbs * 1e9) if sent.link_bytes else 0.0,
            sent.nic_bytes / (device.nic_gbs * 1e9) if sent.nic_bytes else 0.0,
        )
        stages.append(
            StageCost(
                stage.name, moved, flops, compute, floor * 1e3, sent.link_bytes, sent.nic_bytes
            )
        )
    total_bytes = sum(s.bytes for s in stages)
    total_flops = sum(s.flops for s in stages)
    compute_s = sum(s.flops / (device.rate_tflops(s.compute) * 1e12) for s in stages if s.flops)
    link_s = sum(s.link_bytes for s in stages) / (device.link_gbs * 1e9) if device.link_gbs else 0
    nic_s = sum(s.nic_bytes for s in stages) / (device.nic_gbs * 1e9) if device.nic_gbs else 0
    floor_ms = max(total_bytes / (device.bandwidth_gbs * 1e9), compute_s, link_s, nic_s) * 1e3
    return Cost(tokens, total_bytes, total_flops, floor_ms, peak_bytes(plan, tokens), hit, stages)


def _io_bytes(plan: Plan, stage: Stage, table: dict[str, int], rows: int) -> float:
    size = _scale_only_bytes if isinstance(stage, Convert) else tensor_bytes
    moved = sum(size(edge.type, table, rows) for _, edge in plan.inputs(stage.name))
    moved += sum(size(t, table, rows) for t in stage.outputs.values())
    moved += sum(2 * tensor_bytes(t, table, rows) for t in stage.scratch.values())  # out, in
    return moved


def _scale_only_bytes(tensor: TensorType, table: dict[str, int], rows: int | None) -> float:
    """Bytes of `tensor`'s scales alone: what a converter reads and writes."""
    return tensor_bytes(tensor, table, rows) - tensor_bytes(tensor.with_scale(None), table, rows)


def _weights_touched(stage: Stage, table: dict[str, int], hit: float) -> float:
    total = 0.0
    for weight in stage.weights.values():
        grouped = isinstance(stage, Gemm) and weight.shape[0] == "E"
        if weight.shape[0] == "V":  # the hash table: one row read per token, at most V rows
            total += weight_bytes(weight, table, min(table["T"], table["V"]))
            continue
        total += weight_bytes(weight, table, hit if grouped else None)
    return total


def _flops(stage: Stage, layer: Layer, tokens: int, rows: int) -> tuple[float, str]:
    hidden = layer.hidden
    compute = "fp8" if layer.routed.quantized else "bf16"
    if isinstance(stage, Router) or StageKind.router in stage.fused:
        # the fused router is the Triton one, which is always the bf16x3 split
        unfused = isinstance(stage, Router) and stage.precision == RouterPrecision.fp32
        parts = 1 if unfused else 3
        flops = 2.0 * parts * tokens * hidden * layer.routed_experts
        return flops, "bf16" if parts == 3 else "fp32"
    if isinstance(stage, Gemm):
        n, k = stage.n_value, stage.k_value
        return 2.0 * rows * n * k, compute
    if isinstance(stage, SharedExpert):
        shared_compute = "fp8" if layer.shared.quantized else "bf16"
        return 6.0 * tokens * hidden * layer.shared_intermediate, shared_compute
    return 0.0, "none"


def row_padding(plan: Plan, tokens: int) -> int:
    """Contiguous row padding at `tokens` tokens: fixed by the dispatch, or the Triton tile's
    BLOCK_M of the bucket of `tokens`."""
    fixed = plan.stage("dispatch", Dispatch).row_padding if plan.has("dispatch") else None
    if fixed:
        return fixed
    if plan.tiles is not None:
        return plan.tiles.bucket(tokens).block_m
    return 1


def peak_bytes(plan: Plan, tokens: int) -> float:
    """Most bytes of intermediates alive at once: each tensor lives from its producer to its
    last consumer; grouped buffers at their worst-case rows."""
    layer = plan.layer
    table = symbols(layer, tokens)
    order = [s.name for s in plan.order()]
    index = {name: i for i, name in enumerate(order)}
    worst = buffer_rows(layer, tokens, plan.backends.layout, row_padding(plan, tokens))
    lifetimes = []
    for name in order:
        stage = plan.stage(name)
        for tensor, tensor_type in stage.outputs.items():
            last = max(
                (index[c] for c, e in plan.consumers(name) if e.tensor == tensor),
                default=index[name],
            )
            rows = worst if tensor_type.layout is not Layout.row_major else None
            size = tensor_bytes(tensor_type, table, rows)
            if isinstance(stage, Convert):
                # The values alias the converter's input, alive until this step; only the
                # converted scales are new here.
                lifetimes.append(
                    (index[name], index[name], _scale_only_bytes(tensor_type, table, rows))
                )
                lifetimes.append((index[name] + 1, last, size))
            else:
                lifetimes.append((index[name], last, size))
        for tensor_type in stage.scratch.values():  # alive while the stage runs
            lifetimes.append((index[name], index[name], tensor_bytes(tensor_type, table, None)))
    return max(
        (
            sum(size for start, end, size in lifetimes if start <= step <= end)
            for step in range(len(order))
        ),
        default=0.0,
    )
