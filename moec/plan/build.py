"""Pass: the unfused stage graph of one layer, what it computes stage by stage.

Each stage gets its record (moec/plan/stages.py), its output types and the weights it reads;
later passes fuse stages and insert converters. Types use symbolic shapes: T tokens, H hidden,
E experts, K top-k, I intermediate, M rows of the grouped layout (contiguous) or E x max_m
(masked), Is the shared intermediate.
"""

from __future__ import annotations

from dataclasses import replace

from moec.plan import deepep, placement
from moec.plan.backends import accepted_scale
from moec.plan.graph import Plan
from moec.plan.layer import Layer, QuantFormat
from moec.plan.stages import (
    Activation,
    Combine,
    Dispatch,
    Finalize,
    Gemm,
    Input,
    Output,
    Place,
    Quantize,
    Router,
    Select,
    SharedExpert,
)
from moec.plan.types import DType, Layout, ScaleType, TensorType
from moec.spec.models import Spec
from moec.vocab import (
    Backend,
    DeviceKind,
    DispatchMode,
    GemmLayout,
    GemmRole,
    ReplicaChoice,
    RouterPrecision,
    RouterRounding,
    ScaleMajor,
    Scheme,
    ScoringFunc,
    TopkMethod,
    TorchKernel,
)

FP32, I32 = DType.float32, DType.int32
ROW_PADDING = 128
"""Contiguous row padding of the torch and deep_gemm backends (DeepGEMM's M alignment), so the
torch backend builds exactly the buffers a DeepGEMM GEMM would take."""

ROUTING_RECORD = {
    GemmLayout.contiguous: "ContiguousRouting",
    GemmLayout.masked: "MaskedRouting",
}
EXCHANGE_RECORD = {
    DispatchMode.all2all: "Exchange",
    DispatchMode.deepep_normal: "NormalExchange",
    DispatchMode.deepep_low_latency: "LowLatencyExchange",
}
"""What dispatch hands combine about the exchange, per mode (the runtime's record class)."""

# How the torch backend runs a grouped GEMM, and what it costs the host: (note, syncs host).
TORCH_GEMM = {
    TorchKernel.loop: (
        "per-expert loop over the rows each expert received (host sync for the counts)",
        True,
    ),
    TorchKernel.grouped_mm: (
        "torch._grouped_mm over the padded groups: one launch, no host sync",
        False,
    ),
    TorchKernel.bmm: (
        "torch.bmm over all experts of the masked layout: one launch, no host sync",
        False,
    ),
}


def weight_types(
    fmt: QuantFormat, experts: str | None, n: str, k: str, dtype: DType
) -> tuple[TensorType, TensorType | None]:
    """Type of a weight [experts?, n, k] in `fmt`, and of its scale (None if unscaled)."""
    lead = (experts,) if experts else ()
    if not fmt.quantized:
        return TensorType(dtype, (*lead, n, k)), None
    if fmt.scheme == Scheme.mxfp4:
        value = TensorType(DType.e2m1x2, (*lead, n, f"{k}/2"))
    else:
        value = TensorType(DType.e4m3, (*lead, n, k))
    if fmt.scheme == Scheme.fp8_per_tensor:
        return value, TensorType(FP32, (*lead, "1"))
    bn, bk = fmt.weight_block or (1, 1)
    scale_shape = (*lead, n if bn == 1 else f"{n}/{bn}", f"{k}/{bk}")
    return value, TensorType(FP32, scale_shape)


def grouped_type(
    dtype: DType, cols: str, layout: GemmLayout, scale: ScaleType | None = None
) -> TensorType:
    if layout == GemmLayout.masked:
        return TensorType(dtype, ("E", "max_m", cols), Layout.masked, scale)
    return TensorType(dtype, ("M", cols), Layout.contiguous, scale)


def elementwise_backend(gemm: Backend) -> Backend:
    """Who runs the stages around the GEMMs: Triton kernels beside Triton or DeepGEMM GEMMs."""
    return Backend.torch if gemm == Backend.torch else Backend.triton


def torch_gemm_kernel(
    device: DeviceKind, fmt: QuantFormat, dtype: DType, layout: GemmLayout
) -> TorchKernel:
    """The torch backend's grouped GEMM: torch's own grouped kernels for bf16 on CUDA, else a
    per-expert loop (which dequantizes fp8 / mx weights one expert at a time)."""
    if device == DeviceKind.cuda and not fmt.quantized and dtype is DType.bfloat16:
        return TorchKernel.grouped_mm if layout == GemmLayout.contiguous else TorchKernel.bmm
    return TorchKernel.loop


def build_stages(plan: Plan, spec: Spec) -> None:
    """Pass: add every stage of the layer, unfused, to `plan`."""
    layer, backends = plan.layer, plan.backends
    gemm, layout = backends.gemm, backends.layout
    around = elementwise_backend(gemm)
    routed, dtype = layer.routed, layer.dtype
    x_type = TensorType(dtype, ("T", "H"))

    inputs = {"x": x_type}
    if layer.hashed:  # the hash table's keys: what the forward takes beside x
        inputs["token_ids"] = TensorType(DType.int64, ("T",))
    plan.add_stage(Input(name="input", backend=Backend.none, outputs=inputs))
    _router(plan, around)
    plan.connect("input", "router", "x")
    _select(plan, spec, around)
    if layer.placed or layer.record_load:
        _place(plan)
    if layer.n_shared and not layer.fused_shared:
        _shared_expert(plan, gemm)

    expert_input, expert_tensor = "input", "x"
    if routed.quantized and layer.dispatch != DispatchMode.deepep_low_latency:  # it quantizes
        _quantize(plan, "quantize", routed, around, ("T", "H"), "xq")
        plan.connect("input", "quantize", "x")
        expert_input, expert_tensor = "quantize", "xq"
    _dispatch(plan, expert_input, expert_tensor, around)

    w13, w13_scale = weight_types(routed, "E", "2I", "H", dtype)
    w2, w2_scale = weight_types(routed, "E", "H", "I", dtype)
    _gemm(plan, GemmRole.gate_up, "h", ("w13", w13, w13_scale))
    plan.connect("dispatch", "gemm_gate_up", "a")
    plan.connect("dispatch", "gemm_gate_up", "routing")

    plan.add_stage(
        Activation(
            name="activation",
            backend=around,
            activation=layer.activation,
            values=layer.activation_values,
            layout=layout,
            intermediate=layer.intermediate,
            outputs={"g": grouped_type(FP32 if routed.quantized else dtype, "I", layout)},
            origin=("activation.kind", "experts.gemm_backend"),
        )
    )
    plan.connect("gemm_gate_up", "activation", "h")
    plan.connect("dispatch", "activation", "routing")
    down_input = ("activation", "g")
    if routed.quantized:
        _quantize(plan, "quantize_down", routed, around, None, "hq")
        plan.connect("activation", "quantize_down", "g")
        down_input = ("quantize_down", "hq")

    _gemm(plan, GemmRole.down, "y", ("w2", w2, w2_scale))
    plan.connect(down_input[0], "gemm_down", down_input[1], "a")
    plan.connect("dispatch", "gemm_down", "routing")
    _combine_and_finalize(plan, spec, around)


def _router(plan: Plan, around: Backend) -> None:
    """fp32 logits: one fp32 GEMM (torch), or, beside Triton kernels on a bf16 layer, the fp32
    weight split in three bf16 parts on bf16 tensor cores: exact products, fp32 sums."""
    layer = plan.layer
    split = around == Backend.triton and layer.dtype is DType.bfloat16
    if split:
        # the parts not all zero, counted at load: one for a bf16 checkpoint weight
        parts = TensorType(DType.bfloat16, ("3", "E", "H"), in_use="router_parts")
        weights = {"gate_parts": parts}
        note = (
            "x W^T with W = three bf16 parts (fp32 to one rounding), fp32 sums, only the parts "
            "not all zero (one for a bf16 checkpoint weight, counted at load); H split in S "
            "slices at few tokens, their partial logits added by select"
        )
        logits = TensorType(FP32, ("S", "T", "E"))
    else:
        weights = {"gate_weight": TensorType(FP32, ("E", "H"))}
        note = "fp32 GEMM, as the checkpoint's fp32 router computes it"
        logits = TensorType(FP32, ("T", "E"))
    plan.add_stage(
        Router(
            name="router",
            backend=Backend.triton if split else Backend.torch,
            experts=layer.routed_experts,
            precision=RouterPrecision.bf16x3 if split else RouterPrecision.fp32,
            outputs={"logits": logits},
            weights=weights,
            note=note,
            origin=("experts.gemm_backend", "target.dtype"),
        )
    )
    if split:
        plan.decide(
            "router",
            "bf16 x 3 parts in Triton",
            "a bf16 x times each bf16 part of the fp32 weight is exact in fp32 and the tensor "
            "cores sum in fp32: the fp32 GEMM's logits up to summation order, at the bf16 rate "
            "(three bf16 GEMMs) instead of the fp32 rate; a weight the checkpoint stores in bf16 "
            "(DeepSeek's) has zero second and third parts, so the layer reads its first part "
            "alone: one bf16 GEMM, the same logits",
        )
    else:
        plan.decide(
            "router",
            "fp32 GEMM in torch",
            "the reference path"
            if around == Backend.torch
            else f"a {layer.dtype.value} input has no exact three-part bf16 split",
        )


def _select(plan: Plan, spec: Spec, backend: Backend) -> None:
    layer, router = plan.layer, spec.router
    method = TopkMethod(router.topk_method)
    weights = {}
    if method == TopkMethod.noaux_tc:
        weights["gate_bias"] = TensorType(FP32, ("E",))
    if method == TopkMethod.hash:
        weights["tid2eid"] = TensorType(I32, ("V", "Kr"))
    plan.add_stage(
        Select(
            name="select",
            backend=backend,
            scoring_func=ScoringFunc(router.scoring_func),
            topk_method=method,
            n_group=router.n_group,
            topk_group=router.topk_group,
            norm_topk_prob=router.norm_topk_prob,
            top_k=layer.top_k,
            experts=layer.routed_experts,
            fused_shared=layer.n_shared if layer.fused_shared else 0,
            rounding=_rounding(plan, spec),
            outputs={
                "topk_weights": TensorType(FP32, ("T", "K")),
                "topk_ids": TensorType(I32, ("T", "K")),
            },
            weights=weights,
            origin=("router.topk_method", "experts.gemm_backend"),
        )
    )
    plan.connect("router", "select", "logits")
    triton = backend == Backend.triton
    if method == TopkMethod.hash:
        plan.connect("input", "select", "token_ids")
        plan.decide(
            "top-k",
            "hash table, Triton" if triton else "hash table, torch",
            "each token's experts are tid2eid[token_id], a gather; the weights are the scores "
            "of those experts" + ("; one Triton program per token" if triton else ""),
        )
    elif triton:
        plan.decide(
            "top-k",
            "Triton",
            f"selection is one Triton launch and the layout's indices one more up to "
            f"{ONE_LAUNCH_ROUTE} assignments (three above), instead of ~30 small torch kernels "
            "on the decode critical path",
        )
    else:
        plan.decide("top-k", "torch", "elementwise top-k: a few percent of the layer's bytes")


def _rounding(plan: Plan, spec: Spec) -> RouterRounding:
    """router.rounding as the selection applies it, with its decision."""
    rounding, dtype = RouterRounding(spec.router.rounding), plan.layer.dtype
    if rounding == RouterRounding.none:
        return rounding
    if dtype == FP32:
        plan.decide(
            "router rounding",
            "none",
            f'router.rounding = "{rounding}" rounds to target.dtype, and float32 is the fp32 '
            "the router computes in: nothing to round",
        )
        return RouterRounding.none
    rounded = "the logits" if rounding == RouterRounding.logits else "each step"
    plan.decide(
        "router rounding",
        f"{rounded} to {dtype.value}",
        f'router.rounding = "{rounding}": '
        + (
            "the logits rounded as a gate GEMM with a model-dtype output leaves them, the "
            "scores and weights fp32 from them"
            if rounding == RouterRounding.logits
            else "logits, scores and weights as a router computing in the model dtype "
            "rounds them, the bias-corrected choice fp32"
        )
        + f" (the {dtype.value} model's own routing, at its precision; none keeps fp32)",
    )
    return rounding


def _place(plan: Plan) -> None:
    """Logical ids to physical replicas after the selection (every dispatch then sees
    physical ids, rank r owning r * L ..), and the per-expert token counter."""
    layer = plan.layer
    tables: list = []
    rank_tables: list = []
    workspace = {}
    if layer.placed and layer.replica_choice == ReplicaChoice.static:
        rows = placement.static_choice(layer.placement, layer.routed_experts, layer.nodes)
        if layer.ep > 1:  # each expert-parallel rank its own row
            rank_tables.append(("replica_of", tuple(map(tuple, rows))))
        else:  # one row, the same on every (tensor-parallel) rank: a constant table
            tables.append(("replica_of", tuple(rows[0])))
        workspace["replica_of"] = TensorType(I32, ("E",))
    elif layer.placed:
        table, counts = placement.replica_table(layer.placement, layer.routed_experts)
        tables += [("replica_table", tuple(map(tuple, table))), ("replica_count", tuple(counts))]
        workspace["replica_table"] = TensorType(I32, ("E", str(len(table[0]))))
        workspace["replica_count"] = TensorType(I32, ("E",))
    if layer.record_load:
        workspace["expert_counts"] = TensorType(DType.int64, ("E",))
    plan.add_stage(
        Place(
            name="place",
            backend=Backend.torch,
            experts=layer.routed_experts,
            physical=layer.physical_experts,
            top_k=layer.top_k,
            mapped=layer.placed,
            replica_choice=layer.replica_choice,
            record_load=layer.record_load,
            tables=tuple(tables),
            rank_tables=tuple(rank_tables),
            outputs={"physical_ids": TensorType(I32, ("T", "K"))},
            workspace=workspace,
            origin=("parallel.placement", "parallel.redundant_experts", "parallel.record_load"),
        )
    )
    plan.connect("select", "place", "topk_ids")
    if layer.placed:
        counts = [len(r) for r in placement.replicas(layer.placement, layer.routed_experts)]
        how = (
            "each rank's fixed replica: its own, else its node's, else one spread by rank"
            if layer.replica_choice == ReplicaChoice.static
            else "a hash of each (token, k) position among the expert's replicas"
        )
        plan.decide(
            "expert placement",
            f"{layer.physical_experts} physical experts for {layer.routed_experts} logical "
            f"({max(counts)} replicas at most), {layer.local_experts} per rank",
            f"parallel.placement and redundant_experts; the ids after the selection become "
            f"physical ({layer.replica_choice}: {how}), so every dispatch and GEMM backend "
            "runs on physical experts",
        )
    if layer.record_load:
        plan.decide(
            "expert load",
            "recorded",
            "parallel.record_load: the tokens of each logical expert are added to a device "
            "counter on every forward (no host sync, CUDA-graph safe)",
        )


def _quantize(plan: Plan, name: str, fmt: QuantFormat, backend: Backend, shape, out: str) -> None:
    """Activation quantization: token rows (shape [T, H]) or the grouped intermediate."""
    scale = fmt.activation_scale()
    if shape is None:
        out_type = grouped_type(DType.e4m3, "I", plan.backends.layout, scale)
    else:
        out_type = TensorType(DType.e4m3, shape, scale=scale)
    prefix = "w13" if name == "quantize" else "w2"
    weights = {f"{prefix}_input_scale": TensorType(FP32, ("1",))} if fmt.static else {}
    plan.add_stage(
        Quantize(
            name=name,
            backend=backend,
            format=fmt,
            outputs={out: out_type},
            weights=weights,
            origin=("quant.scheme", "experts.gemm_backend", "parallel.dispatch"),
        )
    )


ONE_LAUNCH_DISPATCH = 128
"""Assignments up to which a Triton dispatch is one launch (moec/runtime/triton_dispatch.py)."""
ONE_LAUNCH_ROUTE = 1024
"""Assignments up to which the Triton layout indices are one launch: route_layout counts them
in each program (Dispatch.route_one_pass, passed to it by the generated call). Above, 2048
measured no faster (benchmarks/RESULTS.md)."""


def _dispatch(plan: Plan, source: str, tensor: str, around: Backend) -> None:
    layer, backends = plan.layer, plan.backends
    layout, mode = backends.layout, layer.dispatch
    a_type = plan.stage(source).outputs[tensor]
    quantize, buffer = None, None
    if mode.startswith("deepep"):
        buffer = deepep.buffer_for(layer)
        plan.decide(
            "DeepEP buffer",
            buffer.describe(),
            "DeepEP's own size hints for this layer (moec/plan/deepep.py); the layer checks them "
            "against the installed deep_ep when it allocates",
        )
    if mode == DispatchMode.deepep_low_latency and layer.routed.quantized:
        # DeepEP's low-latency dispatch quantizes each token in 1 x 128 groups as it sends it and
        # writes the scales MN-major, TMA-aligned ([E, max_m, H/128], max_m a multiple of 4)
        quantize = layer.routed
        produced = layer.routed.activation_scale()
        assert produced is not None  # a quantized format's
        scale = replace(produced, major=ScaleMajor.MN, tma_aligned=True)
        a_type = TensorType(DType.e4m3, ("T", "H"), scale=scale)
    routing_type = TensorType(
        I32,
        ("M",) if layout == GemmLayout.contiguous else ("E",),
        Layout.masked if layout == GemmLayout.masked else Layout.contiguous,
        record=ROUTING_RECORD[layout],
    )
    outputs = {"a": grouped_type(a_type.dtype, "H", layout, a_type.scale), "routing": routing_type}
    if mode != DispatchMode.local:
        outputs["exchange"] = TensorType(I32, ("T*K",), record=EXCHANGE_RECORD[mode])
    exchanged = layer.exchanges_rows
    padding = None if backends.gemm == Backend.triton else ROW_PADDING
    one_launch = 0
    local = mode == DispatchMode.local
    if local and around == Backend.triton and layout == GemmLayout.contiguous:
        one_launch = ONE_LAUNCH_DISPATCH
        plan.decide(
            "dispatch at decode",
            f"one launch up to {one_launch} assignments",
            "each assignment's programs find its row from the histogram of all assignments, "
            "write the indices and hand its token's row on (quantized where the scheme is): at "
            "a few tokens this costs less than a second launch (H200, DeepSeek-V3 T=1: 4.7 us "
            "against 7.8 for the indices and a pass over the rows, benchmarks/RESULTS.md run "
            "19); above, the indices, then one pass over the token rows",
        )
    plan.add_stage(
        Dispatch(
            name="dispatch",
            backend=around if local else backends.dispatch,
            mode=mode,
            layout=layout,
            experts=layer.grouped_experts,
            row_padding=padding if layout == GemmLayout.contiguous else None,
            routing_backend=around,
            route_one_pass=ONE_LAUNCH_ROUTE if around == Backend.triton else 0,
            quantize=quantize,
            buffer=buffer,
            one_launch=one_launch,
            outputs=outputs,
            syncs_host=exchanged,
            graph_safe=not exchanged,
            origin=("parallel.dispatch", "experts.layout", "experts.gemm_backend"),
        )
    )
    plan.connect(source, "dispatch", tensor, "x")
    if plan.has("place"):
        plan.connect("place", "dispatch", "physical_ids", "topk_ids")
    else:
        plan.connect("select", "dispatch", "topk_ids")
    if not local:  # the weights travel with the tokens; the expert ranks apply them
        plan.connect("select", "dispatch", "topk_weights")
    if quantize is not None:
        plan.decide(
            "fuse quantize + dispatch",
            "yes (DeepEP)",
            "DeepEP's low-latency dispatch quantizes each bf16 token to e4m3 with 1 x 128 scales "
            "as it sends it: half the bytes on the wire, no quantize pass",
        )
    if layout == GemmLayout.contiguous:
        why = "each expert's rows start on a GEMM tile boundary, so a tile never mixes experts"
        if padding:
            plan.decide(
                "contiguous row padding",
                f"block_m = {padding}",
                f"{why}; {padding} is DeepGEMM's M alignment",
            )
        else:
            plan.decide(
                "contiguous row padding", "block_m = the GEMM's BLOCK_M per token bucket", why
            )


PSUM_FROM = 16
"""Tokens from which DeepGEMM is told the contiguous layout by end rows (see _decide_psum)."""


def _decide_psum(plan: Plan, psum_from: int) -> None:
    why = (
        "the same rows as the m_indices form, told by E end rows (DeepGEMM's use_psum_layout): "
        "its scheduler visits only the experts' own 128-row blocks instead of every block of "
        "the worst-case M; the same output bit for bit (H200, DeepSeek-V3, whole layer on "
        "DeepGEMM: fp8_block 1.669 -> 1.256 ms at T=16, 4.238 -> 3.307 at 1024, 6.128 -> "
        "5.129 at 4096, 15.47 -> 14.33 at 16384; bf16 9.32 -> 6.69 at 2048, 26.14 -> 23.89 at "
        "16384; benchmarks/RESULTS.md runs 81-82)"
    )
    if psum_from == plan.backends.min_tokens:
        plan.decide("DeepGEMM grouped layout", "psum: each expert's end row", why)
        return
    plan.decide(
        "DeepGEMM grouped layout",
        f"m_indices below T={psum_from}, psum (each expert's end row) from it",
        f"{why}; at T=1 the m_indices form is faster (fp8_block 0.1495 against 0.1811 ms, bf16 "
        f"0.2504 against 0.2626, run 82)",
    )


def _gemm(plan: Plan, role: GemmRole, out_name: str, weight) -> None:
    layer, backends = plan.layer, plan.backends
    fmt, layout, backend = layer.routed, backends.layout, backends.gemm
    attr, w_type, scale_type = weight
    weights = {attr: w_type}
    if scale_type is not None:
        weights[f"{attr}_scale"] = scale_type
    n, k = ("2I", "H") if role == GemmRole.gate_up else ("H", "I")
    values = {"2I": 2 * layer.intermediate, "H": layer.hidden, "I": layer.intermediate}
    a_dtype = DType.e4m3 if fmt.quantized else layer.dtype
    a_scale = accepted_scale(backend, layer.arch, fmt.activation_scale())
    kernel, note, syncs = None, "", False
    if backend == Backend.torch:
        kernel = torch_gemm_kernel(layer.device, fmt, layer.dtype, layout)
        note, syncs = TORCH_GEMM[kernel]
    psum_from = None
    if backend == Backend.deep_gemm and layout == GemmLayout.contiguous:
        psum_from = PSUM_FROM if plan.backends.min_tokens < PSUM_FROM else plan.backends.min_tokens
        if role == GemmRole.gate_up:
            _decide_psum(plan, psum_from)
    plan.add_stage(
        Gemm(
            name=f"gemm_{role}",
            backend=backend,
            role=role,
            format=fmt,
            layout=layout,
            n=n,
            k=k,
            n_value=values[n],
            k_value=values[k],
            torch_kernel=kernel,
            psum_from=psum_from,
            psum_branch=psum_from is not None and psum_from > plan.backends.min_tokens,
            accepts={"a": grouped_type(a_dtype, k, layout, a_scale)},
            outputs={out_name: grouped_type(layer.dtype, n, layout)},
            weights=weights,
            graph_safe=not syncs,
            syncs_host=syncs,
            note=note,
            origin=("experts.gemm_backend", "quant.scheme", "experts.layout"),
        )
    )


def _combine_and_finalize(plan: Plan, spec: Spec, around: Backend) -> None:
    layer, backends = plan.layer, plan.backends
    mode = layer.dispatch
    local = mode == DispatchMode.local
    exchanged = layer.exchanges_rows
    plan.add_stage(
        Combine(
            name="combine",
            backend=around if local else backends.dispatch,
            mode=mode,
            layout=backends.layout,
            reduce_backend=around if exchanged else "",
            outputs={"routed": TensorType(layer.dtype, ("T", "H"))},
            syncs_host=mode == DispatchMode.all2all,
            graph_safe=not exchanged,
            origin=("parallel.dispatch", "experts.gemm_backend"),
        )
    )
    plan.connect("gemm_down", "combine", "y")
    if (
        mode != DispatchMode.deepep_low_latency
    ):  # that combine finds its way back in the exchange alone
        plan.connect("dispatch", "combine", "routing")
    if local:
        plan.connect("select", "combine", "topk_weights")
    else:
        plan.connect("dispatch", "combine", "exchange")

    plan.add_stage(
        Finalize(
            name="finalize",
            backend=Backend.torch_distributed if layer.tp > 1 else Backend.torch,
            routed_scaling_factor=spec.router.routed_scaling_factor,
            add_shared=plan.has("shared_expert"),
            all_reduce=layer.tp > 1,
            outputs={"out": TensorType(layer.dtype, ("T", "H"))},
            origin=("parallel.tp_size",),
        )
    )
    plan.connect("combine", "finalize", "routed")
    if plan.has("shared_expert"):
        plan.connect("shared_expert", "finalize", "shared")
    plan.add_stage(Output(name="output", backend=Backend.none))
    plan.connect("finalize", "output", "out")


def _shared_expert(plan: Plan, gemm: Backend) -> None:
    layer: Layer = plan.layer
    fmt = layer.shared
    w13, w13_scale = weight_types(fmt, None, "2Is", "H", layer.dtype)
    w2, w2_scale = weight_types(fmt, None, "H", "Is", layer.dtype)
    weights = {"shared_w13": w13}
    if w13_scale is not None:
        weights["shared_w13_scale"] = w13_scale
    weights["shared_w2"] = w2
    if w2_scale is not None:
        weights["shared_w2_scale"] = w2_scale
    if fmt.static:
        weights["shared_w13_input_scale"] = TensorType(FP32, ("1",))
        weights["shared_w2_input_scale"] = TensorType(FP32, ("1",))
    plan.add_stage(
        SharedExpert(
            name="shared_expert",
            backend=elementwise_backend(gemm) if gemm == Backend.deep_gemm else gemm,
            format=fmt,
            experts=layer.n_shared,
            intermediate=layer.shared_intermediate,
            activation=layer.activation,
            values=layer.activation_values,
            side_stream=layer.shared_overlap,
            outputs={"shared": TensorType(layer.dtype, ("T", "H"))},
            weights=weights,
            note=f"dense gated MLP of width {layer.shared_intermediate}, {fmt.label()}"
            + (", on a second CUDA stream" if layer.shared_overlap else ""),
            origin=("experts.shared_experts", "quant.shared_scheme", "experts.gemm_backend"),
        )
    )
    plan.connect("input", "shared_expert", "x")
    if layer.shared_overlap:
        plan.decide(
            "shared experts",
            "separate, on a second CUDA stream",
            "set in the spec (experts.shared_experts = overlapped): they start with the forward "
            "and run while the router, the selection and the dispatch do; the stage that adds "
            "their output waits for them",
        )
