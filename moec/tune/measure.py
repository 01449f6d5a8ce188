"""Run, check and time tile candidates on one device: each candidate's output is checked before
it is timed, and one that raises or fails its check is never timed.

Timing: the median of `repeats` runs after `warmup` runs, by CUDA events on a GPU (by the host
clock elsewhere, for dry runs under TRITON_INTERPRET=1).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

Config = dict[str, Any]


@dataclass(frozen=True)
class Trial:
    """One candidate's outcome."""

    config: Config
    ms: float | None
    """Median time, or None when the candidate was rejected."""
    note: str = ""
    """Why it was rejected: "wrong: ..." (failed its check) or "failed: ..." (raised)."""


@dataclass(frozen=True)
class Timer:
    """Median time of a call on `device`."""

    device: str
    warmup: int = 2
    repeats: int = 10

    def __call__(self, fn: Callable[[], object]) -> float:
        for _ in range(self.warmup):
            fn()
        times = [self._once(fn) for _ in range(self.repeats)]
        return sorted(times)[len(times) // 2]

    def _once(self, fn: Callable[[], object]) -> float:
        if self.device != "cuda":
            start = time.perf_counter()
            fn()
            return (time.perf_counter() - start) * 1e3
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        fn()
        end.record()
        end.synchronize()
        return begin.elapsed_time(end)


def run_trials(
    configs: list[Config],
    check: Callable[[Config], str | None],
    launch: Callable[[Config], object],
    timer: Callable[[Callable[[], object]], float],
    step: Callable[[], None] = lambda: None,
) -> list[Trial]:
    """Each config in turn: `check(config)` runs it once and says why its output is wrong (or
    None); only then is `launch(config)` timed. `step` is called after each config."""
    trials = []
    for config in configs:
        try:
            verdict = check(config)
            trial = (
                Trial(config, timer(functools.partial(launch, config)))
                if verdict is None
                else Trial(config, None, f"wrong: {verdict}")
            )
        except Exception as failure:  # any config the compiler or the launcher refuses
            first_line = (str(failure).strip().splitlines() or [""])[0][:120]
            trial = Trial(config, None, f"failed: {type(failure).__name__}: {first_line}")
        trials.append(trial)
        step()
    return trials


def best(trials: list[Trial]) -> Trial | None:
    """The fastest candidate that passed its check, or None when none did."""
    timed = [t for t in trials if t.ms is not None]
    return min(timed, key=lambda t: t.ms or 0.0) if timed else None  # every t.ms is set


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()
