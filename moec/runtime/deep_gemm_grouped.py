"""The expert GEMMs through DeepGEMM's m-grouped NT kernels (DeepGEMM 2.6, github
deepseek-ai/DeepGEMM): out[rows] = a[rows] @ w[expert]^T, bf16 out, fp32 accumulation (DeepGEMM
promotes its fp8 tensor-core sums to fp32 every 128 K).

fp8: a e4m3 [.., K] with 1 x 128 fp32 scales, w e4m3 [E, N, K] with 128 x 128 fp32 scales
[E, N/128, K/128]. On sm90 DeepGEMM reads activation scales MN-major and TMA-aligned; scales
handed over in that layout are used as they are, others are transposed inside the call.
contiguous: each expert's rows start on a 128-row boundary (`get_mk_alignment_for_contiguous_
layout()`), `m_indices` names each row's expert, -1 for padding (blocks starting with -1 are
skipped). contiguous_psum: the same rows, told by each expert's end row (`routing.ends`,
DeepGEMM's `use_psum_layout=True`): its scheduler then visits only the experts' own row blocks,
not every 128-row block of the worst-case M. masked: a [E, max_m, K] with `counts` (masked_m)
valid rows per expert, and an `expected_m` hint (rows per expert) by which DeepGEMM picks, and
compiles, its tiles.
"""

import deep_gemm
import torch

ROW_ALIGNMENT = 128
"""DeepGEMM 2.6's M alignment of the contiguous layout on sm90 (get_mk_alignment_for_
contiguous_layout()); moec's plan pads each expert's rows to it."""


def expected_rows(rows: int, experts: int) -> int:
    """The masked GEMMs' expected_m: rows per expert, rounded up to a power of two so that a
    handful of token counts share each compiled kernel."""
    mean = max(1, -(-rows // experts))
    return 1 << (mean - 1).bit_length()


def fp8_contiguous(a, a_scale, w, w_scale, routing, *, out_dtype):
    """a [M, K] e4m3 (+ [M, K/128]), w [E, N, K] e4m3 (+ [E, N/128, K/128]) -> [M, N] bf16."""
    out = torch.empty((a.shape[0], w.shape[1]), dtype=out_dtype, device=a.device)
    deep_gemm.m_grouped_fp8_gemm_nt_contiguous(
        (a, a_scale), (w, w_scale), out, routing.m_indices, disable_ue8m0_cast=True
    )
    return out


def fp8_contiguous_psum(a, a_scale, w, w_scale, routing, *, out_dtype):
    """As fp8_contiguous, the layout told by routing.ends [E] int32."""
    out = torch.empty((a.shape[0], w.shape[1]), dtype=out_dtype, device=a.device)
    deep_gemm.m_grouped_fp8_gemm_nt_contiguous(
        (a, a_scale), (w, w_scale), out, routing.ends, disable_ue8m0_cast=True, use_psum_layout=True
    )
    return out


def fp8_masked(a, a_scale, w, w_scale, routing, *, out_dtype):
    """a [E, max_m, K] e4m3 (+ [E, max_m, K/128]), w as above -> [E, max_m, N] bf16."""
    out = torch.empty((*a.shape[:-1], w.shape[1]), dtype=out_dtype, device=a.device)
    expected = expected_rows(routing.row_of.numel(), a.shape[0])
    deep_gemm.m_grouped_fp8_gemm_nt_masked(
        (a, a_scale), (w, w_scale), out, routing.counts, expected, disable_ue8m0_cast=True
    )
    return out


def bf16_contiguous(a, a_scale, w, w_scale, routing, *, out_dtype):
    """a [M, K] bf16, w [E, N, K] bf16 -> [M, N] bf16 (the scales are None)."""
    out = torch.empty((a.shape[0], w.shape[1]), dtype=out_dtype, device=a.device)
    deep_gemm.m_grouped_bf16_gemm_nt_contiguous(a, w, out, routing.m_indices)
    return out


def bf16_contiguous_psum(a, a_scale, w, w_scale, routing, *, out_dtype):
    """As bf16_contiguous, the layout told by routing.ends [E] int32."""
    out = torch.empty((a.shape[0], w.shape[1]), dtype=out_dtype, device=a.device)
    deep_gemm.m_grouped_bf16_gemm_nt_contiguous(a, w, out, routing.ends, use_psum_layout=True)
    return out


def bf16_masked(a, a_scale, w, w_scale, routing, *, out_dtype):
    """a [E, max_m, K] bf16, w [E, N, K] bf16 -> [E, max_m, N] bf16."""
    out = torch.empty((*a.shape[:-1], w.shape[1]), dtype=out_dtype, device=a.device)
    expected = expected_rows(routing.row_of.numel(), a.shape[0])
    deep_gemm.m_grouped_bf16_gemm_nt_masked(a, w, out, routing.counts, expected)
    return out
