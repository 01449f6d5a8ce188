"""The receive side both exchanging dispatches share (all2all over torch.distributed, DeepEP
normal): a received row is a token of this rank whose ids of other ranks' experts are -1, laid
out, multiplied and summed by the same runtime code as one GPU's tokens. Not a backend: the
two renderers call these for their fields and runtime modules."""

from __future__ import annotations

from moec.codegen.renderers.common import DTYPE, PDL, Call, Code, bucket_function
from moec.codegen.renderers.torch_stages import dispatch_targets, route_call
from moec.plan.stages import Combine, Dispatch
from moec.vocab import Backend


def dispatch_fields(plan, stage: Dispatch) -> dict[str, object]:
    """Fields of a dispatch template's receive lines: the token rows' scale argument, the
    experts per rank, the layout's routing call over the received ids, the copy into it."""
    triton = stage.routing_backend == Backend.triton
    bucket = bucket_function(plan)
    return {
        "x_scale": "x_scale" if stage.outputs["a"].scale is not None else "None",
        "local_experts": plan.layer.local_experts,
        "route": route_call(stage, "triton_route" if triton else "grouping", "local_ids", bucket),
        "targets": dispatch_targets(stage),
        "permute": _permute(stage),
    }


def dispatch_runtime(stage: Dispatch) -> tuple[str, ...]:
    """Runtime modules of the receive lines of a dispatch."""
    if stage.routing_backend == Backend.triton:
        return ("grouping", "triton_route", "triton_permute", "tiles")
    return ("grouping",)


def combine_runtime(stage: Combine) -> tuple[str, ...]:
    """Runtime modules of the weighted sums of a combine."""
    return ("triton_combine", "tiles") if stage.reduce_backend == Backend.triton else ("grouping",)


def weighted_rows(stage: Combine, y: str, row_of: str, weights: str, shared: str) -> Call:
    """The call of sum_k weights[r, k] * y[row_of[r, k]] (+ shared[r]), rounded once to the
    model dtype, in the combine's reduce backend."""
    rows = (y, row_of, weights)
    if stage.reduce_backend == Backend.triton:
        config = Code(f"tiles.combine({row_of}.shape[0])")
        return Call(
            "triton_combine.weighted_rows",
            rows,
            {"shared": Code(shared), "config": config, "out_dtype": DTYPE, "pdl": PDL},
        )
    return Call("grouping.weighted_rows", rows, {"shared": Code(shared), "out_dtype": DTYPE})


def _permute(stage: Dispatch) -> Call:
    """The copy of received rows (already in the GEMM's format) and their scales into the
    layout: one Triton launch each where Triton routes, else torch."""
    rows = ("rows", "row_scales", "routing")
    if stage.routing_backend == Backend.triton:
        options = {"experts": stage.experts, "config": Code("tiles.PERMUTE"), "pdl": PDL}
        return Call("triton_permute.permute_rows", rows, options)
    return Call("grouping.permute", rows, {"experts": stage.experts})
