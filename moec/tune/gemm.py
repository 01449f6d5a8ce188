"""Tune the grouped GEMMs of one token bucket.

T random tokens are routed uniformly to top-k of the layer's E experts and laid out contiguously,
each expert's rows padded to BLOCK_M, as the plan lays them out. Both GEMMs, gate/up (N = 2I,
K = H) and down (N = H, K = I), run every candidate of that BLOCK_M on random operands of the
layer's scheme; each candidate is checked on sampled rows (operands.py) before it is timed. Both
GEMMs of a bucket share BLOCK_M (the layout's row padding): the bucket takes the BLOCK_M whose
best gate/up and best down configs are fastest together.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from moec.runtime import grouping
from moec.tune.measure import Config, Trial, best, run_trials, synchronize
from moec.tune.operands import Weights, random_activations, random_weights, row_reference


@dataclass(frozen=True)
class GemmDims:
    """What the tuner needs of the layer's grouped GEMMs."""

    scheme: str
    hidden: int
    intermediate: int
    experts: int
    top_k: int
    dtype: torch.dtype

    def shapes(self) -> dict[str, tuple[int, int]]:
        """(N, K) of each GEMM."""
        return {
            "gate_up": (2 * self.intermediate, self.hidden),
            "down": (self.hidden, self.intermediate),
        }


@dataclass(frozen=True)
class BucketChoice:
    """The configs a bucket takes."""

    block_m: int
    gate_up: Trial
    """The fastest gate/up config that passed its check at this BLOCK_M."""
    down: Trial

    @property
    def ms(self) -> float:
        """Both GEMMs' time."""
        assert self.gate_up.ms is not None and self.down.ms is not None  # best() trials, timed
        return self.gate_up.ms + self.down.ms


class GemmTuner:
    """Both grouped GEMMs of one layer on one device, with their random weights made once."""

    def __init__(self, grouped_gemm: Callable, dims: GemmDims, device: str, seed: int = 0):
        self.grouped_gemm, self.dims, self.device = grouped_gemm, dims, device
        self.generator = torch.Generator(device).manual_seed(seed)
        self.weights: dict[str, Weights] = {}

    def _weights(self, gemm: str) -> Weights:
        if gemm not in self.weights:
            n, k = self.dims.shapes()[gemm]
            d = self.dims
            self.weights[gemm] = random_weights(
                d.scheme, d.experts, n, k, d.dtype, self.device, self.generator
            )
        return self.weights[gemm]

    def routing(self, tokens: int, block_m: int) -> grouping.ContiguousRouting:
        """Uniform random top-k experts of `tokens` tokens, laid out contiguously."""
        d = self.dims
        scores = torch.rand(tokens, d.experts, generator=self.generator, device=self.device)
        return grouping.route_contiguous(scores.topk(d.top_k, dim=-1).indices, d.experts, block_m)

    def trials(self, gemm, routing, configs, timer, step) -> list[Trial]:
        """Every config of one GEMM over one routing: checked, then timed."""
        d, weights = self.dims, self._weights(gemm)
        n, k = d.shapes()[gemm]
        rows = routing.m_indices.numel()
        a, a_scale = random_activations(d.scheme, rows, k, d.dtype, self.device, self.generator)
        reference = row_reference(weights, a, a_scale, routing.m_indices, self.generator)
        out = torch.empty(rows, n, dtype=d.dtype, device=self.device)

        def launch(config: Config) -> None:
            self.grouped_gemm(
                a,
                a_scale,
                weights.w,
                weights.w_scale,
                out,
                scheme=d.scheme,
                config=config,
                m_indices=routing.m_indices,
                num_rows=routing.num_rows,
            )

        def check(config: Config) -> str | None:
            out.fill_(float("nan"))
            launch(config)
            synchronize(self.device)
            return reference.verdict(out, config["BLOCK_K"])

        return run_trials(configs, check, launch, timer, step)

    def bucket(self, tokens: int, configs: list[Config], timer, step):
        """(the best BLOCK_M and configs for `tokens` tokens, every trial of both GEMMs); the
        choice is None when no BLOCK_M has a config of each GEMM that passed its check."""
        choice, trials = None, []
        for block_m in sorted({c["BLOCK_M"] for c in configs}):
            mine = [c for c in configs if c["BLOCK_M"] == block_m]
            routing = self.routing(tokens, block_m)
            up = self.trials("gate_up", routing, mine, timer, step)
            down = self.trials("down", routing, mine, timer, step)
            trials += up + down
            fastest_up, fastest_down = best(up), best(down)
            if fastest_up and fastest_down:
                candidate = BucketChoice(block_m, fastest_up, fastest_down)
                if choice is None or candidate.ms < choice.ms:
                    choice = candidate
        return choice, trials
