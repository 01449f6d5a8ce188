"""The flat context the templates render: plain values computed from the plan, nothing decided.

Every stage becomes a dict (template path, name, params); the forward becomes a list of call
lines; weights become (name, shape, dtype) rows. Names come from the plan's validated tensor and
stage names; numbers and strings from the spec reach templates only as values for `lit`.
"""

from __future__ import annotations

from typing import Any

from moec import __version__
from moec.plan import Plan, facts
from moec.plan.activations import lower
from moec.plan.facts import QuantFormat
from moec.plan.sizes import dim, symbols
from moec.plan.types import TensorType
from moec.spec.models import Spec

BACKEND_FOLDER = {"torch": "torch", "triton": "triton", "torch.distributed": "dist"}
KERNEL_SCHEME = {"fp8_per_tensor": "fp8_tensor"}
KERNELS = (
    "kernels/act_quant.py.j2",
    "kernels/combine.py.j2",
    "kernels/grouped_gemm.py.j2",
    "kernels/grouped_gemm_tma.py.j2",
    "kernels/numerics.py.j2",
    "kernels/permute_quant.py.j2",
    "kernels/route.py.j2",
)
FORMAT_CLASS = {
    "bf16": "Bf16",
    "fp8_per_tensor": "Fp8PerTensor",
    "fp8_block": "Fp8Block",
    "mxfp8": "Mxfp8",
    "mxfp4": "Mxfp4",
}


def format_context(fmt: QuantFormat, spec: Spec, dtype: str) -> dict[str, Any]:
    checkpoint_quantized = fmt.quantized and spec.quant.checkpoint == "quantized"
    return {
        "scheme": fmt.scheme,
        "quantized": fmt.quantized,
        "group": fmt.group,
        "pow2": fmt.pow2_scales,
        "block": list(fmt.weight_block) if fmt.weight_block else None,
        "label": fmt.label(),
        "class_name": FORMAT_CLASS[fmt.scheme],
        "static": fmt.scheme == "fp8_per_tensor" and spec.quant.activation_scheme == "static",
        "checkpoint_quantized": checkpoint_quantized,
        "quantize_on_load": fmt.quantized and not checkpoint_quantized,
        "source_dtype": "bf16",
        "value_dtype": {"bf16": dtype, "mxfp4": "uint8"}.get(fmt.scheme, "float8_e4m3fn"),
        "pack": 2 if fmt.scheme == "mxfp4" else 1,
    }


def build_context(plan: Plan, spec: Spec, plan_json: str) -> dict[str, Any]:
    f = facts(plan)
    dtype = f.dtype.torch
    routed = format_context(f.routed, spec, dtype)
    shared = format_context(f.shared, spec, dtype)
    formats = [routed] + ([shared] if f.n_shared and shared["scheme"] != routed["scheme"] else [])
    dims = {
        "hidden": f.hidden,
        "intermediate": f.intermediate,
        "full_intermediate": f.intermediate * f.tp,
        "routed_experts": f.routed_experts,
        "local_experts": f.local_experts,
        "grouped_experts": f.grouped_experts,
        "top_k": f.top_k,
        "grouped_top_k": f.grouped_top_k,
        "n_shared": f.n_shared,
        "shared_intermediate": f.shared_intermediate,
        "tp": f.tp,
        "ep": f.ep,
        "world": f.tp * f.ep,
    }
    act = spec.activation
    act_params = {k: v for k, v in act.model_dump().items() if k != "kind"}
    uses_triton = plan.facts["gemm_backend"] == "triton"
    stages = [
        stage_context(plan, s, f, routed, shared)
        for s in plan.order()
        if s.kind not in ("input", "output")
    ]
    uses_quant = any(fmt["quantized"] for fmt in formats)
    uses_torch_matmul = any(
        s["backend"] == "torch" and s["kind"] in ("gemm", "shared_expert", "quantize")
        for s in stages
    )
    return {
        "version": __version__,
        "name": spec.name,
        "hash": plan.facts["hash"],
        "description": spec.description,
        "pipeline": " -> ".join(s["name"] for s in stages),
        "dims": dims,
        "dtype": dtype,
        "device": f.device,
        "layout": plan.facts["layout"],
        "block_m": plan.facts["block_m"],
        "distributed": f.tp * f.ep > 1,
        "stages": stages,
        "calls": forward_calls(plan),
        "act_torch": list(lower(act.kind, act_params, "torch").lines),
        "act_triton": list(lower(act.kind, act_params, "triton").lines),
        "has_bias": spec.router.topk_method == "noaux_tc",
        "routed": routed,
        "shared": shared,
        "formats": formats,
        "format_schemes": [fmt["scheme"] for fmt in formats],
        "matmul_formats": formats,
        "fused_shared": f.fused_shared,
        "any_quantized_checkpoint": any(fmt["checkpoint_quantized"] for fmt in formats),
        "uses_e2m1": any(fmt["scheme"] == "mxfp4" for fmt in formats),
        "parameters": parameters(plan),
        "stage_imports": [_imports(uses_triton, uses_torch_matmul and uses_quant)],
        "uses_quant": uses_quant,
        "uses_triton": uses_triton,
        "uses_torch_matmul": uses_torch_matmul,
        "buckets": plan.facts.get("buckets", []),
        "buckets_source": _decision(plan, "triton tiles"),
        "elementwise": plan.facts.get("elementwise", {}),
        "kernels": list(KERNELS),
        "activation_kind": act.kind,
        "activation_lines": list(lower(act.kind, act_params, "triton").lines),
        "plan_json": plan_json,
    }


def stage_context(plan: Plan, stage, f, routed, shared) -> dict[str, Any]:
    folder = BACKEND_FOLDER.get(stage.backend, stage.backend)
    kind = stage.kind
    params: dict[str, Any] = dict(stage.params)
    rows = "M" if plan.facts["layout"] == "contiguous" else "E, max_m"
    if kind == "select":
        params["has_bias"] = "gate_bias" in stage.weights
        params["per_group"] = params["experts"] // params["n_group"]
        params["summary"] = _select_summary(params)
    elif kind == "quantize":
        params["static"] = "w13_input_scale" in stage.weights
    elif kind == "dispatch":
        a_type = stage.outputs["a"]
        params["quantized"] = a_type.scale is not None
        params["per_tensor"] = a_type.scale is not None and a_type.scale.granularity == "per-tensor"
        params.update(group=routed["group"], pow2=routed["pow2"], static=routed["static"])
    elif kind == "gemm":
        weight = next(name for name in stage.weights if not name.endswith("_scale"))
        fmt = routed
        n_value = 2 * f.intermediate if params["n"] == "2I" else f.hidden
        params.update(
            quantized=fmt["quantized"],
            per_tensor=fmt["quantized"] and fmt["group"] is None,
            scaled_weight=f"{weight}_scale" in stage.weights,
            weight=weight,
            rows=rows,
            kernel_scheme=KERNEL_SCHEME.get(fmt["scheme"], fmt["scheme"]),
            bucket_slot=2 if params["n"] == "2I" else 3,
            n_value=n_value,
            grouped_mm=params.get("torch_kernel") == "grouped_mm",
            batched=params.get("torch_kernel") == "bmm",
        )
    elif kind == "activation":
        params.update(
            quantized=routed["quantized"],
            group=routed["group"],
            pow2=routed["pow2"],
            static="w2_input_scale" in stage.weights,
            format=routed["scheme"],
            rows=rows,
        )
    elif kind == "shared_expert":
        params.update(
            quantized=shared["quantized"],
            static=shared["static"],
            scaled_weight="shared_w13_scale" in stage.weights,
            group=shared["group"],
            pow2=shared["pow2"],
            kernel_scheme=KERNEL_SCHEME.get(shared["scheme"], shared["scheme"]),
        )
    template = f"stages/{folder}/{kind}.py.j2"
    return {
        "name": stage.name,
        "kind": kind,
        "backend": stage.backend,
        "template": template,
        "params": params,
    }


def _imports(kernels: bool, quant: bool) -> str:
    names = [name for name, used in (("kernels", kernels), ("quant", quant)) if used]
    return f"from . import {', '.join(names)}" if names else ""


def _decision(plan: Plan, what: str) -> str:
    found = plan.decision(what)
    return found.reason if found else ""


def _select_summary(p: dict[str, Any]) -> str:
    parts = [f"{p['scoring_func']} scores"]
    if p["topk_method"] == "noaux_tc":
        parts.append("choice biased by e_score_correction_bias")
    if p["n_group"] > 1:
        parts.append(f"{p['topk_group']} of {p['n_group']} groups kept")
    if p["norm_topk_prob"]:
        parts.append("weights renormalized")
    if p["weight_scale"] != 1.0:
        parts.append(f"x{p['weight_scale']:g}")
    return ", ".join(parts)


def _names(tensor: str, tensor_type: TensorType) -> list[str]:
    return [tensor, f"{tensor}_scale"] if tensor_type.scale is not None else [tensor]


def forward_calls(plan: Plan) -> list[str]:
    """One line per stage: `outputs = stages.name(inputs, self.weights)`."""
    lines = []
    for stage in plan.order():
        if stage.kind in ("input", "output"):
            continue
        args = []
        for _, edge in plan.inputs(stage.name):
            args += _names(edge.tensor, edge.type)
        args += [f"self.{name}" for name in stage.weights]
        if stage.backend == "torch.distributed":
            args.append("self.group")
        outputs = []
        for tensor, tensor_type in stage.outputs.items():
            outputs += _names(tensor, tensor_type)
        lines.append(f"{', '.join(outputs)} = stages.{stage.name}({', '.join(args)})")
    return lines


def parameters(plan: Plan) -> list[dict[str, Any]]:
    """(name, shape, dtype) of every weight, with this rank's sizes."""
    f = facts(plan)
    rows = []
    for stage in plan.order():
        table = symbols(f, 0)
        # "E" of the grouped GEMMs' weights is this rank's experts (with fused shared experts);
        # elsewhere (the router) it is every routed expert.
        table["E"] = f.grouped_experts if stage.kind == "gemm" else f.routed_experts
        for name, tensor_type in stage.weights.items():
            shape = [dim(d, table) for d in tensor_type.shape]
            rows.append({"name": name, "shape": shape, "dtype": tensor_type.dtype.torch})
    return rows
