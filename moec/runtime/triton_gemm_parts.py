"""What the two grouped GEMM kernels (triton_gemm: one program per tile; triton_gemm_tma: TMA
loads, a persistent grid) share, written once. Triton inlines each call.

grouped_tile        tile -> (pid_m, pid_n), GROUP_SIZE_M row blocks at a time along M, so that
                    programs running together read the same weight tiles (L2 reuse; Triton's
                    matmul tutorial).
block_scales        the fp8_block scales of one 128-wide K block: each row's activation scale,
                    and the weight's: one scalar where the tile lies in one 128-row weight block
                    (128 % BLOCK_N == 0), else one per output column.
apply_block_scales  a K block's partial product times those scales, in the order the kernels
                    have always multiplied them (the rounding of fp32 products depends on it).
"""

import triton
import triton.language as tl


@triton.jit
def grouped_tile(tile, num_pid_m, num_pid_n, GROUP_SIZE_M: tl.constexpr):
    first_pid_m = (tile // (GROUP_SIZE_M * num_pid_n)) * GROUP_SIZE_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_SIZE_M)
    pid_m = first_pid_m + ((tile % (GROUP_SIZE_M * num_pid_n)) % group_size_m)
    pid_n = (tile % (GROUP_SIZE_M * num_pid_n)) // group_size_m
    return pid_m, pid_n


@triton.jit
def block_scales(
    a_scale_ptr,
    a_rows,
    valid,
    w_scale_ptr,  # this expert's weight scales
    n0,
    offs_n,
    N,
    k_block,
    stride_asm,
    stride_ask,
    stride_wsn,
    stride_wsk,
    BLOCK_N: tl.constexpr,
):
    a_s = tl.load(a_scale_ptr + a_rows * stride_asm + k_block * stride_ask, mask=valid, other=0.0)
    if 128 % BLOCK_N == 0:
        w_s = tl.load(w_scale_ptr + (n0 // 128) * stride_wsn + k_block * stride_wsk)
    else:
        w_ptrs = w_scale_ptr + (offs_n // 128) * stride_wsn + k_block * stride_wsk
        w_s = tl.load(w_ptrs, mask=offs_n < N, other=0.0)
    return a_s, w_s


@triton.jit
def apply_block_scales(partial, a_s, w_s, BLOCK_N: tl.constexpr, SWAP_AB: tl.constexpr):
    """partial: [BLOCK_M, BLOCK_N], or [BLOCK_N, BLOCK_M] with SWAP_AB (W A^T)."""
    if 128 % BLOCK_N == 0:  # one weight scale: folded into the rows' scales
        if SWAP_AB:
            scaled = partial * (a_s * w_s)[None, :]
        else:
            scaled = partial * (a_s * w_s)[:, None]
    elif SWAP_AB:
        scaled = partial * w_s[:, None] * a_s[None, :]
    else:
        scaled = partial * a_s[:, None] * w_s[None, :]
    return scaled
