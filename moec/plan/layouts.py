"""Sizes of the two grouped-GEMM layouts, as functions of the token count.

contiguous: rows grouped by expert and padded per expert to `block_m`; its worst case over all
routings bounds the buffers. masked: `[E, max_m, cols]`, graph-static, memory grows with E.
"""

from __future__ import annotations

from moec.plan.layer import Layer


def compact_rows(assignments: int, experts: int, block_m: int) -> int:
    """Most padded rows any routing of `assignments` rows over `experts` can need.

    Each non-empty expert wastes at most block_m - 1 rows of padding; the worst case fills as
    many experts as possible with one row each and packs the rest in whole blocks.
    """
    nonempty = min(assignments, experts)
    return block_m * (nonempty + (assignments - nonempty) // block_m)


def masked_max_m(tokens: int) -> int:
    """Rows per expert of the masked layout: every token could pick one expert, padded up."""
    return (tokens // 256 + 1) * 256


def masked_peak_bytes(layer: Layer, tokens: int) -> int:
    """Peak bytes of the masked layout's three live phases at `tokens` tokens on this rank.

    gate/up: input + its scales + [max_m, 2I] output; activation: [max_m, 2I] in + quantized
    [max_m, I] out; down: quantized input + [max_m, H] output. The largest phase, per expert row.
    As seed 000's `_estimate_masked_standard_layout_peak_bytes`, whose token count is the rows
    the runner receives: with expert parallelism an expert can receive the tokens of all ep
    ranks, so max_m covers ep * tokens (DeepEP low-latency's [E/ep, ep * T, H] buffers).
    """
    hidden, inter = layer.hidden, layer.intermediate
    quantized = layer.routed.quantized
    act_bytes = 1 if quantized else layer.dtype.bytes
    out_bytes = layer.dtype.bytes
    scale_bytes = 1 if layer.routed.pow2_scales else 4
    group = layer.routed.group or 0
    in_scale = (-(-hidden // group) * scale_bytes) if quantized and group else 0
    down_scale = (-(-inter // group) * scale_bytes) if quantized and group else 0
    gate_up_row = 2 * inter * out_bytes
    down_in_row = inter * act_bytes
    peak_row = max(
        hidden * act_bytes + in_scale + gate_up_row,
        gate_up_row + down_in_row + down_scale,
        down_in_row + down_scale + hidden * out_bytes,
    )
    return layer.grouped_experts * masked_max_m(tokens * layer.ep) * peak_row
