"""The renderer registry: one renderer per (stage kind, backend), and nothing else renders.

A renderer names its template (the body of the stage's function), the function that fills it
from the plan, the runtime modules its code imports (moec/runtime/, copied into the package),
the optional packages it needs, and, where it cannot render every stage of its kind, why not.
The plan asks this registry before it accepts a spec (`refusal`), `moec explain --matrix` is
built from it, and codegen renders only through it: adding a backend is adding renderers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the renderers import this module to register themselves
    from moec.codegen.renderers.common import StageCode
    from moec.plan.graph import Plan
    from moec.plan.stages import Stage

Fill = Callable[["Plan", Any], "StageCode"]
"""(plan, stage) -> the stage's function as its renderer fills it (the stage: one kind's record)."""
Refuses = Callable[["Plan", Any], "str | None"]
"""(plan, stage) -> why a renderer cannot render the stage, or None."""


def _accept_all(plan: Plan, stage: Stage) -> str | None:
    return None


@dataclass(frozen=True)
class Renderer:
    kind: str
    backend: str
    template: Callable[[Any], str]
    """Template of the function body for a stage (one template per variant)."""
    fill: Fill
    runtime: Callable[[Any], tuple[str, ...]]
    """Runtime modules the stage's code imports (moec/runtime/<name>.py, or generated ones)."""
    requires: tuple[str, ...] = ()
    """Optional packages the generated code imports (deep_gemm, deep_ep, triton)."""
    refuses: Refuses = _accept_all
    """(plan, stage) -> why this renderer cannot render the stage, or None."""


_RENDERERS: dict[tuple[str, str], Renderer] = {}


def _constant(value):
    return lambda stage: value


def register(
    kind: str,
    backend: str,
    template: str | Callable[[Any], str],
    runtime: tuple[str, ...] | Callable[[Any], tuple[str, ...]] = (),
    requires: tuple[str, ...] = (),
    refuses: Refuses | None = None,
) -> Callable[[Fill], Fill]:
    """Register the decorated fill function as the renderer of (kind, backend)."""

    def add(fill: Fill) -> Fill:
        if (kind, backend) in _RENDERERS:
            raise ValueError(f"two renderers for ({kind}, {backend})")
        _RENDERERS[(kind, backend)] = Renderer(
            kind,
            backend,
            template if callable(template) else _constant(template),
            fill,
            runtime if callable(runtime) else _constant(tuple(runtime)),
            tuple(requires),
            refuses or _accept_all,
        )
        return fill

    return add


def _loaded() -> dict[tuple[str, str], Renderer]:
    import moec.codegen.renderers  # noqa: F401  (registers every renderer)

    return _RENDERERS


def renderer(kind: str, backend: str) -> Renderer | None:
    return _loaded().get((kind, backend))


def renderer_of(stage: Stage) -> Renderer:
    """The renderer of a stage the plan accepted (checks.check_renderers found one for each)."""
    found = renderer(stage.kind, stage.backend)
    if found is None:
        raise LookupError(f"moec bug: no renderer for ({stage.kind}, {stage.backend})")
    return found


def backends_for(kind: str) -> frozenset[str]:
    """Backends with a renderer for stages of `kind`."""
    return frozenset(backend for k, backend in _loaded() if k == kind)


def pairs() -> list[tuple[str, str]]:
    """Every registered (kind, backend), sorted."""
    return sorted(_loaded())


def refusal(plan: Plan, stage: Stage) -> str | None:
    """Why `stage` cannot be rendered (no renderer, or the renderer refuses it), or None."""
    found = renderer(stage.kind, stage.backend)
    if found is None:
        others = sorted(backends_for(stage.kind))
        return (
            f"moec renders no {stage.kind} stage on {stage.backend} (only on "
            f"{', '.join(others) or 'nothing'})"
        )
    return found.refuses(plan, stage)
