"""Renderers of torch.distributed: expert parallelism by all_to_all (dispatch and combine) and
the tensor-parallel all-reduce (finalize). The process group is the layer's own (`self.group`)."""

from __future__ import annotations

from moec.codegen.registry import register
from moec.codegen.renderers.common import StageCode
from moec.codegen.renderers.torch_stages import dispatch_targets, route_call
from moec.plan.stages import Combine, Dispatch, Finalize


def _dispatch_runtime(stage: Dispatch) -> tuple[str, ...]:
    if stage.routing_backend == "triton":
        return ("all2all", "grouping", "triton_route", "tiles")
    return ("all2all", "grouping")


def _all2all_only(plan, stage) -> str | None:
    if stage.mode != "all2all":
        return f"torch.distributed renders the all2all dispatch, not {stage.mode}"
    return None


@register(
    "dispatch",
    "torch.distributed",
    "stages/distributed/dispatch.py.j2",
    runtime=_dispatch_runtime,
    refuses=_all2all_only,
)
def dispatch(plan, stage: Dispatch) -> StageCode:
    scaled = stage.outputs["a"].scale is not None
    module = "triton_route" if stage.routing_backend == "triton" else "grouping"
    fields = {
        "x_scale": "x_scale" if scaled else "None",
        "local_experts": plan.layer.local_experts,
        "route": route_call(stage, module, "local_ids.view(-1, 1)"),
        "targets": dispatch_targets(stage),
        "experts": stage.experts,
    }
    quantized = " (e4m3 and scales)" if scaled else ""
    return StageCode(
        f"Send each token row{quantized} once to every rank owning one of its experts, with its "
        "top-k ids and weights; lay out this rank's assignments by local expert in the "
        f"{stage.layout} layout.",
        fields,
    )


@register(
    "combine",
    "torch.distributed",
    "stages/distributed/combine.py.j2",
    runtime=("all2all",),
    refuses=_all2all_only,
)
def combine(plan, stage: Combine) -> StageCode:
    shared = " + shared[t]" if stage.add_shared else ""
    return StageCode(
        "Weight and sum each received row's expert outputs here (fp32), send the partial sums "
        f"back in the model dtype; out[t] = the sum of t's partials{shared}, rounded once.",
        {"shared": "shared" if stage.add_shared else "None"},
    )


@register("finalize", "torch.distributed", "stages/distributed/finalize.py.j2")
def finalize(plan, stage: Finalize) -> StageCode:
    return StageCode(
        f"Sum the tensor-parallel ranks' partial outputs (each holds 1/{plan.layer.tp} of every "
        "expert's intermediate)."
    )
