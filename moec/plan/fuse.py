"""Passes: fuse neighbouring stages where one kernel can do both, each fusion a decision.

- the Triton router + the selection: one launch for a few tokens (decode);
- activation + the quantization of its output (the intermediate never reaches memory);
- the routed scaling factor into the top-k weights (combine multiplies by them anyway);
- activation quantization into the dispatch permute, for Triton (one pass over the tokens);
- the dispatch's row copy into the gate/up GEMM's loads, for Triton: the GEMM gathers each
  row's token, and the dispatch only quantizes the tokens;
- that copy-free dispatch into the decode gate's launch (router + selection);
- the finalize step (shared-expert add) into combine, unless finalize also all-reduces across
  tensor-parallel ranks, which stays its own stage;
- the combine into the Triton down GEMM at decode: its last program per column tile sums the
  tokens' rows.
"""

from __future__ import annotations

from moec.plan.graph import Plan
from moec.plan.types import DType, TensorType

GATE_ONE_LAUNCH = 1
"""Tokens up to which the fused Triton router and selection are one launch
(moec/runtime/triton_gate.py): its last program selects the tile's tokens one after another,
about 3 us each on the H200, so already at 2 tokens two launches are faster (the stage alone,
DeepSeek-V3: 11.1 against 8.8 us, the layer 0.2108 against 0.2088 ms; benchmarks/RESULTS.md,
run 62)."""


def fuse_router_select(plan: Plan) -> None:
    router, select = plan.stage("router"), plan.stage("select")
    if router.backend != "triton" or select.backend != "triton":
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
    fmt = plan.stage("quantize_down").format
    plan.absorb("activation", "quantize_down", quantize=fmt)
    plan.decide(
        "fuse activation + quantize",
        "yes",
        "the fp32 activation is quantized in registers: the [M, I] intermediate is never written",
    )


def fuse_routed_scaling(plan: Plan) -> None:
    factor = plan.stage("finalize").routed_scaling_factor
    plan.update("finalize", routed_scaling_factor=1.0)
    select = plan.update("select", routed_scaling_factor=factor)
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
    dispatch = plan.stage("dispatch")
    if dispatch.mode != "local" or dispatch.backend != "triton":
        return
    fmt = plan.stage("quantize").format
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
    dispatch, gemm = plan.stage("dispatch"), plan.stage("gemm_gate_up")
    triton = dispatch.backend == "triton" and gemm.backend == "triton"
    if not (triton and dispatch.mode == "local" and dispatch.layout == "contiguous"):
        return
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


DOWN_COMBINE_TOKENS = 16
"""Tokens up to which the Triton down GEMM's last program per column tile does the combine
(moec/runtime/triton_gemm.py, COMBINE): each such program adds T * K rows of its columns after
its own tile, so past a few tokens a combine launch of its own spreads that work wider."""


def fuse_down_combine(plan: Plan) -> None:
    """At decode the combine runs in the down GEMM's launch (its last program per column tile)."""
    if not (plan.has("combine") and plan.has("gemm_down")):
        return
    down, combine = plan.stage("gemm_down"), plan.stage("combine")
    triton = down.backend == "triton" and combine.backend == "triton"
    if not (triton and combine.mode == "local" and down.layout == "contiguous"):
        return
    what = "fuse down GEMM + combine"
    if combine.add_shared:
        plan.decide(
            what,
            "no",
            "combine adds the shared experts' output, which the GEMM's last programs would "
            "have to wait for",
        )
        return
    tokens = min(DOWN_COMBINE_TOKENS, plan.layer.max_tokens)
    buckets = plan.tiles.reachable(tokens)
    if any(b.down.get("TMA") for b in buckets):
        plan.decide(what, "no", "the down GEMM's decode tiles are TMA tiles, which have no "
                    "last program per column tile")  # fmt: skip
        return
    hidden = plan.layer.hidden
    tiles = max(-(-hidden // b.down["BLOCK_N"]) for b in buckets)
    plan.absorb(
        "gemm_down",
        "combine",
        combine_tokens=tokens,
        scratch={"y": down.outputs["y"]},  # the GEMM's rows, stored and read back
        workspace={"down_counters": TensorType(DType.int32, (str(tiles),))},
    )
    plan.decide(
        what,
        f"in the GEMM's launch up to {tokens} tokens",
        "the last program of each column tile to store its rows adds every token's rows in "
        "those columns (the layer keeps a counter per column tile): combine's launch and its "
        "wait on the GEMM are gone at decode; above, a combine launch of its own spreads the "
        "sums over more programs",
    )


def fuse_gate_dispatch(plan: Plan) -> None:
    """At decode the copy-free dispatch runs in the gate's launch: the router's programs quantize
    x beside their partial logits, and the last one writes the layout after its choice."""
    if not plan.has("dispatch"):
        return
    select, dispatch = plan.stage("select"), plan.stage("dispatch")
    if not (select.one_launch and dispatch.gather):
        return
    what = "fuse select + dispatch"
    fmt = dispatch.quantize
    tokens = "1 token" if select.one_launch == 1 else f"up to {select.one_launch} tokens"
    router = plan.tiles.router(select.one_launch)
    why_not = None
    if fmt is not None and fmt.quantized and fmt.group is None:
        why_not = "a per-tensor scale is the amax of all of x, known only after every program"
    elif router["BLOCK_T"] < select.one_launch:
        why_not = f"the layout needs every token in one router tile ({router['BLOCK_T']} tokens)"
    elif fmt is not None and fmt.quantized and router["BLOCK_K"] % fmt.group:
        why_not = (
            f"the router's K tile ({router['BLOCK_K']}) is not a multiple of the quantization "
            f"group ({fmt.group})"
        )
    if why_not:
        plan.decide(what, "no", why_not)
        return
    ids = {"topk_ids": select.outputs["topk_ids"]}  # written, then read back by the last program
    plan.absorb("select", "dispatch", dispatch=dispatch, scratch={**select.scratch, **ids})
    quantizes = (
        "quantize their slice of x beside their partial logits (one expert tile's), "
        if fmt is not None and fmt.quantized
        else ""
    )
    plan.decide(
        what,
        f"in the gate's launch at {tokens}",
        f"the router's programs {quantizes}and the last one writes the contiguous layout's "
        "indices after its choice: the dispatch's launch and its wait on the choice are gone "
        "at decode; above, the dispatch runs after the selection's launches",
    )


LAYOUT_STEPS = {"transpose scales to MN-major", "pad scale columns to 16-byte TMA alignment"}
"""Converter steps a Triton quantizer can do itself, by writing its scales with other strides."""


def fuse_scale_layout(plan: Plan) -> None:
    """A converter that only transposes and pads the scales of a Triton quantizer's 2-D output
    disappears: the quantizer writes them in the wanted layout (its kernels take any strides)."""
    for convert in [s for s in plan.order() if s.kind == "convert"]:
        ((producer, edge),) = plan.inputs(convert.name)
        source = plan.stage(producer)
        fits = (
            set(convert.steps) <= LAYOUT_STEPS
            and source.backend == "triton"
            and source.kind in ("dispatch", "activation")
            and getattr(source, "quantize", None) is not None
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
    finalize = plan.stage("finalize")
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
    if plan.layer.dispatch == "deepep_low_latency":
        why = "the shared-expert output is added to DeepEP's weighted sum as it arrives (no finalize launch)"
    plan.decide("fuse finalize into combine", "yes", why)
