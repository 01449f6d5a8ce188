"""The plan layer: every decision about one spec, made once, with its reason. No torch here.

`make_plan(spec)` builds the stage graph and runs the passes:

    resolve (auto -> choices) -> stages (unfused graph) -> fuse -> insert converters -> checks

`cost(plan, tokens)` gives the roofline floor and peak memory at a token count.
"""

from __future__ import annotations

from dataclasses import asdict

from moec.plan.cost import Cost, cost
from moec.plan.devices import Device, device_for
from moec.plan.facts import Facts, facts_of
from moec.plan.graph import Decision, Edge, Plan, Stage
from moec.plan.resolve import Environment, resolve
from moec.spec.loader import spec_hash
from moec.spec.models import Spec

__all__ = [
    "Cost",
    "Decision",
    "Device",
    "Edge",
    "Environment",
    "Facts",
    "Plan",
    "Stage",
    "cost",
    "device_for",
    "make_plan",
]

TORCH_BLOCK_M = 128
"""Row padding of the contiguous layout for the torch and deep_gemm backends (DeepGEMM's M
alignment), so the torch backend builds exactly the buffers a DeepGEMM GEMM would take."""


def make_plan(spec: Spec, env: Environment | None = None) -> Plan:
    """The plan of a normalized spec; `env` says what is importable (default: this machine)."""
    from moec.plan.convert import insert_converters
    from moec.plan.fuse import fuse
    from moec.plan.stages import build_stages

    env = env or Environment.detect()
    facts = facts_of(spec)
    decisions: list[Decision] = []

    def decide(what: str, choice: str, reason: str) -> None:
        decisions.append(Decision(what, choice, reason))

    resolved = resolve(spec, facts, env, decide)
    plan = build_stages(spec, facts, resolved)
    plan.decisions[:0] = decisions
    block_m = TORCH_BLOCK_M if resolved.gemm_backend != "triton" else 0
    plan.facts.update(
        {
            "name": spec.name,
            "hash": spec_hash(spec),
            "gemm_backend": resolved.gemm_backend,
            "layout": resolved.layout,
            "dispatch_backend": resolved.dispatch_backend,
            "requires": list(resolved.requires),
            "missing": [m for m in resolved.requires if not env.has(m)],
            "block_m": block_m or 16,
            "target_device": spec.target.device,
            "arch": spec.target.arch,
            "facts": facts,
        }
    )
    if resolved.layout == "contiguous":
        plan.decide(
            "contiguous row padding",
            f"block_m = {block_m}" if block_m else "block_m = the GEMM's BLOCK_M per token bucket",
            "each expert's rows start on a GEMM tile boundary, so a tile never mixes experts"
            + ("; 128 is DeepGEMM's M alignment" if block_m else ""),
        )
    if resolved.gemm_backend == "triton":
        from moec.plan.tuning import elementwise_configs, gemm_buckets

        buckets, source = gemm_buckets(facts)
        plan.facts["buckets"] = buckets
        plan.facts["elementwise"] = elementwise_configs(facts)
        limits = ", ".join(
            f"T<={b['max_tokens']}" if b["max_tokens"] else "larger" for b in buckets
        )
        plan.decide("triton tiles", f"{len(buckets)} token buckets ({limits})", source)
        if plan.has("shared_expert"):
            plan.decide(
                "shared expert tiles",
                "the routed experts' bucket for T",
                "the shared MLP runs as a one-expert grouped GEMM over T rows with the same "
                "kernels; it has no table of its own",
            )
    if resolved.gemm_backend == "triton":
        plan.decide(
            "router and top-k",
            "fp32 GEMM in torch; top-k and routing indices in Triton",
            "the router GEMM is one cuBLAS call; selection and the layout's indices are two "
            "Triton launches instead of ~30 small torch kernels on the decode critical path",
        )
    else:
        plan.decide(
            "router and top-k",
            "torch",
            "an [T, H] x [H, E] fp32 GEMM and elementwise top-k: a few percent of the layer's bytes",
        )
    fuse(plan, facts)
    insert_converters(plan)
    _decide_graph_safety(plan)
    return plan


def _decide_graph_safety(plan: Plan) -> None:
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


def facts(plan: Plan) -> Facts:
    return plan.facts["facts"]


def plan_summary(plan: Plan) -> dict[str, object]:
    """Resolved facts as plain data (for plan.json and explain --format json)."""
    data = {k: v for k, v in plan.facts.items() if k != "facts"}
    data["dims"] = asdict(plan.facts["facts"])
    return data
