"""Random grouped-GEMM operands in a layer's number format, and the check every tile candidate
passes before `moec tune` times it.

The check compares sampled output rows with the fp64 product of the dequantized operands. Bound
(docs/numerics.md, Grouped GEMM; tests/kernel_tests/test_grouped_gemm.py uses the same): for each
output element of a correct kernel
    |out - ref| <= u_out * |ref| + (K + 3 * ceil(K / BLOCK_K) + 4) * 2**-24 * sum_k |a_k * w_k|
where u_out is the unit roundoff of the output dtype (one final rounding: 2**-8 for bf16) and the
second term bounds fp32 accumulation of K exact products plus the per-K-block scale multiplies
of the block-scaled schemes. It comes from the formats, not from measurements: a config that
breaks it on any sampled element is wrong, however fast (FACTS.md: a warp-specialized TMA kernel
with 4 warps was fastest and off by 0.3 to 300 relative).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from moec.runtime import quant

E4M3 = torch.float8_e4m3fn
UNIT_ROUNDOFF = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float32: 2.0**-24}
"""Round-to-nearest puts a value of each output dtype within u * |value|."""
GROUP = {"fp8_block": 128, "mxfp8": 32, "mxfp4": 32}
"""Scale group along K of the block-scaled schemes' activations (and weights, 128 x 128 for
fp8_block, 1 x 32 for mx)."""
SAMPLED_ROWS = 64


@dataclass(frozen=True)
class Weights:
    """W [E, N, K] of one grouped GEMM in a scheme's format, with its scales (None for bf16)."""

    scheme: str
    w: torch.Tensor
    w_scale: torch.Tensor | None


def _e4m3(shape, gen, device) -> torch.Tensor:
    return (torch.randn(shape, generator=gen, device=device) * 64).clamp(-448, 448).to(E4M3)


def _scales(shape, gen, device, pow2_scales: bool) -> torch.Tensor:
    if pow2_scales:
        return 2.0 ** torch.randint(-9, -3, shape, generator=gen, device=device).float()
    return (torch.rand(shape, generator=gen, device=device) + 0.5) * 2.0**-7


def random_weights(scheme, experts, n, k, dtype, device, gen) -> Weights:
    """Random weights of `scheme`, filled one expert at a time (no [E, N, K] fp32 temporary)."""
    mx = scheme in ("mxfp8", "mxfp4")
    if scheme == "bf16":
        w = torch.empty(experts, n, k, dtype=dtype, device=device)
    elif scheme == "mxfp4":
        w = torch.empty(experts, n, k // 2, dtype=torch.uint8, device=device)
    else:
        w = torch.empty(experts, n, k, dtype=E4M3, device=device)
    for e in range(experts):
        if scheme == "bf16":
            w[e] = (torch.randn(n, k, generator=gen, device=device) / k**0.5).to(dtype)
        elif scheme == "mxfp4":
            w[e] = torch.randint(0, 256, (n, k // 2), generator=gen, device=device).to(torch.uint8)
        else:
            w[e] = _e4m3((n, k), gen, device)
    scale_shape = {
        "bf16": None,
        "fp8_per_tensor": (experts,),
        "fp8_block": (experts, -(-n // 128), -(-k // 128)),
    }.get(scheme, (experts, n, k // 32))
    w_scale = None if scale_shape is None else _scales(scale_shape, gen, device, mx)
    return Weights(scheme, w, w_scale)


def random_activations(scheme, rows, k, dtype, device, gen):
    """(a [rows, K], a_scale or None) in the scheme's activation format."""
    if scheme == "bf16":
        return torch.randn(rows, k, generator=gen, device=device).to(dtype), None
    a = _e4m3((rows, k), gen, device)
    if scheme == "fp8_per_tensor":
        return a, _scales((1,), gen, device, False)
    shape = (rows, -(-k // GROUP[scheme]))
    return a, _scales(shape, gen, device, scheme != "fp8_block")


def _dequantize_rows(scheme, a, a_scale) -> torch.Tensor:
    """fp64 values of activation rows a [S, K]."""
    if a_scale is None:
        return a.double()
    if scheme == "fp8_per_tensor":
        return a.double() * a_scale.double()
    group = GROUP[scheme]
    return a.double() * a_scale.double().repeat_interleave(group, dim=-1)[:, : a.shape[1]]


def _dequantize_expert(weights: Weights, e: int) -> torch.Tensor:
    """fp64 values of expert e's weight [N, K]."""
    w, scale = weights.w[e], weights.w_scale
    if weights.scheme == "bf16":
        return w.double()
    assert scale is not None  # every quantized scheme's weights have scales
    if weights.scheme == "fp8_per_tensor":
        return w.double() * scale[e].double()
    if weights.scheme == "fp8_block":
        n, k = w.shape
        full = scale[e].double().repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k]
        return w.double() * full
    values = quant.unpack_e2m1(w).double() if weights.scheme == "mxfp4" else w.double()
    return values * scale[e].double().repeat_interleave(32, dim=1)


@dataclass(frozen=True)
class RowReference:
    """fp64 reference of sampled output rows, and what the bound needs of them."""

    rows: torch.Tensor
    """[S] indices of the sampled rows in the layout."""
    expected: torch.Tensor
    """[S, N] fp64 products of the dequantized operands."""
    magnitude: torch.Tensor
    """[S, N] fp64 sum_k |a_k * w_k|."""
    k: int

    def verdict(self, out: torch.Tensor, block_k: int) -> str | None:
        """Why `out` (the kernel's [M, N]) is wrong on the sampled rows, or None."""
        got = out[self.rows].double()
        if not torch.isfinite(got).all():
            return "sampled rows not written (NaN) or not finite"
        u = UNIT_ROUNDOFF[out.dtype]
        gamma = (self.k + 3 * -(-self.k // block_k) + 4) * 2.0**-24
        bound = u * self.expected.abs() + gamma * self.magnitude
        excess = ((got - self.expected).abs() / bound.clamp(min=1e-300)).max().item()
        return None if excess <= 1.0 else f"error up to {excess:.3g}x the fp32 bound"


def row_reference(weights: Weights, a, a_scale, m_indices, gen) -> RowReference:
    """The reference of up to SAMPLED_ROWS random valid rows (m_indices >= 0) of the layout."""
    valid = (m_indices >= 0).nonzero().flatten()
    pick = torch.randperm(valid.numel(), generator=gen, device=valid.device)[:SAMPLED_ROWS]
    rows = valid[pick].sort().values
    scale_rows = a_scale if a_scale is None or a_scale.dim() < 2 else a_scale[rows]
    values = _dequantize_rows(weights.scheme, a[rows], scale_rows)  # [S, K]
    experts = m_indices[rows].long()
    n = weights.w.shape[1]
    expected = torch.empty(len(rows), n, dtype=torch.float64, device=a.device)
    magnitude = torch.empty_like(expected)
    for e in experts.unique().tolist():
        mine = (experts == e).nonzero().flatten()
        w = _dequantize_expert(weights, e)  # [N, K]
        expected[mine] = values[mine] @ w.T
        magnitude[mine] = values[mine].abs() @ w.abs().T
    return RowReference(rows, expected, magnitude, a.shape[1])
