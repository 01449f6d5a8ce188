"""Passes that check the finished graph: every stage runs on a backend moec drives for it
(moec/plan/support.py), the packages it needs, and whether the whole layer can be captured in a
CUDA graph."""

from __future__ import annotations

from moec.errors import MoecError, Problem, problem
from moec.plan.backends import DEEP_GEMM_API, deep_gemm_function
from moec.plan.environment import Environment
from moec.plan.graph import Plan
from moec.plan.stages import Convert, Gemm, Stage
from moec.plan.support import PACKAGE, refusal
from moec.spec.models import Spec
from moec.vocab import ENDPOINTS, Backend

# Spec settings that give a stage kind another backend: what a user can change.
_WHAT_WORKS = {
    "gemm": 'experts.gemm_backend = "torch" or "triton"',
    "dispatch": 'parallel.dispatch = "local" or "all2all", or experts.gemm_backend = "torch"',
    "combine": 'parallel.dispatch = "local" or "all2all", or experts.gemm_backend = "torch"',
}


def check_support(plan: Plan, spec: Spec) -> None:
    """Pass: every stage runs on a backend moec drives for it; otherwise the spec is rejected,
    naming the spec keys whose values led to that stage."""
    refused = {
        stage.name: why
        for stage in plan.order()
        if stage.kind not in ENDPOINTS and (why := refusal(plan, stage)) is not None
    }
    # One problem per cause: stages refused for the same reason by the same backend are named
    # together; a converter that only feeds a refused stage goes with that stage's backend.
    causes: dict[tuple, list[str]] = {}
    for name, why in refused.items():
        stage = plan.stage(name)
        if isinstance(stage, Convert) and all(c in refused for c, _ in plan.consumers(name)):
            continue
        keys = stage.origin or ("experts.gemm_backend",)
        hint = _WHAT_WORKS.get(stage.kind, 'experts.gemm_backend = "torch"')
        causes.setdefault((keys, stage.backend, why, hint), []).append(_described(plan, stage))
    found: list[Problem] = []
    for (keys, backend, why, hint), stages in causes.items():
        also = f"; also chosen by {', '.join(keys[1:])}" if len(keys) > 1 else ""
        found.append(
            problem(
                keys[0],
                f"{' and '.join(stages)} would run on {backend}: {why}{also}",
                hint,
                value=_value_at(spec, keys[0]),
                rule="renderer",
            )
        )
    if found:
        raise MoecError(found, kind="spec")


def _described(plan: Plan, stage: Stage) -> str:
    """A stage in a user's words (the plan's stage names are for the generated code)."""
    if isinstance(stage, Gemm):
        return f"the {stage.role.replace('_', '/')} GEMM"
    if isinstance(stage, Convert):
        consumers = [_described(plan, plan.stage(c)) for c, _ in plan.consumers(stage.name)]
        return f"the scale conversion for {' and '.join(consumers)}"
    return f"the {stage.name.replace('_', ' ')}"


def _value_at(spec: Spec, path: str):
    value = spec.model_dump()
    for part in path.split("."):
        value = value[part]
    return value


def record_requirements(plan: Plan, env: Environment) -> None:
    """Pass: the optional packages the generated code imports, and which are missing here."""
    needed = {PACKAGE[s.backend] for s in plan.order() if s.backend in PACKAGE}
    plan.requires = tuple(sorted(needed))
    plan.missing = tuple(m for m in plan.requires if not env.has(m))
    calls = sorted(
        {
            deep_gemm_function(s.format.quantized, s.layout)
            for s in plan.order()
            if isinstance(s, Gemm) and s.backend == Backend.deep_gemm
        }
    )
    if calls:
        plan.decide(
            "deep_gemm calls",
            ", ".join(calls),
            f"moec's calls follow DeepGEMM {DEEP_GEMM_API} (signatures, and M rows padded to "
            f"128 per expert on sm90); installed here: {env.version('deep_gemm')}",
        )


def decide_graph_safety(plan: Plan) -> None:
    """Pass: whether the forward can be captured in a CUDA graph (no host syncs)."""
    syncing = [s.name for s in plan.order() if s.syncs_host or not s.graph_safe]
    if syncing:
        plan.decide(
            "CUDA graph",
            "no",
            f"{', '.join(syncing)} read sizes on the host (data-dependent shapes)",
        )
    else:
        plan.decide(
            "CUDA graph",
            "yes",
            "no stage reads device data on the host; buffers are sized by max_num_tokens",
        )


def join_split(plan: Plan, above: Plan) -> None:
    """The two plans of a GEMM split run one set of weights: the same layer, the same weight
    tensors, the same layout; the package needs what either needs."""

    def weights(p: Plan) -> dict:
        return {n: t for s in p.order() for n, t in s.weights.items()}

    if plan.layer != above.layer or weights(plan) != weights(above):
        raise AssertionError("moec bug: the plans of a GEMM split hold different weights")
    if plan.backends.layout != above.backends.layout:
        raise AssertionError("moec bug: the plans of a GEMM split lay rows out differently")
    plan.requires = tuple(sorted(set(plan.requires) | set(above.requires)))
    plan.missing = tuple(sorted(set(plan.missing) | set(above.missing)))
