"""Pass: resolve every `auto` of the spec into a choice with its reason.

gemm backend from the target and what is importable; layout from the masked layout's peak
memory at max_num_tokens against the budget (as seed 000's `_should_use_masked_standard_layout`);
dispatch backend from the dispatch kind.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, replace

from moec.plan.devices import device_for
from moec.plan.graph import Backends, Plan
from moec.plan.layer import Layer
from moec.plan.layouts import masked_peak_bytes
from moec.spec.models import Spec
from moec.spec.rules import arch_number

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


@dataclass(frozen=True)
class Environment:
    """What the machine that builds the package can import."""

    importable: frozenset[str]

    @classmethod
    def detect(cls) -> Environment:
        names = ("deep_gemm", "deep_ep", "triton")
        return cls(frozenset(n for n in names if importlib.util.find_spec(n) is not None))

    def has(self, module: str) -> bool:
        return module in self.importable


DISPATCH_BACKEND = {
    "local": "torch",
    "all2all": "torch.distributed",
    "deepep_normal": "deep_ep",
    "deepep_low_latency": "deep_ep",
}


def resolve_backends(plan: Plan, spec: Spec, env: Environment) -> None:
    """Pass: choose the GEMM backend, the layout and the dispatch backend, each a decision."""
    gemm = _gemm_backend(spec, env, plan.decide)
    layout = _layout(spec, plan.layer, plan.decide)
    dispatch = DISPATCH_BACKEND[spec.parallel.dispatch]
    plan.decide("dispatch", f"{spec.parallel.dispatch} ({dispatch})", _dispatch_reason(spec))
    plan.backends = Backends(gemm, layout, dispatch)
    if _fuse_shared(spec, gemm, plan.decide):
        plan.layer = replace(plan.layer, fused_shared=True)


def _fuse_shared(spec: Spec, gemm: str, decide) -> bool:
    """experts.shared_experts = "auto": fuse the shared experts into the routed GEMMs where the
    backend streams them in the same launches and the rules allow it."""
    if spec.experts.shared_experts != "auto" or spec.model.n_shared_experts == 0:
        return False
    blocked = [
        why
        for why, present in (
            (f"the {gemm} backend runs them separately", gemm not in ("triton", "deep_gemm")),
            (
                "their scheme differs from the routed one",
                spec.quant.shared_scheme != spec.quant.scheme,
            ),
            (
                "one per-tensor activation scale would span routed and shared rows",
                spec.quant.scheme == "fp8_per_tensor",
            ),
            ("expert parallelism would put them on one rank", spec.parallel.ep_size > 1),
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
        "within 3% at T=16-16384; benchmarks/RESULTS.md run 5)",
    )
    return True


def _gemm_backend(spec: Spec, env: Environment, decide) -> str:
    asked = spec.experts.gemm_backend
    if asked != "auto":
        decide("gemm_backend", asked, "set in the spec (experts.gemm_backend)")
        return asked
    target = spec.target
    if target.device == "cpu":
        decide(
            "gemm_backend",
            "torch",
            "auto on a CPU target: Triton kernels run on a CPU only interpreted (slow)",
        )
        return "torch"
    renders = "deep_gemm" in renderable_backends("gemm")
    fits = _deep_gemm_fits(spec) and _deep_gemm_driven(spec)
    if env.has("deep_gemm") and fits and renders:
        decide("gemm_backend", "deep_gemm", f"auto on cuda {target.arch}: deep_gemm is installed")
        return "deep_gemm"
    if not env.has("deep_gemm"):
        why_not = "deep_gemm is not installed here"
    elif not _deep_gemm_fits(spec):
        why_not = "deep_gemm does not run this combination"
    elif not _deep_gemm_driven(spec):
        why_not = f"moec does not drive deep_gemm for {spec.quant.scheme} on {target.arch}"
    else:
        why_not = "deep_gemm is installed, but moec renders no deep_gemm GEMM"
    if spec.quant.scheme != "bf16" and arch_number(spec) < 89:
        decide("gemm_backend", "torch", f"auto on {target.arch}: no fp8 tensor cores; {why_not}")
        return "torch"
    if not env.has("triton"):
        decide("gemm_backend", "torch", f"auto on cuda {target.arch}: {why_not}, nor is triton")
        return "torch"
    decide("gemm_backend", "triton", f"auto on cuda {target.arch}: {why_not}")
    return "triton"


DEEP_GEMM_DRIVEN = {("fp8_block", "sm90"), ("bf16", "sm90"), ("bf16", "sm100")}
"""(scheme, arch) pairs whose DeepGEMM GEMMs moec renders (codegen/renderers/deep_gemm.py)."""


def _deep_gemm_fits(spec: Spec) -> bool:
    from moec.spec import rules

    probe = spec.model_copy(
        update={"experts": spec.experts.model_copy(update={"gemm_backend": "deep_gemm"})}
    )
    return not rules.problems_of("deep_gemm_target", probe)


def _deep_gemm_driven(spec: Spec) -> bool:
    return (spec.quant.scheme, spec.target.arch) in DEEP_GEMM_DRIVEN


def _layout(spec: Spec, layer: Layer, decide) -> str:
    asked = spec.experts.layout
    if spec.parallel.dispatch == "deepep_low_latency":
        decide(
            "layout", "masked", "DeepEP low-latency dispatch delivers tokens per expert (masked)"
        )
        return "masked"
    if asked != "auto":
        decide("layout", asked, "set in the spec (experts.layout)")
        return asked
    if spec.parallel.dispatch == "deepep_normal":
        decide("layout", "contiguous", "DeepEP normal dispatch delivers a variable token count")
        return "contiguous"
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
        return "masked"
    decide(
        "layout",
        "contiguous",
        f"masked needs {need:.1f} GiB at T={tokens}, over the budget {budget_gib:.1f} GiB ({source})",
    )
    return "contiguous"


def _dispatch_reason(spec: Spec) -> str:
    parallel = spec.parallel
    if parallel.dispatch == "local":
        if parallel.tp_size > 1:
            return f"every rank holds all experts, 1/{parallel.tp_size} of each intermediate; outputs all-reduced"
        return "one rank holds every expert: tokens are permuted locally"
    if parallel.dispatch == "all2all":
        return f"{spec.model.n_routed_experts // parallel.ep_size} experts per rank; token rows exchanged with all_to_all_single"
    return f"{spec.model.n_routed_experts // parallel.ep_size} experts per rank; DeepEP exchanges tokens over NVLink/RDMA"


def renderable_backends(kind: str) -> frozenset[str]:
    """Backends moec has a renderer for, for stages of `kind` (the codegen's registry)."""
    from moec.codegen.registry import backends_for

    return backends_for(kind)
