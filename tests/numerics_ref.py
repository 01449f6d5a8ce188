"""An independent float64 reference of the expert math, written from docs/numerics.md.

It reads a generated layer's stored weights, dequantizes them, and computes the routed and
shared experts in float64, either with activations unquantized (`quantize=False`) or quantized
the way the format prescribes (`quantize=True`, emulated in float64).
"""

from __future__ import annotations

import math

import torch

E4M3_MAX = 448.0
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)


def expand(scale: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Block scales [R, C] repeated over [rows, cols]."""
    r = math.ceil(rows / scale.shape[0])
    c = math.ceil(cols / scale.shape[1])
    return scale.double().repeat_interleave(r, 0)[:rows].repeat_interleave(c, 1)[:, :cols]


def dequant(value: torch.Tensor, scale: torch.Tensor | None, scheme: str) -> torch.Tensor:
    """One expert's weight [N, K] as float64."""
    if scheme == "bf16":
        return value.double()
    if scheme == "mxfp4":
        codes = torch.stack((value & 0xF, value >> 4), dim=-1).flatten(-2).long()
        values = E2M1[codes & 7] * torch.where(codes >= 8, -1.0, 1.0).double()
        return values * expand(scale, *values.shape)
    if scheme == "fp8_per_tensor":
        return value.double() * scale.double().reshape(())
    return value.double() * expand(scale, *value.shape)


def quantize_groups(x: torch.Tensor, group: int | None, pow2: bool) -> torch.Tensor:
    """x (float64 [rows, cols]) after e4m3 quantization with per-group (or per-tensor) scales."""
    if group is None:
        scale = (x.abs().max().clamp(min=1e-10) / E4M3_MAX).float().double()
        return (x / scale).clamp(-E4M3_MAX, E4M3_MAX).float().to(
            torch.float8_e4m3fn
        ).double() * scale
    rows, cols = x.shape
    g = x.view(rows, cols // group, group)
    scale = (g.abs().amax(-1, keepdim=True).clamp(min=1e-10) / E4M3_MAX).float().double()
    if pow2:
        scale = torch.exp2(torch.ceil(torch.log2(scale)))
    q = (g / scale).clamp(-E4M3_MAX, E4M3_MAX).float().to(torch.float8_e4m3fn).double()
    return (q * scale).view(rows, cols)


def activation(kind: str, params: dict, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    sig = torch.sigmoid
    if kind == "silu":
        return gate * sig(gate) * up
    if kind == "silu_clamped":
        limit = params["swiglu_limit"]
        g, u = gate.clamp(max=limit), up.clamp(-limit, limit)
        return g * sig(g) * u
    if kind == "oai_swiglu":
        g, u = gate.clamp(max=params["limit"]), up.clamp(-params["limit"], params["limit"])
        return (u + 1) * g * sig(params["alpha"] * g)
    beta, lb = params["beta"], params["linear_beta"]
    return beta * torch.tanh(gate / beta) * sig(gate) * lb * torch.tanh(up / lb)
