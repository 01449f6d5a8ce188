"""The plan as plain data: the stable JSON structure of `moec explain --format json` and of the
generated package's `plan.json` / `PLAN`.

Top-level keys (pinned by tests/test_explain.py):
    moec_version  str
    spec          {name, hash}
    target        {device, arch, dtype, max_num_tokens, gpu}
    device        {name, bandwidth_gbs, bf16_tflops, fp8_tflops, fp32_tflops, memory_gib,
                   measured, link_gbs, nic_gbs}
    choices       what the plan chose for the whole layer, and the per-rank dims
    stages        [{name, kind, backend, inputs, outputs, weights, scratch, workspace, choices,
                    fused, syncs_host, graph_safe, note}]; choices: the stage kind's own
                    fields; inputs: [{tensor, from, as, type}], outputs / weights / scratch
                    (written and read back within the stage) / workspace (buffers the layer
                    keeps zeroed between calls): [{tensor, type}], type: {dtype, shape,
                    layout, scale?, record?, label}
    decisions     [{what, choice, reason}]
    cost          [{tokens, bytes, flops, floor_ms, peak_bytes, experts_hit,
                    beyond_max_num_tokens (a forward of the package refuses this many),
                    stages: [{stage, bytes, flops, compute, floor_ms, link_bytes,
                    nic_bytes}]}]; past a GEMM split, the cost of the plan above it
    above         null, or with a GEMM split (gemm_backend auto per token bucket) the plan run
                  above `up_to` tokens: {up_to, gemm_backend, stages (those that differ, as
                  in "stages"), decisions (those that differ)}
    placement     (`moec explain` only, not plan.json) {ranks: each rank's logical experts,
                  replica_choice, load: null, or with --load {file, rank_share, imbalance,
                  even_imbalance, floors: [{tokens, slowest_ms, even_ms, uniform_ms}]}}
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from moec.plan import Device, Plan, cost, plan_summary
from moec.plan.stages import choices
from moec.plan.types import TensorType
from moec.version import __version__


def _type(tensor: TensorType) -> dict[str, Any]:
    data = tensor.as_dict()
    data["label"] = tensor.label()
    return data


def plan_data(plan: Plan, spec, device: Device, tokens: list[int]) -> dict[str, Any]:
    stages = _stages(plan)
    summary = plan_summary(plan)
    return {
        "moec_version": __version__,
        "spec": {"name": spec.name, "hash": summary["hash"]},
        "target": spec.target.model_dump(mode="json"),
        "device": asdict(device),
        "choices": summary,
        "stages": stages,
        "decisions": [asdict(d) for d in plan.decisions],
        "cost": [_cost_row(plan, device, t, spec.target.max_num_tokens) for t in tokens],
        "above": _above(plan, stages),
    }


def _cost_row(plan: Plan, device: Device, tokens: int, bound: int) -> dict[str, Any]:
    """The cost model's row at `tokens`, marked where a forward of the package would refuse
    that many tokens (more than target.max_num_tokens: its workspace is sized for that many)."""
    row = cost(plan.at(tokens), device, tokens).as_dict()
    row["beyond_max_num_tokens"] = tokens > bound
    return row


def _above(plan: Plan, stages: list[dict[str, Any]]) -> dict[str, Any] | None:
    """What the plan past a GEMM split runs differently."""
    split = plan.backends.split
    if plan.above is None or split is None:
        return None
    ours = [asdict(d) for d in plan.decisions]
    return {
        "up_to": split.up_to,
        "gemm_backend": plan.above.backends.gemm,
        "stages": [s for s in _stages(plan.above) if s not in stages],
        "decisions": [d for d in (asdict(d) for d in plan.above.decisions) if d not in ours],
    }


def _stages(plan: Plan) -> list[dict[str, Any]]:
    stages = []
    for stage in plan.order():
        stages.append(
            {
                "name": stage.name,
                "kind": stage.kind,
                "backend": stage.backend,
                "inputs": [
                    {"tensor": e.tensor, "from": p, "as": e.input, "type": _type(e.type)}
                    for p, e in plan.inputs(stage.name)
                ],
                "outputs": [{"tensor": n, "type": _type(t)} for n, t in stage.outputs.items()],
                "weights": [{"tensor": n, "type": _type(t)} for n, t in stage.weights.items()],
                "scratch": [{"tensor": n, "type": _type(t)} for n, t in stage.scratch.items()],
                "workspace": [{"tensor": n, "type": _type(t)} for n, t in stage.workspace.items()],
                "choices": dict(sorted(choices(stage).items())),
                "fused": list(stage.fused),
                "syncs_host": stage.syncs_host,
                "graph_safe": stage.graph_safe,
                "note": stage.note,
            }
        )
    return stages
