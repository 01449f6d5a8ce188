"""A CPU stand-in for DeepGEMM's m-grouped GEMMs (the calls moec makes), in plain torch.

Like DeepGEMM on sm90 it takes fp8 activations with 1 x 128 fp32 scales, K-major or MN-major and
TMA-aligned (it asserts one of the two), weights with 128 x 128 scales, skips 128-row blocks whose
first m_indices entry is -1 (or, with use_psum_layout, takes the grouped layout as each expert's
end row, [E], each expert starting at the previous end rounded up to 128; rows past an end are
left as they were), and writes bf16 outputs (fp32 sums, one rounding)."""

import torch

__version__ = "stand-in"
CALLS: list[str] = []
"""Names of the functions called, in order (tests read it)."""


def get_mk_alignment_for_contiguous_layout() -> int:
    return 128


def _check_activation_scales(scale: torch.Tensor) -> None:
    rows = scale.shape[-2]
    aligned = -(-rows // 4) * 4
    k_major = scale.stride(-1) == 1
    mn_major = scale.stride(-2) == 1 and scale.stride(-1) == aligned
    assert k_major or mn_major, f"activation scales with strides {scale.stride()}"


def _dequantize(values: torch.Tensor, scale: torch.Tensor, block_rows: int) -> torch.Tensor:
    rows, cols = values.shape
    full = scale.float().repeat_interleave(block_rows, 0)[:rows].repeat_interleave(128, 1)
    return values.float() * full[:, :cols]


def _row_blocks(grouped_layout, rows: int, experts: int, psum: bool):
    """(expert, row slice) of each group of rows the GEMM computes, in either layout form."""
    assert grouped_layout.dtype == torch.int32 and grouped_layout.is_contiguous()
    if not psum:
        assert grouped_layout.shape == (rows,), "m_indices must have one entry per row"
        for start in range(0, rows, 128):
            expert = int(grouped_layout[start])
            if expert >= 0:
                yield expert, slice(start, start + 128)
        return
    assert grouped_layout.shape == (experts,), "a psum layout has one end row per expert"
    start = 0
    for expert, end in enumerate(grouped_layout.tolist()):
        assert start <= end <= rows, f"expert {expert} ends at row {end}, before {start}"
        yield expert, slice(start, end)
        start = -(-end // 128) * 128


def m_grouped_fp8_gemm_nt_contiguous(
    a, b, d, grouped_layout, disable_ue8m0_cast=False, use_psum_layout=False, **_
):
    CALLS.append("m_grouped_fp8_gemm_nt_contiguous" + ("(psum)" if use_psum_layout else ""))
    (a_values, a_scale), (w_values, w_scale) = a, b
    _check_activation_scales(a_scale)
    blocks = _row_blocks(grouped_layout, a_values.shape[0], w_values.shape[0], use_psum_layout)
    for expert, rows in blocks:
        x = _dequantize(a_values[rows], a_scale[rows], 1)
        w = _dequantize(w_values[expert], w_scale[expert], 128)
        d[rows] = (x @ w.T).to(torch.bfloat16)


def m_grouped_fp8_gemm_nt_masked(a, b, d, masked_m, expected_m, disable_ue8m0_cast=False, **_):
    CALLS.append("m_grouped_fp8_gemm_nt_masked")
    (a_values, a_scale), (w_values, w_scale) = a, b
    _check_activation_scales(a_scale)
    assert expected_m > 0
    for expert, count in enumerate(masked_m.tolist()):
        x = _dequantize(a_values[expert, :count], a_scale[expert, :count], 1)
        w = _dequantize(w_values[expert], w_scale[expert], 128)
        d[expert, :count] = (x @ w.T).to(torch.bfloat16)


def m_grouped_bf16_gemm_nt_contiguous(a, b, d, grouped_layout, use_psum_layout=False, **_):
    CALLS.append("m_grouped_bf16_gemm_nt_contiguous" + ("(psum)" if use_psum_layout else ""))
    for expert, rows in _row_blocks(grouped_layout, a.shape[0], b.shape[0], use_psum_layout):
        d[rows] = (a[rows].float() @ b[expert].float().T).to(torch.bfloat16)


def m_grouped_bf16_gemm_nt_masked(a, b, d, masked_m, expected_m, **_):
    CALLS.append("m_grouped_bf16_gemm_nt_masked")
    assert expected_m > 0
    for expert, count in enumerate(masked_m.tolist()):
        d[expert, :count] = (a[expert, :count].float() @ b[expert].float().T).to(torch.bfloat16)
