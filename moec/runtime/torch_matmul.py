"""Matmuls and activation quantizers of the torch backend, one function per number format.

Each matmul takes (a [rows, K], a_scale, w [N, K], w_scale) and returns [rows, N] in `out_dtype`,
accumulating in fp32 over the dequantized operands and rounding once, as docs/numerics.md
defines. A stage binds a format's block sizes once with functools.partial.
"""

import torch
import torch.nn.functional as F

from . import quant


def quantize_groups(
    x: torch.Tensor, group: int, pow2_scales: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., K] -> e4m3 [..., K] and fp32 scales [..., K/group], one per 1 x group
    (rounded up to powers of two when `pow2_scales`)."""
    q, scale = quant.quantize_blocks(x.reshape(-1, x.shape[-1]), 1, group, pow2_scales=pow2_scales)
    return q.view(x.shape), scale.view(*x.shape[:-1], scale.shape[-1])


def quantize_per_tensor(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., K] -> e4m3 and one dynamic fp32 scale [1]. Padding rows are zero: they do not move
    the amax."""
    return quant.quantize_tensor(x)


def quantize_static(x: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., K] -> e4m3 with the checkpoint's static per-tensor scale (returned with it)."""
    return quant.quantize_with_scale(x, scale), scale


def matmul_bf16(a, a_scale, w, w_scale, *, out_dtype: torch.dtype) -> torch.Tensor:
    """Unquantized: fp32 accumulation, one rounding to `out_dtype` (cuBLAS does this on CUDA;
    on a CPU the operands are upcast first)."""
    if a.is_cuda:
        return F.linear(a, w)
    return F.linear(a.float(), w.float()).to(out_dtype)


def matmul_fp8_per_tensor(a, a_scale, w, w_scale, *, out_dtype: torch.dtype) -> torch.Tensor:
    """e4m3 x e4m3 with one scale each."""
    return F.linear(a.float() * a_scale, w.float() * w_scale).to(out_dtype)


def matmul_block_scaled(
    a, a_scale, w, w_scale, *, group: int, block: tuple[int, int], out_dtype: torch.dtype
) -> torch.Tensor:
    """e4m3 x e4m3: activations in 1 x group groups, weights in block[0] x block[1] blocks
    (fp8_block and mxfp8)."""
    a32 = quant.dequantize_blocks(a, a_scale, 1, group)
    w32 = quant.dequantize_blocks(w, w_scale, block[0], block[1])
    return F.linear(a32, w32).to(out_dtype)


def matmul_mxfp4(a, a_scale, w, w_scale, *, out_dtype: torch.dtype) -> torch.Tensor:
    """mxfp8 activations (1 x 32) x packed e2m1 weights (1 x 32)."""
    a32 = quant.dequantize_blocks(a, a_scale, 1, 32)
    w32 = quant.dequantize_blocks(quant.unpack_e2m1(w), w_scale, 1, 32)
    return F.linear(a32, w32).to(out_dtype)
