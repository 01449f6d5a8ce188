"""Renderers of the Triton backend: each stage is one call of a runtime launcher (moec/runtime/
triton_*.py) with the plan's values as literals and the tiles of the token bucket."""

from __future__ import annotations

from moec.codegen.registry import register
from moec.codegen.renderers.common import (
    PDL,
    Call,
    Code,
    StageCode,
    bucket_function,
    call_kwargs,
    kernel_quant,
    shape_doc,
)
from moec.codegen.renderers.torch_stages import dispatch_targets, select_doc, select_options
from moec.plan.build import ONE_LAUNCH_ROUTE
from moec.plan.stages import (
    Activation,
    Combine,
    Dispatch,
    Gemm,
    Quantize,
    Router,
    Select,
    SharedExpert,
)
from moec.vocab import Backend, GemmLayout, StageKind, TopkMethod


def _mn_major(stage) -> dict[str, object]:
    """The option that makes a Triton quantizer write DeepGEMM's scale layout."""
    return {"mn_major_scales": True} if stage.mn_major_scales else {}


def _quant_options(fmt, scale_weight: str | None) -> dict[str, object]:
    """quant, group_size, pow2_scales [, scale: the static input scale] of a launcher call."""
    options: dict[str, object] = dict(kernel_quant(fmt))
    if scale_weight:
        options["scale"] = Code(scale_weight)
    return options


@register(
    Router,
    Backend.triton,
    "stages/triton/router.py.j2",
    runtime=("triton_router", "tiles"),
)
def router(plan, stage: Router) -> StageCode:
    return StageCode(
        "Router logits [T, E] in fp32: x times the fp32 weight's three bf16 parts on the tensor "
        "cores, summed in fp32 (the fp32 GEMM's values up to summation order)."
    )


def _with_router(stage: Select) -> bool:
    return StageKind.router in stage.fused


def _select_template(stage: Select) -> str:
    if stage.topk_method == TopkMethod.hash:
        return "stages/triton/select_hash.py.j2"
    return "stages/triton/gate.py.j2" if _with_router(stage) else "stages/select.py.j2"


def _select_runtime(stage: Select) -> tuple[str, ...]:
    if stage.topk_method == TopkMethod.hash:
        return ("triton_hash", "tiles")
    return ("triton_gate", "tiles") if _with_router(stage) else ("triton_select", "tiles")


@register(Select, Backend.triton, _select_template, runtime=_select_runtime)
def select(plan, stage: Select) -> StageCode:
    if stage.topk_method == TopkMethod.hash:
        options = {"options": select_options(stage, pdl=PDL)}
        return StageCode(select_doc(stage)[:-1] + "; one Triton program per token.", options)
    fields: dict[str, object] = {
        "function": "triton_select.select_topk",
        "bias": "gate_bias" if stage.has_bias else "None",
        "options": select_options(stage, pdl=PDL),
    }
    if not _with_router(stage):
        return StageCode(select_doc(stage)[:-1] + "; one Triton program per token.", fields)
    fields["one_launch"] = stage.one_launch
    tokens = "1 token" if stage.one_launch == 1 else f"up to {stage.one_launch} tokens"
    choice = select_doc(stage)
    return StageCode(
        "Router logits of x in fp32 (the fp32 weight's three bf16 parts on the tensor cores, "
        f"summed in fp32), then {choice[0].lower()}{choice[1:-1]}; one Triton launch at "
        f"{tokens} (the router's last program to finish selects), above the router's launch "
        "then one program per token.",
        fields,
    )


@register(
    Quantize,
    Backend.triton,
    "stages/triton/quantize.py.j2",
    runtime=("triton_permute", "tiles"),
)
def quantize(plan, stage: Quantize) -> StageCode:
    static = "w13_input_scale" if "w13_input_scale" in stage.weights else None
    options = {"config": Code("tiles.PERMUTE"), "pdl": PDL, **_quant_options(stage.format, static)}
    fields = {"call": Call("triton_permute.quantize_rows", ("x",), options)}
    return StageCode(
        f"x [T, H] -> e4m3 [T, H] and its scales ({stage.format.label()}), one Triton pass.",
        fields,
    )


@register(
    Dispatch,
    Backend.triton,
    "stages/triton/dispatch.py.j2",
    runtime=("triton_dispatch", "tiles"),
)
def dispatch(plan, stage: Dispatch) -> StageCode:
    static = "w13_input_scale" if "w13_input_scale" in stage.weights else None
    options: dict[str, object] = {
        "experts": stage.experts,
        "layout": stage.layout,
        "config": Code("tiles.PERMUTE"),
        "route_one_pass": stage.route_one_pass,
    }
    if stage.layout == GemmLayout.contiguous:
        options["block_m"] = stage.row_padding or Code("tiles.bucket(topk_ids.shape[0]).block_m")
    if stage.one_launch:
        options["one_launch"] = stage.one_launch
    if not stage.copy_pdl:
        options["copy_pdl"] = False
    if stage.gather:
        options["gather"] = True
    options["pdl"] = PDL
    if stage.quantize:
        options.update(_quant_options(stage.quantize, static), **_mn_major(stage))
    fields = {
        "targets": dispatch_targets(stage),
        "call": Call("triton_dispatch.dispatch", ("x", "topk_ids"), options),
    }
    quantized = " (quantized)" if stage.quantize else ""
    indices = f"one Triton launch up to {ONE_LAUNCH_ROUTE} assignments, three above"
    if stage.gather:
        rows = " and the token rows quantized once each" if stage.quantize else ""
        then = ", then one pass that quantizes each token row" if stage.quantize else ""
        launches = f"The {stage.layout} layout's indices ({indices}){then}."
        if stage.one_launch:
            launches = (
                f"The {stage.layout} layout's indices{rows} in one Triton launch up to "
                f"{stage.one_launch} assignments (decode); above, the indices ({indices}){then}."
            )
        launches += " No row is copied: the gate/up GEMM reads each row's token (token_of_row)."
    elif stage.one_launch:
        launches = (
            f"The {stage.layout} layout's indices and the token rows{quantized} in it in one "
            f"Triton launch up to {stage.one_launch} assignments (decode); above, the indices "
            f"({indices}), then one pass that reads each token row once and writes it to its "
            "experts' rows."
        )
    else:
        launches = (
            f"The {stage.layout} layout's indices ({indices}), then one pass that reads each "
            f"token row once and writes it{quantized} to its experts' rows."
        )
    return StageCode(launches, fields)


@register(
    Gemm,
    Backend.triton,
    "stages/triton/gemm.py.j2",
    runtime=("triton_gemm", "tiles"),
)
def gemm(plan, stage: Gemm) -> StageCode:
    scaled = f"{stage.weight}_scale" in stage.weights
    fields = {
        "function": f"triton_gemm.grouped_gemm_{stage.layout}",
        "a_scale": "a_scale" if stage.format.quantized else "None",
        "weight": stage.weight,
        "weight_scale": f"{stage.weight}_scale" if scaled else "None",
        "scheme": stage.format.scheme,
        "role": stage.role,
        "bucket": bucket_function(plan),
        "gather": stage.gather,
    }
    rows = shape_doc(stage)
    doc = (
        f"[{rows}, {stage.k}] x [E, {stage.n}, {stage.k}] -> [{rows}, {stage.n}] in one Triton "
        "launch; padding rows and empty experts cost no work."
    )
    if stage.gather:
        doc = (
            f"[M, {stage.k}] x [E, {stage.n}, {stage.k}] -> [M, {stage.n}] in one Triton launch, "
            f"row r of the layout read from a [T, {stage.k}] at routing.token_of_row[r] (no "
            "copy of the tokens into the layout); padding rows and empty experts cost no work."
        )
    return StageCode(doc, fields)


@register(
    Activation,
    Backend.triton,
    "stages/triton/activation.py.j2",
    runtime=("triton_act", "gated_activation", "tiles"),
)
def activation(plan, stage: Activation) -> StageCode:
    static = "w2_input_scale" if "w2_input_scale" in stage.weights else None
    returns = list(stage.outputs)[0]
    quantized = stage.quantize is not None
    fields = {
        "function": f"triton_act.act_quant_{stage.layout}",
        "targets": f"{returns}, {returns}_scale" if quantized else f"{returns}, _",
        "options": call_kwargs(**_quant_options(stage.quantize, static), **_mn_major(stage)),
    }
    rows = shape_doc(stage)
    doc = f"{stage.activation} of [{rows}, 2I] gate|up halves -> [{rows}, I]"
    doc += " e4m3 and scales, one Triton pass." if quantized else ", one Triton pass."
    return StageCode(doc, fields)


@register(
    Combine,
    Backend.triton,
    "stages/triton/combine.py.j2",
    runtime=("triton_combine", "tiles"),
)
def combine(plan, stage: Combine) -> StageCode:
    shared = " + shared[t]" if stage.add_shared else ""
    return StageCode(
        f"out[t] = sum_k w[t, k] * y[row_of[t, k]]{shared}, in fp32, rounded once: one Triton pass.",
        {"shared": "shared" if stage.add_shared else "None"},
    )


@register(
    SharedExpert,
    Backend.triton,
    "stages/triton/shared_expert.py.j2",
    runtime=("triton_shared", "gated_activation", "tiles"),
)
def shared_expert(plan, stage: SharedExpert) -> StageCode:
    fmt = stage.format
    scaled = "shared_w13_scale" in stage.weights
    static = (
        "(shared_w13_input_scale, shared_w2_input_scale)"
        if "shared_w13_input_scale" in stage.weights
        else "None"
    )
    quant = kernel_quant(fmt)
    fields = {
        "w13_scale": "shared_w13_scale" if scaled else "None",
        "w2_scale": "shared_w2_scale" if scaled else "None",
        "options": call_kwargs(
            scheme=fmt.scheme,
            quant=quant["quant"],
            group_size=quant.get("group_size", 128),
            pow2_scales=quant.get("pow2_scales", False),
        ),
        "input_scales": static,
    }
    doc = (
        f"Shared experts: one dense gated MLP of width {stage.intermediate} ({fmt.label()}), run "
        "as a one-expert grouped GEMM with the routed experts' kernels."
    )
    return StageCode(doc, fields)
