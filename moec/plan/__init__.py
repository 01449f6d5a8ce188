"""The plan layer: every decision about one spec, made once, with its reason. No torch here.

`make_plan(spec)` runs the passes below, top to bottom; each records the decisions it makes.
`cost(plan, device, tokens)` gives the roofline floor and peak memory at a token count.
"""

from __future__ import annotations

from dataclasses import asdict

from moec.errors import MoecError
from moec.plan.cost import Cost, cost
from moec.plan.devices import Device, device_for
from moec.plan.environment import Environment
from moec.plan.graph import Backends, Decision, Edge, GemmSplit, Plan
from moec.plan.layer import Layer, layer_of
from moec.plan.stages import Dispatch, Stage
from moec.spec.loader import spec_hash
from moec.spec.models import Spec
from moec.vocab import Backend

__all__ = [
    "Backends",
    "Cost",
    "Decision",
    "Device",
    "Edge",
    "Environment",
    "GemmSplit",
    "Layer",
    "Plan",
    "Stage",
    "cost",
    "device_for",
    "make_plan",
    "plan_loaded",
    "plan_summary",
]


def make_plan(spec: Spec, env: Environment | None = None, above: GemmSplit | None = None) -> Plan:
    """The plan of a normalized spec on the machine `env` describes (its importable packages
    and tuned tables; default: this machine, `Environment.detect()`), which no pass looks past.
    With a GEMM split (gemm_backend auto, per token bucket), `plan.above` is the plan past it;
    `above` is for that inner call. Raises MoecError when a stage of the plan runs where moec
    does not drive it."""
    from moec.plan import checks, fuse
    from moec.plan.build import build_stages
    from moec.plan.convert import insert_converters
    from moec.plan.resolve import resolve_backends
    from moec.plan.tuning import choose_tiles, order_dispatch_pass

    env = env or Environment.detect()
    decisions: list[Decision] = []

    def decide(what: str, choice: str, reason: str) -> None:
        decisions.append(Decision(what, choice, reason))

    # auto -> gemm backend, layout, dispatch backend; the layer as they store it
    backends, layer = resolve_backends(spec, layer_of(spec), env, decide, above)
    plan = Plan(spec.name, spec_hash(spec), layer, backends, spec.description, decisions=decisions)
    build_stages(plan, spec)  # the unfused stage graph
    plan.verify("build_stages")
    if plan.backends.gemm in (Backend.triton, Backend.deep_gemm):
        choose_tiles(plan, env)  # Triton tile configs, tuned or default
    converted = False  # from insert_converters on, every edge has its consumer's type
    for graph_pass in (
        fuse.fuse_router_select,
        fuse.fuse_activation_quant,
        fuse.fuse_routed_scaling,
        fuse.gather_token_rows,  # before the quantize fusion, whose reason depends on it
        fuse.fuse_quantize_dispatch,
        order_dispatch_pass,  # PDL for the dispatch's pass after the route, if it has one
        fuse.fuse_finalize_combine,
        insert_converters,  # scale-layout converters where types disagree
        fuse.fuse_scale_layout,  # ... unless a Triton quantizer can write that layout itself
    ):
        graph_pass(plan)
        converted = converted or graph_pass is insert_converters
        plan.verify(graph_pass.__name__, converted)
    # every stage runs where moec drives it, or the spec is rejected
    checks.check_support(plan, spec)
    checks.record_requirements(plan, env)  # optional packages imported, and missing here
    checks.decide_graph_safety(plan)  # CUDA graph capture
    split = plan.backends.split
    if split is not None:  # the same layer on the other backend, past the split
        plan.above = make_plan(spec, env, split)
        checks.join_split(plan, plan.above)
    return plan


def plan_loaded(loaded, env: Environment | None = None) -> Plan:
    """The plan of a LoadedSpec; plan problems are located in its file like spec problems."""
    try:
        return make_plan(loaded.spec, env)
    except MoecError as error:
        raise MoecError(loaded.located(error.problems), loaded.source, error.kind) from None


def plan_summary(plan: Plan) -> dict[str, object]:
    """What the plan chose for the whole layer, as plain data (plan.json, explain json)."""
    backends = plan.backends
    dispatch = plan.stage("dispatch", Dispatch)
    return {
        "name": plan.name,
        "hash": plan.spec_hash,
        "gemm_backend": backends.gemm,
        "layout": backends.layout,
        "dispatch": plan.layer.dispatch,
        "dispatch_backend": backends.dispatch,
        "row_padding": dispatch.row_padding,
        "requires": list(plan.requires),
        "missing": list(plan.missing),
        "dims": asdict(plan.layer),
    }
