"""Pass: resolve every `auto` of the spec into a choice with its reason.

gemm backend from the target and what is importable; layout from the masked layout's peak
memory at max_num_tokens against the budget (as seed 000's `_should_use_masked_standard_layout`);
dispatch backend from the dispatch kind.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from moec.plan.backends import deep_gemm_gemm
from moec.plan.devices import device_for
from moec.plan.environment import Environment
from moec.plan.graph import Backends, GemmSplit
from moec.plan.layer import Layer
from moec.plan.layouts import masked_peak_bytes
from moec.plan.tables import find_backend_times
from moec.spec.models import Spec
from moec.spec.rules import arch_number, placed
from moec.vocab import (
    Backend,
    DeviceKind,
    DispatchMode,
    GemmLayout,
    Scheme,
)

Decide = Callable[[str, str, str], None]
"""Records a decision: (what, choice, reason), as Plan.decide."""

GIB = 1024**3
MASKED_BUDGET_FRACTION = 0.2
"""Share of the device's memory the masked layout may take when the spec sets no budget."""

INSTALL_HINTS = {
    "deep_gemm": "build DeepGEMM from https://github.com/deepseek-ai/DeepGEMM on the CUDA host "
    "(PyPI's deep-gemm 1.0.0 is a broken upload)",
    "deep_ep": "build DeepEP from https://github.com/deepseek-ai/DeepEP with NVSHMEM on the "
    "CUDA host",
    "triton": "pip install triton",
}


DISPATCH_BACKEND = {
    DispatchMode.local: Backend.torch,
    DispatchMode.all2all: Backend.torch_distributed,
    DispatchMode.deepep_normal: Backend.deep_ep,
    DispatchMode.deepep_low_latency: Backend.deep_ep,
}


def resolve_backends(
    spec: Spec, layer: Layer, env: Environment, decide: Decide, above: GemmSplit | None = None
) -> tuple[Backends, Layer]:
    """Pass, before the plan exists: the GEMM backend, the layout and the dispatch backend, each
    a decision, and the layer as they store it (shared experts fused, mxfp4 as fp8 blocks).
    `above`: this is the plan of the token counts past a split, on above.above."""
    if above is not None:
        gemm, split = above.above, None
        decide("gemm_backend", gemm, f"above T={above.up_to}: the split of gemm_backend auto")
    else:
        gemm, split = _gemm_backend(spec, env, layer, decide)
    layout = _layout(spec, layer, decide)
    dispatch = DISPATCH_BACKEND[DispatchMode(spec.parallel.dispatch)]
    decide("dispatch", f"{spec.parallel.dispatch} ({dispatch})", _dispatch_reason(spec))
    least = 1 if above is None else above.up_to + 1
    if _fuse_shared(spec, gemm, decide):
        layer = replace(layer, fused_shared=True)
    if gemm == Backend.deep_gemm and layer.routed.scheme == Scheme.mxfp4:
        layer = _mxfp4_as_e4m3(layer, decide)
    return Backends(gemm, layout, dispatch, split, least), layer


def _mxfp4_as_e4m3(layer: Layer, decide: Decide) -> Layer:
    """DeepGEMM on sm90 has no fp4 GEMM: its mxfp4 experts are stored as fp8 blocks."""
    shared = layer.shared
    if layer.fused_shared and shared.scheme == Scheme.mxfp4:  # stored in the same tensors
        shared = shared.as_e4m3_blocks()
    decide(
        "mxfp4 weights",
        "e4m3 in 128 x 128 blocks, converted at load",
        "DeepGEMM's sm90 kernels take fp8 weights: each block's scale is its largest 1 x 32 "
        "scale / 2**6, and every e2m1 value times its group's power of two is an e4m3 value, "
        "exactly (a group more than 2**14 below its block's largest is refused at load); the "
        "weights take 8 bits instead of 4.25, and activations 1 x 128 fp32 scales",
    )
    return replace(layer, routed=layer.routed.as_e4m3_blocks(), shared=shared)


def _fuse_shared(spec: Spec, gemm: Backend, decide: Decide) -> bool:
    """experts.shared_experts = "auto": fuse the shared experts into the routed GEMMs where the
    backend streams them in the same launches and the rules allow it."""
    if spec.experts.shared_experts != "auto" or spec.model.n_shared_experts == 0:
        return False
    blocked = [
        why
        for why, present in (
            (
                f"the {gemm} backend runs them separately",
                gemm not in (Backend.triton, Backend.deep_gemm),
            ),
            (
                "their scheme differs from the routed one",
                spec.quant.shared_scheme != spec.quant.scheme,
            ),
            (
                "one per-tensor activation scale would span routed and shared rows",
                spec.quant.scheme == Scheme.fp8_per_tensor,
            ),
            ("expert parallelism would put them on one rank", spec.parallel.ep_size > 1),
            ("the layer places replicated experts", placed(spec)),
            ("tensor parallelism splits them by columns", spec.parallel.tp_size > 1),
        )
        if present
    ]
    if blocked:
        decide("shared experts", "separate", f"auto: {'; '.join(blocked)}")
        return False
    decide(
        "shared experts",
        f"fused as {spec.model.n_shared_experts} extra expert(s)",
        "auto: their weights stream in the routed GEMMs' launches, with no launches of their own "
        "(H200, DeepSeek-V3 fp8_block, CUDA graph: 0.163 ms against 0.196 separate at T=1, "
        "within 3% at T=16-16384, benchmarks/RESULTS.md run 5; overlapped on a second stream, "
        "slower: 0.1313 against 0.1230 ms at T=1 and 1.037 against 1.021 at T=16, run 78, its "
        "one-row GEMMs too slow to hide beside the router with tiles 16 to 64 wide, run 79; "
        "V2-Lite 0.046 against 0.043 at T=1, run 19)",
    )
    return True


def _gemm_backend(
    spec: Spec, env: Environment, layer: Layer, decide: Decide
) -> tuple[Backend, GemmSplit | None]:
    asked = spec.experts.gemm_backend
    if asked != "auto":
        decide("gemm_backend", asked, "set in the spec (experts.gemm_backend)")
        return Backend(asked), None
    target = spec.target
    if target.device == DeviceKind.cpu:
        decide(
            "gemm_backend",
            "torch",
            "auto on a CPU target: Triton kernels run on a CPU only interpreted (slow)",
        )
        return Backend.torch, None
    fits = _deep_gemm_fits(spec) and _deep_gemm_driven(spec)
    if env.has("deep_gemm") and fits:
        return _measured_choice(spec, env, layer, decide)
    if not env.has("deep_gemm"):
        why_not = "deep_gemm is not installed here"
    elif not _deep_gemm_fits(spec):
        why_not = "deep_gemm does not run this combination"
    elif not _deep_gemm_driven(spec):
        why_not = f"moec does not drive deep_gemm for {spec.quant.scheme} on {target.arch}"
    else:
        why_not = "deep_gemm is installed, but moec renders no deep_gemm GEMM"
    if spec.quant.scheme != Scheme.bf16 and arch_number(spec) < 89:
        decide("gemm_backend", "torch", f"auto on {target.arch}: no fp8 tensor cores; {why_not}")
        return Backend.torch, None
    if not env.has("triton"):
        decide("gemm_backend", "torch", f"auto on cuda {target.arch}: {why_not}, nor is triton")
        return Backend.torch, None
    decide("gemm_backend", "triton", f"auto on cuda {target.arch}: {why_not}")
    return Backend.triton, None


def _measured_choice(
    spec: Spec, env: Environment, layer: Layer, decide: Decide
) -> tuple[Backend, GemmSplit | None]:
    """deep_gemm can run the layer: Triton up to the largest measured token count where it was
    faster, DeepGEMM above, from the layer's times on its GPU; DeepGEMM alone without them."""
    where = f"auto on cuda {spec.target.arch}: deep_gemm is installed"
    times = find_backend_times(layer, env)
    if isinstance(times, str):
        decide("gemm_backend", "deep_gemm", f"{where}; no times per T to choose by ({times})")
        return Backend.deep_gemm, None
    ours, theirs = times.ms.get("triton", {}), times.ms.get("deep_gemm", {})
    measured = sorted(set(ours) & set(theirs))
    if not measured:
        decide(
            "gemm_backend",
            "deep_gemm",
            f"{where}; {times.where} times no T on both triton and deep_gemm",
        )
        return Backend.deep_gemm, None
    table = ", ".join(f"T={t}: {ours[t]:.4g} / {theirs[t]:.4g}" for t in measured)
    evidence = f"ms triton / deep_gemm on {times.gpu} ({times.source}; {times.where}): {table}"
    triton_wins = [t for t in measured if ours[t] <= theirs[t]]
    why_not = _why_not_triton(spec, env, layer)
    if not triton_wins or why_not:
        reason = why_not or "deep_gemm is faster at every T measured"
        decide("gemm_backend", "deep_gemm", f"{where}; {reason}; {evidence}")
        return Backend.deep_gemm, None
    up_to = max(triton_wins)
    if up_to == measured[-1]:
        decide("gemm_backend", "triton", f"auto: triton is faster at every T measured; {evidence}")
        return Backend.triton, None
    decide(
        "gemm_backend",
        f"triton up to T={up_to}, deep_gemm above",
        f"auto, per token bucket: triton up to the largest T where it was faster; {evidence}",
    )
    return Backend.triton, GemmSplit(up_to, Backend.deep_gemm)


def _why_not_triton(spec: Spec, env: Environment, layer: Layer) -> str:
    """Why a package cannot hold Triton GEMMs beside DeepGEMM ones, or ""."""
    if not env.has("triton"):
        return "triton is not installed here"
    if spec.parallel.dispatch == DispatchMode.deepep_low_latency:
        return "DeepEP low-latency dispatch is built around one masked GEMM"

    def fused(gemm: Backend) -> bool:
        return _fuse_shared(spec, gemm, lambda *_: None)

    if fused(Backend.triton) != fused(Backend.deep_gemm):
        return "the two backends would store the shared experts differently"
    return ""


def _deep_gemm_fits(spec: Spec) -> bool:
    from moec.spec import rules

    probe = spec.model_copy(
        update={"experts": spec.experts.model_copy(update={"gemm_backend": "deep_gemm"})}
    )
    return not rules.problems_of("deep_gemm_target", probe)


def _deep_gemm_driven(spec: Spec) -> bool:
    """Whether moec drives DeepGEMM's GEMMs for the stored weights as they are; mxfp4 on sm90
    runs there only when the spec names deep_gemm (converted to fp8 blocks, twice the weight
    bytes of Triton's fp4 GEMMs), so auto does not choose it."""
    return deep_gemm_gemm(spec.quant.scheme, spec.target.arch) is None


def _layout(spec: Spec, layer: Layer, decide: Decide) -> GemmLayout:
    asked = spec.experts.layout
    if spec.parallel.dispatch == DispatchMode.deepep_low_latency:
        decide(
            "layout", "masked", "DeepEP low-latency dispatch delivers tokens per expert (masked)"
        )
        return GemmLayout.masked
    if asked != "auto":
        decide("layout", asked, "set in the spec (experts.layout)")
        return GemmLayout(asked)
    if spec.parallel.dispatch == DispatchMode.deepep_normal:
        decide("layout", "contiguous", "DeepEP normal dispatch delivers a variable token count")
        return GemmLayout.contiguous
    device = device_for(spec.target.device, spec.target.arch)
    budget_gib = spec.experts.masked_memory_budget_gib
    source = "experts.masked_memory_budget_gib"
    if budget_gib is None:
        budget_gib = device.memory_gib * MASKED_BUDGET_FRACTION
        source = f"{MASKED_BUDGET_FRACTION:.0%} of the {device.name}'s {device.memory_gib:.1f} GiB"
    tokens = layer.max_tokens
    need = masked_peak_bytes(layer, tokens) / GIB
    if need <= budget_gib:
        decide(
            "layout",
            "masked",
            f"masked needs {need:.1f} GiB at T={tokens}, within the budget {budget_gib:.1f} GiB "
            f"({source}); it is graph-static",
        )
        return GemmLayout.masked
    decide(
        "layout",
        "contiguous",
        f"masked needs {need:.1f} GiB at T={tokens}, over the budget {budget_gib:.1f} GiB ({source})",
    )
    return GemmLayout.contiguous


def _dispatch_reason(spec: Spec) -> str:
    parallel = spec.parallel
    if parallel.dispatch == DispatchMode.local:
        if parallel.tp_size > 1:
            return f"every rank holds all experts, 1/{parallel.tp_size} of each intermediate; outputs all-reduced"
        return "one rank holds every expert: tokens are permuted locally"
    physical = spec.model.n_routed_experts + parallel.redundant_experts
    held = f"{physical // parallel.ep_size} experts per rank"
    if parallel.redundant_experts:  # the replicas are experts the ranks hold too
        held += f" (of {physical} physical: {parallel.redundant_experts} replicas)"
    if parallel.dispatch == DispatchMode.all2all:
        return f"{held}; token rows exchanged with all_to_all_single"
    return f"{held}; DeepEP exchanges tokens over NVLink/RDMA"
