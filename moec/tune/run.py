"""The measurements of one layer: every token bucket's grouped GEMMs, then the memory-bound
kernels, each candidate checked before it is timed; the result is a table entry in the format
of moec/plan/tuned/h200.json.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from types import ModuleType
from typing import Any

import torch

from moec.codegen.renderers.common import kernel_quant
from moec.errors import MoecError, problem
from moec.plan.layer import Layer
from moec.plan.tables import table_key
from moec.tune import candidates
from moec.tune.elementwise import ElementwiseKernels, ElementwiseTuner
from moec.tune.gemm import BucketChoice, GemmDims, GemmTuner
from moec.tune.measure import Config, Trial, best
from moec.tune.progress import Progress

ELEMENTWISE_TOKENS = 4096
"""T at which the memory-bound kernels are tuned (where they cost most), at most the spec's
max_num_tokens."""


@dataclass(frozen=True)
class Search:
    """What `tune_layer` tries."""

    tokens: tuple[int, ...]
    """Upper token count of each bucket (the last bucket also takes every larger T)."""
    gemm: Callable[[int], list[Config]]
    """T -> the GEMM configs to try at T."""
    elementwise: Callable[[str], list[Config]]
    """kernel (permute, act, combine) -> its tiles to try."""
    elementwise_tokens: int


@dataclass(frozen=True)
class TunedLayer:
    """One layer's entry of a tuned table."""

    key: str
    buckets: list[dict[str, Any]]
    elementwise: dict[str, Config]


def default_search(layer: Layer, tokens: list[int], tma: bool) -> Search:
    """The candidates of moec/tune/candidates.py for this layer; `tma`: sm90 or newer."""
    scheme, experts, top_k = layer.routed.scheme, layer.local_experts, layer.top_k
    return Search(
        tuple(tokens),
        lambda t: candidates.gemm_candidates(t, experts, top_k, scheme, tma),
        candidates.elementwise_candidates,
        min(ELEMENTWISE_TOKENS, layer.max_tokens),
    )


def tune_layer(
    package: ModuleType, layer: Layer, search: Search, device: str, timer, progress: Progress
) -> TunedLayer:
    """Tune the Triton kernels of `package` (built from `layer`'s spec) on `device`."""
    module = partial(_submodule, package)
    dtype = getattr(torch, layer.dtype.torch)
    buckets = _gemm_buckets(module, layer, dtype, search, device, timer, progress)
    tiles = _elementwise_tiles(module, layer, dtype, search, device, timer, progress)
    return TunedLayer(table_key(layer), buckets, tiles)


def _gemm_buckets(module, layer, dtype, search, device, timer, progress) -> list[dict]:
    """One record per bucket of search.tokens, the last open-ended."""
    dims = GemmDims(
        layer.routed.scheme,
        layer.hidden,
        layer.intermediate,
        layer.local_experts,
        layer.top_k,
        dtype,
    )
    gemm = GemmTuner(module("triton_gemm").grouped_gemm, dims, device)
    buckets = [_bucket(gemm, tokens, search, timer, progress) for tokens in search.tokens]
    buckets[-1]["max_tokens"] = None  # the last bucket takes every larger T
    return buckets


def _elementwise_tiles(module, layer, dtype, search, device, timer, progress) -> dict:
    """The chosen tiles of permute, act and combine, each checked against the package's."""
    kernels = ElementwiseKernels(
        module("triton_permute").permute_quant,
        partial(module("triton_act").act_quant, activation=module("gated_activation").triton_gated),
        module("triton_combine").combine,
    )
    tuner = ElementwiseTuner(
        kernels,
        kernel_quant(layer.routed),
        layer.hidden,
        layer.intermediate,
        search.elementwise_tokens,
        layer.top_k,
        dtype,
        device,
    )
    tiles = module("tiles")
    anchors = {"permute": tiles.PERMUTE, "act": tiles.ACT, "combine": tiles.COMBINE}
    return {
        kernel: _elementwise(tuner, kernel, anchors[kernel], search, timer, progress)
        for kernel in candidates.ELEMENTWISE_KERNELS
    }


def search_size(search: Search) -> int:
    """Trials of a whole run: each GEMM config once per GEMM; each elementwise kernel's tiles
    and the package's own (the anchor its candidates are checked against)."""
    gemm = sum(2 * len(search.gemm(tokens)) for tokens in search.tokens)
    return gemm + sum(len(search.elementwise(k)) + 1 for k in candidates.ELEMENTWISE_KERNELS)


def _submodule(package: ModuleType, name: str) -> ModuleType:
    return importlib.import_module(f"{package.__name__}.{name}")


def _bucket(gemm: GemmTuner, tokens: int, search: Search, timer, progress: Progress) -> dict:
    configs = search.gemm(tokens)
    progress.begin(f"T={tokens}", 2 * len(configs))
    start = time.perf_counter()
    choice, trials = gemm.bucket(tokens, configs, timer, progress.step)
    if choice is None:
        raise _nothing_passed(f"the GEMMs at T={tokens}", trials)
    _report_rejected(progress, trials)
    progress.line(
        f"T={tokens}: BLOCK_M {choice.block_m}: gate/up {choice.gate_up.ms:.4f} ms, down "
        f"{choice.down.ms:.4f} ms ({_rejected(trials)} of {len(trials)} rejected, "
        f"{time.perf_counter() - start:.0f} s)"
    )
    return _bucket_record(tokens, choice)


def _bucket_record(tokens: int, choice: BucketChoice) -> dict[str, Any]:
    return {
        "max_tokens": tokens,
        "block_m": choice.block_m,
        "gate_up": choice.gate_up.config,
        "down": choice.down.config,
        "ms": round(choice.ms, 4),
    }


def _elementwise(tuner: ElementwiseTuner, kernel, anchor, search, timer, progress) -> Config:
    configs = search.elementwise(kernel)
    progress.begin(kernel, len(configs) + 1)
    trials = tuner.trials(kernel, anchor, configs, timer, progress.step)
    found = best(trials)
    if found is None:
        raise _nothing_passed(kernel, trials)
    _report_rejected(progress, trials)
    progress.line(f"{kernel}: {found.ms:.4f} ms with {found.config} ({_rejected(trials)} rejected)")
    return found.config


def _rejected(trials: list[Trial]) -> int:
    return sum(t.ms is None for t in trials)


def _report_rejected(progress: Progress, trials: list[Trial]) -> None:
    """A line for each candidate whose output was wrong (those that failed to compile or launch
    are only counted)."""
    for trial in trials:
        if trial.note.startswith("wrong"):
            progress.line(f"  rejected {trial.config}: {trial.note}")


def _nothing_passed(what: str, trials: list[Trial]) -> MoecError:
    notes = sorted({t.note for t in trials if t.note})[:3]
    return MoecError(
        [
            problem(
                "",
                f"no candidate of {what} passed its check: {'; '.join(notes) or 'none tried'}",
                "a moec bug or a GPU problem: please report it with this output",
            )
        ],
        "moec tune",
        kind="backend",
    )
