"""The renderer registry: one renderer per (stage kind, backend), and nothing else renders.

A renderer names its template (the body of the stage's function), the function that fills it
from the plan, and the runtime modules its code imports (moec/runtime/, copied into the package).
Which stages a backend runs, and the package it imports, are the plan's facts
(moec/plan/support.py), which the plan checks before it accepts a spec: a renderer exists for
each pair listed there and for nothing else. Codegen renders only through this registry: adding a
backend is adding its pairs to the plan's support table and their renderers here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from moec.plan.support import RUNS
from moec.vocab import Backend, StageKind

if TYPE_CHECKING:  # the renderers import this module to register themselves
    from moec.codegen.renderers.common import StageCode
    from moec.plan.graph import Plan
    from moec.plan.stages import Stage

Fill = Callable[["Plan", Any], "StageCode"]
"""(plan, stage) -> the stage's function as its renderer fills it (the stage: one kind's record)."""


@dataclass(frozen=True)
class Renderer:
    kind: StageKind
    backend: Backend
    template: Callable[[Any], str]
    """Template of the function body for a stage (one template per variant)."""
    fill: Fill
    runtime: Callable[[Any], tuple[str, ...]]
    """Runtime modules the stage's code imports (moec/runtime/<name>.py, or generated ones)."""


_RENDERERS: dict[tuple[StageKind, Backend], Renderer] = {}


def _constant(value):
    return lambda stage: value


def register(
    stage: type[Stage],
    backend: Backend,
    template: str | Callable[[Any], str],
    runtime: tuple[str, ...] | Callable[[Any], tuple[str, ...]] = (),
) -> Callable[[Fill], Fill]:
    """Register the decorated fill function as the renderer of `stage`'s kind on `backend`."""
    kind = stage.kind

    def add(fill: Fill) -> Fill:
        if (kind, backend) not in RUNS:
            raise ValueError(
                f"a renderer for ({kind}, {backend}), which moec/plan/support.py lacks"
            )
        if (kind, backend) in _RENDERERS:
            raise ValueError(f"two renderers for ({kind}, {backend})")
        _RENDERERS[(kind, backend)] = Renderer(
            kind,
            backend,
            template if callable(template) else _constant(template),
            fill,
            runtime if callable(runtime) else _constant(tuple(runtime)),
        )
        return fill

    return add


def _loaded() -> dict[tuple[StageKind, Backend], Renderer]:
    import moec.codegen.renderers  # noqa: F401  (registers every renderer)

    return _RENDERERS


def renderer_of(stage: Stage) -> Renderer:
    """The renderer of a stage the plan accepted (its support table lists the pair)."""
    found = _loaded().get((stage.kind, stage.backend))
    if found is None:
        raise LookupError(f"moec bug: no renderer for ({stage.kind}, {stage.backend})")
    return found


def pairs() -> list[tuple[StageKind, Backend]]:
    """Every registered (kind, backend), sorted."""
    return sorted(_loaded())
