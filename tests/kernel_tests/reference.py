"""Plain-torch definitions from docs/numerics.md that the kernel tests compare against.

Nothing here imports the kernels: quantization, power-of-two (UE8M0) rounding, e2m1 decoding and the two grouped
layouts are written out from the numerics page.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0
# Unit roundoff of each output dtype: round-to-nearest puts a value within u * |value|.
UNIT_ROUNDOFF = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float32: 2.0**-24}
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def ue8m0_round_up(scale: torch.Tensor) -> torch.Tensor:
    """2 ** ceil(log2(scale)) for positive fp32 scales, exactly: frexp gives scale = m * 2**e with
    m in [0.5, 1); scale is a power of two iff m == 0.5, else the next power up is 2**e. (A float32
    log2 rounds log2(2**k * (1 + 2**-23)) down to k, so it must not be used here.)"""
    mantissa, exponent = torch.frexp(scale)
    return torch.where(mantissa == 0.5, scale, torch.ldexp(torch.ones_like(scale), exponent))


def quant_scale(amax: torch.Tensor, pow2_scales: bool) -> torch.Tensor:
    scale = amax.float().clamp(min=1e-10) / E4M3_MAX
    return ue8m0_round_up(scale) if pow2_scales else scale


def quant_e4m3(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return (x.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)


def quant_group(
    x: torch.Tensor, group: int, pow2_scales: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row, per-group dynamic quantization: (e4m3 [rows, cols], fp32 scales [rows, groups])."""
    rows, cols = x.shape
    groups = -(-cols // group)
    padded = torch.zeros(rows, groups * group, dtype=torch.float32)
    padded[:, :cols] = x.float()
    padded = padded.view(rows, groups, group)
    scale = quant_scale(padded.abs().amax(dim=-1), pow2_scales)
    q = quant_e4m3(padded, scale[..., None]).view(rows, groups * group)[:, :cols]
    return q.contiguous(), scale


def quant_tensor(x: torch.Tensor, pow2_scales: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic per-tensor quantization: (e4m3, fp32 scale [1])."""
    amax = x.float().abs().amax() if x.numel() else torch.tensor(0.0)
    scale = quant_scale(amax.reshape(1), pow2_scales)
    return quant_e4m3(x, scale), scale


def dequant_group(q: torch.Tensor, scale: torch.Tensor, group: int) -> torch.Tensor:
    """fp64 value x its group scale; q [..., cols], scale [..., ceil(cols / group)]."""
    expanded = scale.double().repeat_interleave(group, dim=-1)[..., : q.shape[-1]]
    return q.double() * expanded


def e2m1_unpack(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [..., K/2] -> fp64 [..., K]: low nibble = even column, bit 3 = sign."""
    table = torch.tensor(E2M1_VALUES, dtype=torch.float64)
    nibbles = torch.stack([packed & 0xF, packed >> 4], dim=-1).flatten(-2).long()
    value = table[nibbles & 7]
    return torch.where(nibbles >= 8, -value, value)


def e2m1_pack(codes: torch.Tensor) -> torch.Tensor:
    """int codes 0..15 [..., K] -> uint8 [..., K/2]."""
    codes = codes.to(torch.uint8)
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


@dataclass
class Routing:
    """One routing of T tokens to top-k of E experts, in both grouped layouts."""

    topk_ids: torch.Tensor  # [T, K] int64
    # contiguous
    m_indices: torch.Tensor  # [M] int32, -1 = padding
    token_of_row: torch.Tensor  # [M] int32
    row_of: torch.Tensor  # [T, K] int32
    # masked
    max_m: int
    masked_m: torch.Tensor  # [E] int32
    masked_token_of_row: torch.Tensor  # [E * max_m] int32
    masked_row_of: torch.Tensor  # [T, K] int32


def route(tokens: int, topk: int, experts: int, block_m: int, seed: int = 0) -> Routing:
    """Random distinct top-k experts per token, laid out as numerics.md says: a stable sort by
    expert, each expert's rows padded to a multiple of block_m (contiguous, M = the worst case
    M_max) or placed in slots of [E, max_m] (masked, max_m = T)."""
    gen = torch.Generator().manual_seed(seed)
    topk_ids = torch.stack([torch.randperm(experts, generator=gen)[:topk] for _ in range(tokens)])
    topk_ids = topk_ids.reshape(tokens, topk)
    assignments = tokens * topk
    distinct = min(assignments, experts)
    rows = block_m * (distinct + (assignments - distinct) // block_m)
    m_indices = torch.full((rows,), -1, dtype=torch.int32)
    token_of_row = torch.full((rows,), -1, dtype=torch.int32)
    row_of = torch.empty(tokens, topk, dtype=torch.int32)
    masked_m = torch.zeros(experts, dtype=torch.int32)
    max_m = tokens
    masked_token_of_row = torch.full((experts * max_m,), -1, dtype=torch.int32)
    masked_row_of = torch.empty(tokens, topk, dtype=torch.int32)
    start = 0
    for e in range(experts):
        ts, ks = (topk_ids == e).nonzero(as_tuple=True)  # token order: a stable sort
        count = len(ts)
        m_indices[start : start + count] = e
        token_of_row[start : start + count] = ts.int()
        row_of[ts, ks] = torch.arange(start, start + count, dtype=torch.int32)
        start += -(-count // block_m) * block_m
        masked_m[e] = count
        masked_token_of_row[e * max_m : e * max_m + count] = ts.int()
        masked_row_of[ts, ks] = e * max_m + torch.arange(count, dtype=torch.int32)
    assert start <= rows
    return Routing(
        topk_ids,
        m_indices,
        token_of_row,
        row_of,
        max_m,
        masked_m,
        masked_token_of_row,
        masked_row_of,
    )


def poison(t: torch.Tensor) -> torch.Tensor:
    """Fill with NaN (0xFF bytes are NaN in e4m3 too), so unwritten elements show."""
    if t.dtype == E4M3:
        t.view(torch.uint8).fill_(0xFF)
    else:
        t.fill_(float("nan"))
    return t


def is_nan(t: torch.Tensor) -> torch.Tensor:
    return t.float().isnan()
