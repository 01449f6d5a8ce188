"""Renderers of torch.distributed: expert parallelism by all_to_all (dispatch and combine) and
the tensor-parallel all-reduce (finalize). The process group is the layer's own (`self.group`)."""

from __future__ import annotations

from moec.codegen.registry import register
from moec.codegen.renderers import received
from moec.codegen.renderers.common import StageCode
from moec.plan.stages import Combine, Dispatch, Finalize
from moec.vocab import Backend


def _dispatch_runtime(stage: Dispatch) -> tuple[str, ...]:
    return ("all2all", *received.dispatch_runtime(stage))


def _combine_runtime(stage: Combine) -> tuple[str, ...]:
    return ("all2all", *received.combine_runtime(stage))


@register(
    Dispatch,
    Backend.torch_distributed,
    "stages/distributed/dispatch.py.j2",
    runtime=_dispatch_runtime,
)
def dispatch(plan, stage: Dispatch) -> StageCode:
    scaled = stage.outputs["a"].scale is not None
    quantized = " (e4m3 and scales)" if scaled else ""
    return StageCode(
        f"Send each token row{quantized} once to every rank owning one of its experts, with its "
        "top-k ids and weights; lay the received rows out by local expert in the "
        f"{stage.layout} layout (ids of other ranks' experts are -1: no row).",
        received.dispatch_fields(plan, stage),
    )


@register(
    Combine,
    Backend.torch_distributed,
    "stages/distributed/combine.py.j2",
    runtime=_combine_runtime,
)
def combine(plan, stage: Combine) -> StageCode:
    shared = "shared" if stage.add_shared else "None"
    plus = " + shared[t]" if stage.add_shared else ""
    return StageCode(
        "Weight and sum each received row's expert outputs here (fp32, rounded once), send the "
        f"partial sums back; out[t] = the sum of t's partials{plus} (fp32, rounded once).",
        {
            "partial": received.weighted_rows(
                stage, "y", "routing.row_of", "exchange.weights", "None"
            ),
            "out": received.weighted_rows(
                stage, "returned", "exchange.returned_row_of", "exchange.returned_weights", shared
            ),
        },
    )


@register(Finalize, Backend.torch_distributed, "stages/distributed/finalize.py.j2")
def finalize(plan, stage: Finalize) -> StageCode:
    return StageCode(
        f"Sum the tensor-parallel ranks' partial outputs (each holds 1/{plan.layer.tp} of every "
        "expert's intermediate)."
    )
