"""Renderers of DeepEP V1 (expert-parallel dispatch and combine through `deep_ep.Buffer`):
normal mode into the contiguous layout (prefill), low-latency mode into the masked layout
(decode, CUDA-graph safe). The buffer sizes come from the plan (moec/plan/deepep.py)."""

from __future__ import annotations

from moec.codegen.registry import register
from moec.codegen.renderers import received
from moec.codegen.renderers.common import StageCode, call_kwargs
from moec.codegen.renderers.torch_stages import dispatch_targets
from moec.plan.stages import Combine, Dispatch
from moec.vocab import Backend, DispatchMode


def _template(kind: str):
    def choose(stage: Dispatch | Combine) -> str:
        mode = "low_latency" if stage.mode == DispatchMode.deepep_low_latency else "normal"
        return f"stages/deep_ep/{kind}_{mode}.py.j2"

    return choose


def _dispatch_runtime(stage: Dispatch) -> tuple[str, ...]:
    if stage.mode == DispatchMode.deepep_low_latency:
        return ("deepep", "grouping")
    return ("deepep", *received.dispatch_runtime(stage))


def _combine_runtime(stage: Combine) -> tuple[str, ...]:
    if stage.mode == DispatchMode.deepep_low_latency:
        return ("deepep",)
    return ("deepep", *received.combine_runtime(stage))


@register(
    Dispatch,
    Backend.deep_ep,
    _template("dispatch"),
    runtime=_dispatch_runtime,
)
def dispatch(plan, stage: Dispatch) -> StageCode:
    layer, buffer = plan.layer, stage.buffer
    assert buffer is not None, "the plan sizes the buffer of every DeepEP dispatch"
    if stage.mode == DispatchMode.deepep_low_latency:
        quantized = stage.quantize is not None
        options = call_kwargs(
            max_tokens=buffer.max_tokens,
            experts=layer.routed_experts,
            fp8=quantized,
            pow2_scales=stage.quantize is not None and stage.quantize.pow2_scales,
        )
        sizes = call_kwargs(
            rdma_bytes=buffer.rdma_bytes,
            qps=buffer.qps,
            max_tokens=buffer.max_tokens,
            hidden=layer.hidden,
            experts=layer.routed_experts,
        )
        sent = "e4m3 with 1 x 128 scales, quantized by DeepEP" if quantized else "bf16"
        return StageCode(
            f"DeepEP low-latency dispatch: one row per (token, expert) ({sent}) into the masked "
            f"layout [{layer.local_experts}, {layer.ep} x {buffer.max_tokens}, H] of this "
            "rank's experts, with each expert's row count; no host sync.",
            {"buffer": sizes, "options": options, "targets": dispatch_targets(stage)},
        )
    scaled = stage.outputs["a"].scale is not None
    sizes = call_kwargs(
        nvl_bytes=buffer.nvl_bytes,
        rdma_bytes=buffer.rdma_bytes,
        sms=buffer.sms,
        qps=buffer.qps,
        hidden_bytes=layer.hidden * max(layer.dtype.bytes, 2),
    )
    what = " (e4m3 and scales)" if scaled else ""
    return StageCode(
        f"DeepEP normal dispatch: each token row{what} once to every rank owning one of its "
        "experts, with its top-k ids and weights; the received rows laid out by local expert "
        f"in the {stage.layout} layout (ids of other ranks' experts are -1: no row).",
        {"buffer": sizes, **received.dispatch_fields(plan, stage)},
    )


@register(
    Combine,
    Backend.deep_ep,
    _template("combine"),
    runtime=_combine_runtime,
)
def combine(plan, stage: Combine) -> StageCode:
    shared = {"shared": "shared" if stage.add_shared else "None"}
    plus = " + shared[t]" if stage.add_shared else ""
    if stage.mode == DispatchMode.deepep_low_latency:
        return StageCode(
            "DeepEP low-latency combine: every expert output back to its token's rank, weighted "
            f"and summed there (fp32, rounded once){plus}.",
            shared,
        )
    partial = received.weighted_rows(stage, "y", "routing.row_of", "exchange.weights", "None")
    return StageCode(
        "Weight and sum each received row's expert outputs here (fp32, rounded once); DeepEP "
        f"sends the partial sums back and adds them{plus} on the token's rank (fp32, rounded "
        "once).",
        {**shared, "partial": partial},
    )
