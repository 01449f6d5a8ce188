"""What moec runs where: for each stage kind, the backends it runs on, the stages of that kind a
backend does not take (and why), and the optional package each backend imports.

The one owner of these facts. `resolve` lets `auto` choose only what this allows, `checks`
refuses a spec whose plan holds a stage this refuses, and codegen has exactly one renderer per
pair listed here (codegen/registry.py checks each renderer it registers against RUNS; the test
tests/test_plan_passes.py checks that every pair has one). The spec's rules (spec/rules.py)
say what the libraries themselves accept; this says which of that moec drives.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from moec.plan.backends import deep_gemm_gemm
from moec.plan.fuse import LAYOUT_STEPS
from moec.plan.graph import Plan
from moec.plan.stages import Stage
from moec.vocab import Backend, ConvertStep, DispatchMode, RouterPrecision, StageKind

Refuses = Callable[[Plan, Any], "str | None"]
"""(plan, stage) -> why the backend does not run this stage of its kind, or None."""

PACKAGE = {Backend.triton: "triton", Backend.deep_gemm: "deep_gemm", Backend.deep_ep: "deep_ep"}
"""The optional package the generated code of a backend's stages imports (torch needs none)."""


def _deep_gemm(plan: Plan, stage: Any) -> str | None:
    return deep_gemm_gemm(stage.format.scheme, plan.layer.arch)


def _transpose_and_pad(plan: Plan, stage: Any) -> str | None:
    other = [step for step in stage.steps if step not in (*LAYOUT_STEPS, ConvertStep.to_k_major)]
    if other:
        return f"moec's scale converter transposes and pads (sm90), it does not {other[0]}"
    return None


def _deepep_modes(plan: Plan, stage: Any) -> str | None:
    if stage.mode not in (DispatchMode.deepep_normal, DispatchMode.deepep_low_latency):
        return f"deep_ep runs the DeepEP dispatch modes, not {stage.mode}"
    return None


def _all2all(plan: Plan, stage: Any) -> str | None:
    if stage.mode != DispatchMode.all2all:
        return f"torch.distributed runs the all2all dispatch, not {stage.mode}"
    return None


def _bf16x3(plan: Plan, stage: Any) -> str | None:
    if stage.precision != RouterPrecision.bf16x3:
        return f"the Triton router runs the bf16x3 split, not {stage.precision}"
    return None


def _any(plan: Plan, stage: Any) -> str | None:
    return None


_K = StageKind
_B = Backend
RUNS: dict[tuple[StageKind, Backend], Refuses] = {
    (_K.router, _B.torch): _any,
    (_K.router, _B.triton): _bf16x3,
    (_K.select, _B.torch): _any,
    (_K.select, _B.triton): _any,
    (_K.place, _B.torch): _any,
    (_K.quantize, _B.torch): _any,
    (_K.quantize, _B.triton): _any,
    (_K.dispatch, _B.torch): _any,
    (_K.dispatch, _B.triton): _any,
    (_K.dispatch, _B.torch_distributed): _all2all,
    (_K.dispatch, _B.deep_ep): _deepep_modes,
    (_K.gemm, _B.torch): _any,
    (_K.gemm, _B.triton): _any,
    (_K.gemm, _B.deep_gemm): _deep_gemm,
    (_K.convert, _B.torch): _transpose_and_pad,
    (_K.activation, _B.torch): _any,
    (_K.activation, _B.triton): _any,
    (_K.combine, _B.torch): _any,
    (_K.combine, _B.triton): _any,
    (_K.combine, _B.torch_distributed): _all2all,
    (_K.combine, _B.deep_ep): _deepep_modes,
    (_K.shared_expert, _B.torch): _any,
    (_K.shared_expert, _B.triton): _any,
    (_K.finalize, _B.torch_distributed): _any,
}
"""(stage kind, backend) -> which stages of that kind the backend does not run."""


def backends_for(kind: StageKind) -> frozenset[Backend]:
    """The backends that run stages of `kind`."""
    return frozenset(backend for k, backend in RUNS if k == kind)


def refusal(plan: Plan, stage: Stage) -> str | None:
    """Why no backend moec drives runs `stage` as planned, or None."""
    refuses = RUNS.get((stage.kind, stage.backend))
    if refuses is None:
        others = ", ".join(sorted(backends_for(stage.kind))) or "nothing"
        return f"moec runs no {stage.kind} stage on {stage.backend} (only on {others})"
    return refuses(plan, stage)
