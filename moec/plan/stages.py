"""Build the unfused stage graph of one spec: what the layer computes, stage by stage.

Each stage gets its output types and the weights it reads; later passes fuse stages and insert
converters. Types use symbolic shapes: T tokens, H hidden, E experts, K top-k, I intermediate,
M rows of the grouped layout (contiguous) or E x max_m (masked), Is the shared intermediate.
"""

from __future__ import annotations

from moec.plan.backends import accepted_scale
from moec.plan.facts import Facts, QuantFormat
from moec.plan.graph import Plan, Stage
from moec.plan.resolve import Resolved
from moec.plan.types import DType, Layout, ScaleType, TensorType
from moec.spec.models import Spec

FP32, I32 = DType.float32, DType.int32


def weight_types(
    fmt: QuantFormat, experts: str | None, n: str, k: str, dtype: DType
) -> tuple[TensorType, TensorType | None]:
    """Type of a weight [experts?, n, k] in `fmt`, and of its scale (None if unscaled)."""
    lead = (experts,) if experts else ()
    if not fmt.quantized:
        return TensorType(dtype, (*lead, n, k)), None
    if fmt.scheme == "mxfp4":
        value = TensorType(DType.e2m1x2, (*lead, n, f"{k}/2"))
    else:
        value = TensorType(DType.e4m3, (*lead, n, k))
    if fmt.scheme == "fp8_per_tensor":
        return value, TensorType(FP32, (*lead, "1"))
    bn, bk = fmt.weight_block or (1, 1)
    scale_shape = (*lead, n if bn == 1 else f"{n}/{bn}", f"{k}/{bk}")
    return value, TensorType(FP32, scale_shape)


def grouped_type(
    dtype: DType, cols: str, layout: str, scale: ScaleType | None = None
) -> TensorType:
    if layout == "masked":
        return TensorType(dtype, ("E", "max_m", cols), Layout.masked, scale)
    return TensorType(dtype, ("M", cols), Layout.contiguous, scale)


def build_stages(spec: Spec, facts: Facts, resolved: Resolved) -> Plan:
    import networkx as nx

    plan = Plan(nx.DiGraph())
    gemm, layout = resolved.gemm_backend, resolved.layout
    routed, dtype = facts.routed, facts.dtype
    static = spec.quant.activation_scheme == "static"
    input_scale = TensorType(FP32, ("1",))
    x_type = TensorType(dtype, ("T", "H"))

    plan.add_stage(Stage("input", "input", "-", outputs={"x": x_type}))

    plan.add_stage(
        Stage(
            "router",
            "router",
            "torch",
            params={"experts": facts.routed_experts},
            outputs={"logits": TensorType(FP32, ("T", "E"))},
            weights={"gate_weight": TensorType(FP32, ("E", "H"))},
            note="fp32 GEMM, as the checkpoint's fp32 router computes it",
        )
    )
    plan.connect("input", "router", "x")

    router = spec.router
    select_weights = {}
    if router.topk_method == "noaux_tc":
        select_weights["gate_bias"] = TensorType(FP32, ("E",))
    plan.add_stage(
        Stage(
            "select",
            "select",
            "triton" if gemm == "triton" else "torch",
            params={
                "scoring_func": router.scoring_func,
                "topk_method": router.topk_method,
                "n_group": router.n_group,
                "topk_group": router.topk_group,
                "norm_topk_prob": router.norm_topk_prob,
                "top_k": facts.top_k,
                "experts": facts.routed_experts,
                "weight_scale": 1.0,
                "fused_shared": facts.n_shared if facts.fused_shared else 0,
            },
            outputs={
                "topk_weights": TensorType(FP32, ("T", "K")),
                "topk_ids": TensorType(I32, ("T", "K")),
            },
            weights=select_weights,
        )
    )
    plan.connect("router", "select", "logits")

    if facts.n_shared and not facts.fused_shared:
        _shared_expert(plan, facts, gemm, static)

    expert_input = "input"
    expert_tensor = "x"
    if routed.quantized:
        plan.add_stage(
            Stage(
                "quantize",
                "quantize",
                gemm,
                params={"format": routed.scheme, "group": routed.group, "pow2": routed.pow2_scales},
                outputs={"xq": TensorType(DType.e4m3, ("T", "H"), scale=routed.activation_scale())},
                weights={"w13_input_scale": input_scale} if static else {},
            )
        )
        plan.connect("input", "quantize", "x")
        expert_input, expert_tensor = "quantize", "xq"

    a_type = plan.stage(expert_input).outputs[expert_tensor]
    routing_type = TensorType(
        I32,
        ("M",) if layout == "contiguous" else ("E",),
        Layout.masked if layout == "masked" else Layout.contiguous,
    )
    dispatch_backend = resolved.dispatch_backend
    if facts.dispatch == "local" and gemm == "triton":
        dispatch_backend = "triton"
    plan.add_stage(
        Stage(
            "dispatch",
            "dispatch",
            dispatch_backend,
            params={"layout": layout, "mode": facts.dispatch},
            outputs={
                "a": grouped_type(a_type.dtype, "H", layout, a_type.scale),
                "routing": routing_type,
                **({"exchange": TensorType(I32, ("T*K",))} if facts.dispatch != "local" else {}),
            },
            syncs_host=facts.dispatch in ("all2all", "deepep_normal"),
            graph_safe=facts.dispatch not in ("all2all", "deepep_normal"),
        )
    )
    plan.connect(expert_input, "dispatch", expert_tensor, "x")
    plan.connect("select", "dispatch", "topk_ids")

    w13, w13_scale = weight_types(routed, "E", "2I", "H", dtype)
    w2, w2_scale = weight_types(routed, "E", "H", "I", dtype)
    _gemm(
        plan,
        "gemm_gate_up",
        gemm,
        facts,
        routed,
        "h",
        "2I",
        layout,
        dtype,
        ("w13", w13, w13_scale),
    )
    plan.connect("dispatch", "gemm_gate_up", "a")
    plan.connect("dispatch", "gemm_gate_up", "routing")

    act = spec.activation
    act_params = {k: v for k, v in act.model_dump().items() if k != "kind"}
    plan.add_stage(
        Stage(
            "activation",
            "activation",
            gemm,
            params={"kind": act.kind, "values": act_params},
            outputs={"g": grouped_type(FP32 if routed.quantized else dtype, "I", layout)},
        )
    )
    plan.connect("gemm_gate_up", "activation", "h")
    plan.connect("dispatch", "activation", "routing")
    down_input = ("activation", "g")
    if routed.quantized:
        plan.add_stage(
            Stage(
                "quantize_down",
                "quantize",
                gemm,
                params={"format": routed.scheme, "group": routed.group, "pow2": routed.pow2_scales},
                outputs={"hq": grouped_type(DType.e4m3, "I", layout, routed.activation_scale())},
                weights={"w2_input_scale": input_scale} if static else {},
            )
        )
        plan.connect("activation", "quantize_down", "g")
        down_input = ("quantize_down", "hq")

    _gemm(plan, "gemm_down", gemm, facts, routed, "y", "H", layout, dtype, ("w2", w2, w2_scale))
    plan.connect(down_input[0], "gemm_down", down_input[1], "a")
    plan.connect("dispatch", "gemm_down", "routing")

    plan.add_stage(
        Stage(
            "combine",
            "combine",
            resolved.dispatch_backend if facts.dispatch != "local" else dispatch_backend,
            params={"mode": facts.dispatch, "layout": layout, "add_shared": False},
            outputs={"routed": x_type},
            syncs_host=facts.dispatch in ("all2all",),
            graph_safe=facts.dispatch not in ("all2all", "deepep_normal"),
        )
    )
    plan.connect("gemm_down", "combine", "y")
    plan.connect("select", "combine", "topk_weights")
    plan.connect("dispatch", "combine", "routing")
    if facts.dispatch != "local":
        plan.connect("dispatch", "combine", "exchange")

    plan.add_stage(
        Stage(
            "finalize",
            "finalize",
            "torch.distributed" if facts.tp > 1 else "torch",
            params={
                "routed_scaling_factor": router.routed_scaling_factor,
                "add_shared": plan.has("shared_expert"),
                "all_reduce": facts.tp > 1,
            },
            outputs={"out": x_type},
        )
    )
    plan.connect("combine", "finalize", "routed")
    if plan.has("shared_expert"):
        plan.connect("shared_expert", "finalize", "shared")

    plan.add_stage(Stage("output", "output", "-"))
    plan.connect("finalize", "output", "out")
    return plan


# How the torch backend runs a grouped GEMM, and what it costs the host: (note, syncs host).
TORCH_GEMM = {
    "loop": (
        "per-expert loop over the rows each expert received (host sync for the counts)",
        True,
    ),
    "grouped_mm": ("torch._grouped_mm over the padded groups: one launch, no host sync", False),
    "bmm": ("torch.bmm over all experts of the masked layout: one launch, no host sync", False),
}


def torch_gemm_kernel(device: str, fmt: QuantFormat, dtype: DType, layout: str) -> str:
    """The torch backend's grouped GEMM: torch's own grouped kernels for bf16 on CUDA, else a
    per-expert loop (which dequantizes fp8 / mx weights one expert at a time)."""
    if device == "cuda" and not fmt.quantized and dtype is DType.bfloat16:
        return "grouped_mm" if layout == "contiguous" else "bmm"
    return "loop"


def _gemm(plan, name, backend, facts, fmt, out_name, n, layout, dtype, weight) -> None:
    attr, w_type, scale_type = weight
    weights = {attr: w_type}
    if scale_type is not None:
        weights[f"{attr}_scale"] = scale_type
    a_scale = fmt.activation_scale()
    a_dtype = DType.e4m3 if fmt.quantized else dtype
    k = "H" if n != "H" else "I"
    params = {"format": fmt.scheme, "layout": layout, "n": n, "k": k}
    note, syncs = "", False
    if backend == "torch":
        params["torch_kernel"] = torch_gemm_kernel(facts.device, fmt, dtype, layout)
        note, syncs = TORCH_GEMM[params["torch_kernel"]]
    plan.add_stage(
        Stage(
            name,
            "gemm",
            backend,
            params=params,
            accepts={
                "a": grouped_type(a_dtype, k, layout, accepted_scale(backend, facts.arch, a_scale))
            },
            outputs={out_name: grouped_type(dtype, n, layout)},
            weights=weights,
            graph_safe=not syncs,
            syncs_host=syncs,
            note=note,
        )
    )


def _shared_expert(plan: Plan, facts: Facts, gemm: str, static: bool) -> None:
    fmt = facts.shared
    w13, w13_scale = weight_types(fmt, None, "2Is", "H", facts.dtype)
    w2, w2_scale = weight_types(fmt, None, "H", "Is", facts.dtype)
    weights = {"shared_w13": w13}
    if w13_scale is not None:
        weights["shared_w13_scale"] = w13_scale
    weights["shared_w2"] = w2
    if w2_scale is not None:
        weights["shared_w2_scale"] = w2_scale
    if static:
        weights["shared_w13_input_scale"] = TensorType(FP32, ("1",))
        weights["shared_w2_input_scale"] = TensorType(FP32, ("1",))
    plan.add_stage(
        Stage(
            "shared_expert",
            "shared_expert",
            gemm,
            params={
                "format": fmt.scheme,
                "experts": facts.n_shared,
                "intermediate": facts.shared_intermediate,
            },
            outputs={"shared": TensorType(facts.dtype, ("T", "H"))},
            weights=weights,
            note=f"dense gated MLP of width {facts.shared_intermediate}, {fmt.label()}",
        )
    )
    plan.connect("input", "shared_expert", "x")
