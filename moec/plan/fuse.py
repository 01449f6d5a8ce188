"""Passes: fuse neighbouring stages where one kernel can do both, each fusion a decision.

- the Triton router + the selection: one launch for a few tokens (decode);
- activation + the quantization of its output (the intermediate never reaches memory);
- the routed scaling factor into the top-k weights (combine multiplies by them anyway);
- activation quantization into the dispatch permute, for Triton (one pass over the tokens);
- the dispatch's row copy into the gate/up GEMM's loads, for Triton: the GEMM gathers each
  row's token, and the dispatch only quantizes the tokens;
- the finalize step (shared-expert add) into combine, unless finalize also all-reduces across
  tensor-parallel ranks, which stays its own stage.

Measured and not kept (benchmarks/RESULTS.md, run 64): the copy-free dispatch in the decode
gate's launch, and the combine in the down GEMM's last program per column tile. Under PDL the
launches they save were already hidden, and the work they move into one last program lengthens
the path every later kernel waits on.
"""

from __future__ import annotations

from moec.plan.graph import Plan
from moec.plan.stages import (
    Activation,
    Convert,
    Dispatch,
    Finalize,
    Gemm,
    Quantize,
    Router,
    Select,
)
from moec.plan.types import DType, TensorType
from moec.vocab import Backend, ConvertStep, DispatchMode, GemmLayout, TopkMethod

GATE_ONE_LAUNCH = 1
"""Tokens up to which the fused Triton router and selection are one launch
(moec/runtime/triton_gate.py): its last program selects the tile's tokens one after another,
about 3 us each on the H200, so already at 2 tokens two launches are faster (the stage alone,
DeepSeek-V3: 11.1 against 8.8 us, the layer 0.2108 against 0.2088 ms; benchmarks/RESULTS.md,
run 62)."""


def fuse_router_select(plan: Plan) -> None:
    router, select = plan.stage("router", Router), plan.stage("select", Select)
    if router.backend != Backend.triton or select.backend != Backend.triton:
        return
    if select.topk_method == TopkMethod.hash:
        plan.decide(
            "fuse router + select",
            "no",
            "the hash selection reads the token ids, which the fused router kernel does not "
            "take: the router and the gather are two launches",
        )
        return
    counters = TensorType(DType.int32, (str(GATE_ONE_LAUNCH),))
    plan.absorb(
        "select",
        "router",
        one_launch=GATE_ONE_LAUNCH,
        scratch=router.outputs,  # the partial logits: the router's programs write, select reads
        workspace={"gate_counters": counters},
    )
    plan.decide(
        "fuse router + select",
        "one launch at 1 token"
        if GATE_ONE_LAUNCH == 1
        else f"one launch up to {GATE_ONE_LAUNCH} tokens",
        "the router's last program to finish for a token tile selects its tokens (the layer "
        "keeps a counter per tile): select's launch and its wait on the router are gone at "
        "decode (H200, DeepSeek-V3 fp8_block T=1: 0.1224 against 0.1267 ms; bf16 0.2152 "
        "against 0.2167; V2-Lite within the spread between runs; benchmarks/RESULTS.md run "
        "62); above, that program would select the tokens one after another, so the router "
        "and the selection stay two launches",
    )


def fuse_activation_quant(plan: Plan) -> None:
    if not plan.has("quantize_down"):
        return
    fmt = plan.stage("quantize_down", Quantize).format
    plan.absorb("activation", "quantize_down", quantize=fmt)
    plan.decide(
        "fuse activation + quantize",
        "yes",
        "the fp32 activation is quantized in registers: the [M, I] intermediate is never written",
    )


def fuse_routed_scaling(plan: Plan) -> None:
    factor = plan.stage("finalize", Finalize).routed_scaling_factor
    plan.update("finalize", routed_scaling_factor=1.0)
    plan.update("select", routed_scaling_factor=factor)
    select = plan.stage("select", Select)
    if factor == 1.0:
        plan.decide("routed scaling", "none", "routed_scaling_factor is 1")
        return
    plan.decide(
        "routed scaling",
        f"x{factor:g} folded into the top-k weights",
        "combine multiplies every expert row by its weight anyway: no extra pass over [T, H]"
        + (" (and fused shared experts keep weight 1)" if select.fused_shared else ""),
    )


def fuse_quantize_dispatch(plan: Plan) -> None:
    if not plan.has("quantize"):
        return
    dispatch = plan.stage("dispatch", Dispatch)
    if dispatch.mode != DispatchMode.local or dispatch.backend != Backend.triton:
        return
    fmt = plan.stage("quantize", Quantize).format
    plan.absorb("dispatch", "quantize", quantize=fmt)
    plan.decide(
        "fuse quantize + dispatch",
        "yes",
        "the dispatch quantizes each token row once as it reads it: one read of x, one write of "
        "[T, H]"
        if dispatch.gather
        else "the permute kernel quantizes each token row as it copies it: one read of x, one "
        "write",
    )


def gather_token_rows(plan: Plan) -> None:
    """A Triton gate/up GEMM after a local Triton dispatch reads each row of the contiguous
    layout from its token, through the routing's token_of_row: the dispatch writes no rows."""
    if not plan.has("dispatch"):
        return
    dispatch, gemm = plan.stage("dispatch", Dispatch), plan.stage("gemm_gate_up", Gemm)
    triton = dispatch.backend == Backend.triton and gemm.backend == Backend.triton
    local = dispatch.mode == DispatchMode.local
    if not (triton and local and dispatch.layout == GemmLayout.contiguous):
        return
    assert plan.tiles is not None  # set by the tiles pass for every Triton GEMM
    buckets = plan.tiles.reachable(plan.layer.max_tokens)
    tma = [i for i, b in enumerate(buckets) if b.gate_up.get("TMA")]
    if tma:
        first = tma[0]
        most = "any count" if first == 0 else f"more than {buckets[first - 1].max_tokens} tokens"
        plan.decide(
            "copy-free dispatch",
            "no: the dispatch copies each token to its experts' rows",
            f"the gate/up GEMM's tiles for {most} load A with TMA, in whole blocks of rows, "
            "which cannot gather rows",
        )
        return
    given, accepted = dispatch.outputs["a"], gemm.accepts["a"]
    plan.retype("dispatch", "a", TensorType(given.dtype, ("T", "H"), scale=given.scale))
    plan.update("dispatch", gather=True)
    tokens = TensorType(accepted.dtype, ("T", "H"), scale=accepted.scale)
    plan.update("gemm_gate_up", gather=True, accepts={**gemm.accepts, "a": tokens})
    what = "quantizes each token once" if plan.has("quantize") else "passes x on"
    plan.decide(
        "copy-free dispatch",
        "yes: the gate/up GEMM gathers its rows",
        f"the dispatch {what} and writes only the layout's indices; the gate/up GEMM loads "
        "each row of the layout from its token through token_of_row. No [M, H] copy is "
        "written and read back, and the GEMM's A is K times smaller (H200, DeepSeek-V3 "
        "fp8_block, one package both ways: dispatch + gate/up 2005 against 2023 us at T=1024, "
        "3972 against 4035 at 4096, 12866 against 13152 at 16384, level at T=1 and 256; the "
        "same output bit for bit; benchmarks/RESULTS.md run 59)",
    )


LAYOUT_STEPS = {ConvertStep.to_mn_major, ConvertStep.pad_tma}
"""Converter steps a Triton quantizer can do itself, by writing its scales with other strides."""


def fuse_scale_layout(plan: Plan) -> None:
    """A converter that only transposes and pads the scales of a Triton quantizer's 2-D output
    disappears: the quantizer writes them in the wanted layout (its kernels take any strides)."""
    for convert in [s for s in plan.order() if isinstance(s, Convert)]:
        ((producer, edge),) = plan.inputs(convert.name)
        source = plan.stage(producer)
        fits = (
            set(convert.steps) <= LAYOUT_STEPS
            and source.backend == Backend.triton
            and isinstance(source, (Dispatch, Activation))
            and source.quantize is not None
            and len(edge.type.shape) == 2
        )
        if not fits:
            continue
        (converted,) = convert.outputs.values()
        outputs = {**source.outputs, edge.tensor: converted}
        ((consumer, out_edge),) = plan.consumers(convert.name)
        plan.graph.remove_node(convert.name)
        plan.update(producer, outputs=outputs, mn_major_scales=True)
        plan.connect(producer, consumer, edge.tensor, out_edge.input)
        dropped = f"convert {edge.tensor} for {consumer}"
        plan.decisions[:] = [d for d in plan.decisions if d.what != dropped]
        plan.decide(
            f"scales of {edge.tensor}",
            "written MN-major, TMA-aligned",
            f"the {producer} kernel stores its scales in the layout {consumer} reads: no "
            "converter pass over them",
        )


def fuse_finalize_combine(plan: Plan) -> None:
    finalize = plan.stage("finalize", Finalize)
    if finalize.all_reduce:
        # combine adds the (partial) shared output; finalize only all-reduces the sum.
        if finalize.add_shared:
            for producer, edge in plan.inputs("finalize"):
                if edge.tensor == "shared":
                    plan.graph.remove_edge(producer, "finalize")
                    plan.connect(producer, "combine", "shared")
            plan.update("combine", add_shared=True)
            plan.update("finalize", add_shared=False)
        plan.decide(
            "fuse finalize into combine",
            "partly",
            "combine adds the shared output; the tensor-parallel all-reduce stays a stage",
        )
        return
    plan.absorb("combine", "finalize", add_shared=finalize.add_shared)
    why = (
        "the weighted sum, the shared-expert add and the rounding to the output dtype are one pass"
    )
    if plan.layer.dispatch == DispatchMode.deepep_low_latency:
        why = "the shared-expert output is added to DeepEP's weighted sum as it arrives (no finalize launch)"
    plan.decide("fuse finalize into combine", "yes", why)
