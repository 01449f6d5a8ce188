"""Renderers of the torch backend: the reference path, on any device.

Each function fills its stage's template from the stage record; the numerics live in the
runtime modules (torch_select, torch_matmul, grouping, quant), the template only calls them.
"""

from __future__ import annotations

from moec.codegen.registry import register
from moec.codegen.renderers.common import (
    DTYPE,
    PDL,
    Call,
    Code,
    StageCode,
    call_kwargs,
    matmul_binding,
    quantizer_binding,
    shape_doc,
)
from moec.plan.stages import (
    Activation,
    Combine,
    Dispatch,
    Gemm,
    Place,
    Quantize,
    Router,
    Select,
    SharedExpert,
)
from moec.vocab import (
    Backend,
    GemmLayout,
    ReplicaChoice,
    RouterRounding,
    TopkMethod,
    TorchKernel,
)

FUNCTOOLS = ("import functools",)


@register(Router, Backend.torch, "stages/torch/router.py.j2")
def router(plan, stage: Router) -> StageCode:
    return StageCode(
        "Router logits [T, E] in fp32, as the checkpoint's fp32 router computes them.",
        imports=("import torch.nn.functional as F",),
    )


def select_options(stage: Select, **more: object) -> str:
    """The selection's keywords of a select call (and `more`, e.g. pdl)."""
    if stage.rounding != RouterRounding.none:  # to the model dtype
        more = {"rounding": stage.rounding, "round_to": DTYPE, **more}
    if stage.topk_method == TopkMethod.hash:  # the table chooses: no method, groups or bias
        return call_kwargs(
            scoring_func=stage.scoring_func,
            norm_topk_prob=stage.norm_topk_prob,
            routed_scaling_factor=stage.routed_scaling_factor,
            fused_shared=stage.fused_shared,
            **more,
        )
    return call_kwargs(
        scoring_func=stage.scoring_func,
        topk_method=stage.topk_method,
        n_group=stage.n_group,
        topk_group=stage.topk_group,
        top_k=stage.top_k,
        norm_topk_prob=stage.norm_topk_prob,
        routed_scaling_factor=stage.routed_scaling_factor,
        fused_shared=stage.fused_shared,
        **more,
    )


def select_doc(stage: Select) -> str:
    parts = [f"{stage.scoring_func} scores"]
    if stage.topk_method == TopkMethod.hash:
        parts.append("the experts tid2eid[token_id] (the hash table)")
    if stage.topk_method == TopkMethod.noaux_tc:
        parts.append("choice biased by e_score_correction_bias")
    if stage.topk_method != TopkMethod.greedy and stage.n_group > 1:
        parts.append(f"{stage.topk_group} of {stage.n_group} groups kept")
    if stage.norm_topk_prob:
        parts.append("weights renormalized")
    if stage.routed_scaling_factor != 1.0:
        parts.append(f"x{stage.routed_scaling_factor:g}")
    if stage.rounding == RouterRounding.logits:
        parts.append("from the logits rounded to the model dtype")
    elif stage.rounding == RouterRounding.all:
        parts.append("logits, scores and weights rounded to the model dtype step by step")
    if stage.fused_shared:
        parts.append(f"then the {stage.fused_shared} fused shared experts with weight 1")
    return f"Top-{stage.top_k} of {stage.experts} experts: {', '.join(parts)}."


def _select_template(stage: Select) -> str:
    return (
        "stages/torch/select_hash.py.j2"
        if stage.topk_method == TopkMethod.hash
        else "stages/select.py.j2"
    )


@register(Select, Backend.torch, _select_template, runtime=("torch_select",))
def select(plan, stage: Select) -> StageCode:
    if stage.topk_method == TopkMethod.hash:
        return StageCode(select_doc(stage), {"options": select_options(stage)})
    fields = {
        "function": "torch_select.select_topk",
        "bias": "gate_bias" if stage.has_bias else "None",
        "options": select_options(stage),
    }
    return StageCode(select_doc(stage), fields)


def input_scale_arg(stage, weight: str) -> str:
    """`, <weight>` when the stage reads that static input scale, else nothing."""
    return f", {weight}" if weight in stage.weights else ""


@register(Place, Backend.torch, "stages/torch/place.py.j2", runtime=("placement",))
def place(plan, stage: Place) -> StageCode:
    if not stage.mapped:
        mapping, what = "topk_ids", "The ids unchanged (physical = logical)"
    elif stage.replica_choice == ReplicaChoice.static:
        mapping = "placement.static_replicas(topk_ids, replica_of)"
        what = "Each logical id [T, K] to this rank's replica of its expert"
    else:
        mapping = "placement.random_replicas(topk_ids, replica_table, replica_count)"
        what = "Each logical id [T, K] to a replica of its expert picked by a hash of its position"
    doc = f"{what}, of {stage.physical} physical experts for {stage.experts} logical"
    if stage.record_load:
        doc += "; each logical expert's tokens added to expert_counts"
    fields = {"record": stage.record_load, "top_k": stage.top_k, "mapping": mapping}
    return StageCode(doc + ".", fields)


@register(Quantize, Backend.torch, "stages/torch/quantize.py.j2", runtime=("torch_matmul",))
def quantize(plan, stage: Quantize) -> StageCode:
    fmt = stage.format
    name, expression = quantizer_binding(fmt)
    fields = {"quantizer": name, "scale_args": input_scale_arg(stage, "w13_input_scale")}
    return StageCode(
        f"x [T, H] -> e4m3 [T, H] and its scales ({fmt.label()}).",
        fields,
        bindings=((name, expression),),
        imports=FUNCTOOLS if "functools" in expression else (),
    )


def route_call(stage: Dispatch, module: str, ids: str, bucket: str = "bucket") -> Call:
    """The routing call of a dispatch: the layout's indices for `ids` [rows, K] in `module`
    (grouping, or triton_route); `bucket`: the tiles function that picks the row padding's
    bucket from the row count."""
    kwargs: dict[str, object] = {"experts": stage.experts}
    if stage.layout == GemmLayout.contiguous:
        kwargs["block_m"] = stage.row_padding or Code(f"tiles.{bucket}({ids}.shape[0]).block_m")
    if module == "triton_route":
        kwargs.update(one_pass=stage.route_one_pass, pdl=PDL)
    function = "route_masked" if stage.layout == GemmLayout.masked else "route_contiguous"
    return Call(f"{module}.{function}", (ids,), kwargs)


def dispatch_targets(stage: Dispatch) -> str:
    return "a, a_scale" if stage.outputs["a"].scale is not None else "a, _"


@register(Dispatch, Backend.torch, "stages/torch/dispatch.py.j2", runtime=("grouping",))
def dispatch(plan, stage: Dispatch) -> StageCode:
    scaled = stage.outputs["a"].scale is not None
    fields = {
        "route": route_call(stage, "grouping", "topk_ids"),
        "targets": dispatch_targets(stage),
        "x_scale": "x_scale" if scaled else "None",
        "experts": stage.experts,
    }
    return StageCode(
        f"Copy each token's row (and scales) to its rows of the {stage.layout} layout.", fields
    )


def _gemm_template(stage: Gemm) -> str:
    if stage.torch_kernel == TorchKernel.loop:
        return f"stages/torch/gemm_loop_{stage.layout}.py.j2"
    return f"stages/torch/gemm_{stage.torch_kernel}.py.j2"


def a_scale_of(stage: Gemm, rows: str) -> str:
    """The activation scales of `rows` as the matmul takes them."""
    if not stage.format.quantized:
        return "None"
    return "a_scale" if stage.format.group is None else f"a_scale[{rows}]"


@register(Gemm, Backend.torch, _gemm_template, runtime=("torch_matmul",))
def gemm(plan, stage: Gemm) -> StageCode:
    name, expression = matmul_binding(stage.format)
    scaled = f"{stage.weight}_scale" in stage.weights
    rows = shape_doc(stage)
    fields = {
        "n": stage.n_value,
        "weight": stage.weight,
        "weight_scale": f"{stage.weight}_scale[expert]" if scaled else "None",
        "a_scale": a_scale_of(stage, "rows"),
        "matmul": name,
        "padding": plan.stage("dispatch", Dispatch).row_padding,
    }
    doc = (
        f"[{rows}, {stage.k}] x [E, {stage.n}, {stage.k}] -> [{rows}, {stage.n}]: each expert's "
        f"rows times its weight; {stage.note}."
    )
    return StageCode(doc, fields, bindings=((name, expression),), imports=FUNCTOOLS)


def _activation_template(stage: Activation) -> str:
    quantized = "_quant" if stage.quantize is not None else ""
    return f"stages/torch/activation{quantized}.py.j2"


@register(
    Activation, Backend.torch, _activation_template, runtime=("gated_activation", "torch_matmul")
)
def activation(plan, stage: Activation) -> StageCode:
    rows = shape_doc(stage)
    fields: dict[str, object] = {"intermediate": stage.intermediate}
    bindings: tuple = ()
    doc = f"{stage.activation} of [{rows}, 2I] gate|up halves -> [{rows}, I]"
    if stage.quantize is not None:
        name, expression = quantizer_binding(stage.quantize)
        bindings = ((name, expression),)
        fields.update(quantizer=name, scale_args=input_scale_arg(stage, "w2_input_scale"))
        doc += ", quantized for the down GEMM"
    imports = FUNCTOOLS if any("functools" in b[1] for b in bindings) else ()
    return StageCode(doc + ".", fields, bindings=bindings, imports=imports)


@register(Combine, Backend.torch, "stages/torch/combine.py.j2", runtime=("grouping",))
def combine(plan, stage: Combine) -> StageCode:
    shared = " + shared[t]" if stage.add_shared else ""
    return StageCode(
        f"out[t] = sum_k w[t, k] * y[row_of[t, k]]{shared}, in fp32, rounded once.",
        {"shared": "shared" if stage.add_shared else "None"},
    )


def _shared_template(stage: SharedExpert) -> str:
    return (
        "stages/torch/shared_expert_quant.py.j2"
        if stage.format.quantized
        else ("stages/torch/shared_expert.py.j2")
    )


@register(
    SharedExpert,
    Backend.torch,
    _shared_template,
    runtime=("gated_activation", "torch_matmul"),
)
def shared_expert(plan, stage: SharedExpert) -> StageCode:
    fmt = stage.format
    bindings = [matmul_binding(fmt)]
    fields: dict[str, object] = {"intermediate": stage.intermediate, "matmul": bindings[0][0]}
    if fmt.quantized:
        bindings.append(quantizer_binding(fmt))
        fields["quantizer"] = bindings[1][0]
        scaled = "shared_w13_scale" in stage.weights
        fields.update(
            w13_scale="shared_w13_scale" if scaled else "None",
            w2_scale="shared_w2_scale" if scaled else "None",
            w13_input=input_scale_arg(stage, "shared_w13_input_scale"),
            w2_input=input_scale_arg(stage, "shared_w2_input_scale"),
        )
    doc = f"Shared experts: one dense gated MLP of width {stage.intermediate} ({fmt.label()})."
    return StageCode(doc, fields, bindings=tuple(bindings), imports=FUNCTOOLS)
