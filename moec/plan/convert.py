"""Pass: insert a converter wherever a producer writes a type its consumer does not accept.

Converters are explicit stages (transpose scales to MN-major, pad them for TMA, round up and
pack UE8M0 four per int32), so their cost shows in the plan and no backend hides one.
"""

from __future__ import annotations

from moec.plan.graph import Plan
from moec.plan.stages import Convert
from moec.plan.types import DType, TensorType
from moec.vocab import Backend, ConvertStep, ScaleMajor


def insert_converters(plan: Plan) -> None:
    """Pass: a converter stage on every edge whose type the consumer does not accept."""
    for consumer in [stage.name for stage in plan.order()]:
        stage = plan.stage(consumer)
        for producer, edge in plan.inputs(consumer):
            wanted = stage.accepts.get(edge.input)
            if wanted is None or wanted == edge.type:
                continue
            _insert(plan, producer, consumer, edge.tensor, edge.type, wanted, edge.input)


def conversion_steps(have: TensorType, want: TensorType) -> list[ConvertStep]:
    """What turns `have` into `want`; raises if only the scales may differ but more does."""
    if (have.dtype, have.shape, have.layout) != (want.dtype, want.shape, want.layout):
        raise ValueError(f"planner bug: cannot convert {have.label()} to {want.label()}")
    steps = []
    hs, ws = have.scale, want.scale
    if hs is None or ws is None or hs.granularity != ws.granularity:
        raise ValueError(f"planner bug: scale {hs} cannot become {ws}")
    if ws.pow2_scales and not hs.pow2_scales:
        steps.append(ConvertStep.round_pow2)
    if ws.major != hs.major:
        steps.append(
            ConvertStep.to_mn_major if ws.major == ScaleMajor.MN else ConvertStep.to_k_major
        )
    if ws.tma_aligned and not hs.tma_aligned:
        steps.append(ConvertStep.pad_tma)
    if ws.dtype is DType.ue8m0x4 and hs.dtype is not DType.ue8m0x4:
        steps.append(ConvertStep.pack_ue8m0)
    return steps


def _insert(plan: Plan, producer: str, consumer: str, tensor: str, have, want, input_name) -> None:
    name = f"convert_{tensor}_for_{consumer}"
    steps = conversion_steps(have, want)
    converted = f"{tensor}_{consumer}"
    plan.add_stage(
        Convert(
            name=name,
            backend=Backend.torch,
            steps=tuple(steps),
            outputs={converted: want},
            note="; ".join(steps),
            origin=plan.stage(consumer).origin,
        )
    )
    edges = plan.graph.edges[producer, consumer]["tensors"]
    edges[:] = [e for e in edges if e.tensor != tensor]
    if not edges:
        plan.graph.remove_edge(producer, consumer)
    plan.connect(producer, name, tensor, "a")
    plan.connect(name, consumer, converted, input_name)
    plan.decide(
        f"convert {tensor} for {consumer}",
        "; ".join(steps),
        f"{plan.stage(consumer).backend} reads {want.scale.label()} scales; "
        f"{plan.stage(producer).name} writes {have.scale.label()}",
    )
