"""Tune the memory-bound kernels: permute (+ quantize), act (+ quantize) and combine.

They run on T * K rows at one T (where they cost most; 4096 or the spec's max_num_tokens). Every
output element is computed the same way whatever the tile (no reduction crosses tiles in another
order), so each candidate must reproduce, bit for bit, what the package's own tiles (tiles.py,
tested by the kernel suite) write; a candidate that differs, or leaves an element unwritten
(outputs are poisoned with NaN first), is rejected before it is timed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from moec.tune.measure import Config, Trial, run_trials, synchronize

E4M3 = torch.float8_e4m3fn


@dataclass(frozen=True)
class ElementwiseKernels:
    """The package's launchers, act bound to the layer's activation."""

    permute_quant: Callable
    act_quant: Callable
    combine: Callable


def _poison(tensors) -> None:
    for tensor in tensors:
        tensor.view(torch.uint8).fill_(0xFF)  # NaN in e4m3fn, bf16, fp16 and fp32


def _bits(tensors) -> list[torch.Tensor]:
    return [tensor.view(torch.uint8).clone() for tensor in tensors]


class ElementwiseTuner:
    """The three kernels on random data of one layer's sizes and activation quantization."""

    def __init__(
        self,
        kernels,
        quant: dict[str, Any],
        hidden,
        intermediate,
        tokens,
        top_k,
        dtype,
        device,
        seed=0,
    ):
        gen = torch.Generator(device).manual_seed(seed)
        rows = tokens * top_k
        mode = quant["quant"]
        self.kernels, self.device = kernels, device
        self.options = {
            "quant": mode,
            **{k: v for k, v in quant.items() if k in ("group_size", "pow2_scales")},
            **({"dynamic": True} if mode == "tensor" else {}),
        }

        def randn(*shape):
            return torch.randn(*shape, generator=gen, device=device).to(dtype)

        self.x, self.h, self.y = (
            randn(tokens, hidden),
            randn(rows, 2 * intermediate),
            randn(rows, hidden),
        )
        self.row_of = (
            torch.randperm(rows, generator=gen, device=device).view(tokens, top_k).to(torch.int32)
        )
        self.weights = torch.rand(tokens, top_k, generator=gen, device=device)
        quantized = mode != "none"
        value = E4M3 if quantized else dtype
        group = quant.get("group_size", 128)
        self.a = torch.empty(rows, hidden, dtype=value, device=device)
        self.g = torch.empty(rows, intermediate, dtype=value, device=device)
        self.a_scale = self._scale(rows, hidden, group, mode)
        self.g_scale = self._scale(rows, intermediate, group, mode)
        self.out = torch.empty(tokens, hidden, dtype=dtype, device=device)

    def _scale(self, rows: int, cols: int, group: int, mode: str) -> torch.Tensor | None:
        if mode == "none":
            return None
        shape = (1,) if mode == "tensor" else (rows, -(-cols // group))
        return torch.empty(shape, dtype=torch.float32, device=self.device)

    def outputs(self, kernel: str) -> list[torch.Tensor]:
        """What `kernel` writes."""
        written: dict[str, list[torch.Tensor | None]] = {
            "permute": [self.a, self.a_scale],
            "act": [self.g, self.g_scale],
            "combine": [self.out],
        }
        return [t for t in written[kernel] if t is not None]

    def launch(self, kernel: str, config: Config) -> None:
        k = self.kernels
        if kernel == "permute":
            k.permute_quant(
                self.x, self.row_of, self.a, self.a_scale, config=config, **self.options
            )
        elif kernel == "act":
            k.act_quant(self.h, self.g, self.g_scale, config=config, **self.options)
        else:
            k.combine(self.y, self.row_of, self.weights, self.out, self.x, config=config)

    def trials(
        self, kernel: str, anchor: Config, configs: list[Config], timer, step
    ) -> list[Trial]:
        """Every config of `kernel`, checked against the bytes `anchor` (the package's tiles)
        writes, then timed; the anchor itself is timed first."""
        outputs = self.outputs(kernel)
        _poison(outputs)
        self.launch(kernel, anchor)
        synchronize(self.device)
        expected = _bits(outputs)

        def check(config: Config) -> str | None:
            _poison(outputs)
            self.launch(kernel, config)
            synchronize(self.device)
            differ = sum(
                int((got != want).sum()) for got, want in zip(_bits(outputs), expected, strict=True)
            )
            return None if differ == 0 else f"{differ} bytes differ from the package's tiles"

        candidates = [anchor, *(c for c in configs if c != anchor)]
        return run_trials(candidates, check, lambda c: self.launch(kernel, c), timer, step)
