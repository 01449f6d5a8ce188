"""grouped_gemm: out[m, n] = sum_k A[m, k] * W[e(m), n, k], fp32 accumulation over the dequantized
operands, rounded once to out's dtype (bf16 / fp16 / fp32).

SCHEME "bf16"        A [M, K], W [E, N, K] in the model dtype.
       "fp8_per_tensor"  A e4m3 + scale [1]; W e4m3 + scale [E]; scales applied once at the end.
       "fp8_block"   A e4m3 + scales [M, ceil(K/128)]; W e4m3 + scales [E, ceil(N/128),
                     ceil(K/128)]; each BLOCK_K (dividing 128) partial dot scaled a_s[m] * w_s[n].
       "mxfp8"       A e4m3 + scales [M, K/32]; W e4m3 + scales [E, N, K/32] (powers of two).
       "mxfp4"       A as mxfp8; W uint8 [E, N, K/2], two e2m1 per byte (low nibble = even k).
                     mx tiles are dequantized in registers (exact in bf16), then one bf16 dot.
LAYOUT "contiguous"  m_indices[M]: each BLOCK_M block is one expert's rows (+ its -1 padding)
                     or all padding; rows with -1, or at or past num_rows[0], are not written.
                     With a_rows[M] (GATHER), A is the tokens' rows [T, K] and layout row r
                     reads A[a_rows[r]] (and its scales): no copy of A into the layout.
       "masked"      A [E, max_m, K], masked_m[E]; rows at or past masked_m[e] are neither read
                     nor written.
       "dense"       every row is expert 0's (a dense MLP, e.g. the shared experts): no index
                     tensor to build.
Each program computes its tile over the whole of K. Split-K tiles (K cut into slices that run as
programs of their own, the last adding the partials) were built and measured: no faster at
decode on the H200 (commit d8fea3e, benchmarks/RESULTS.md run 73).
"""

import torch
import triton
import triton.language as tl

from .triton_gemm_parts import apply_block_scales, block_scales, grouped_tile
from .triton_gemm_tma import grouped_gemm_tma
from .triton_numerics import (
    launch_options,
    round_output,
    wait_inputs,
)


@triton.jit
def _grouped_gemm_e2m1(nibble):
    """int32 e2m1 codes (sign bit 3, exponent bits 2-1, mantissa bit 0) -> their fp32 values."""
    exponent = (nibble >> 1) & 3
    mantissa = nibble & 1
    normal = ((exponent + 126) << 23) | (mantissa << 22)  # (1 + m / 2) * 2**(e - 1)
    bits = tl.where(exponent == 0, mantissa * (126 << 23), normal)  # subnormal: m / 2
    return (bits | ((nibble & 8) << 28)).to(tl.float32, bitcast=True)


@triton.jit
def _grouped_gemm_kernel(
    # pointers
    a_ptr,  # [M, K] (masked: [E * max_m, K])
    a_scale_ptr,  # see SCHEME; unused for bf16
    w_ptr,  # [E, N, K], mxfp4: [E, N, K / 2] uint8
    w_scale_ptr,  # see SCHEME; unused for bf16
    out_ptr,  # [M, N] bf16 / fp16 / fp32
    index_ptr,  # contiguous: m_indices [M] int32; masked: masked_m [E] int32; dense: unused
    num_rows_ptr,  # contiguous with HAS_NUM_ROWS: [1] int32, rows in use
    a_rows_ptr,  # contiguous with GATHER: [M] int32, the row of A each layout row reads
    # dims
    M,  # rows of A (masked: max_m, rows per expert)
    N,
    K,
    E,
    # strides
    stride_am,
    stride_ak,
    stride_we,
    stride_wn,
    stride_wk,
    stride_om,
    stride_on,
    stride_asm,
    stride_ask,
    stride_wse,
    stride_wsn,
    stride_wsk,
    # meta-parameters
    SCHEME: tl.constexpr,
    LAYOUT: tl.constexpr,
    HAS_NUM_ROWS: tl.constexpr,
    GATHER: tl.constexpr,
    UPCAST: tl.constexpr,  # interpreter: dot on fp32 tiles (its bf16 dot is wrong)
    SOFT_ROUND: tl.constexpr,  # interpreter: round to bf16 in software (its cast truncates)
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr,
    SWAP_AB: tl.constexpr,  # bf16 / fp8: compute W A^T (small row counts per expert)
    FP8_ACC: tl.constexpr,  # fp8: K elements summed in the tensor core before fp32 promotion
    PDL: tl.constexpr,
):
    wait_inputs(PDL)
    # Program -> (pid_m, pid_n), grouped along M for L2 reuse (Triton matmul tutorial).
    blocks_per_expert = tl.cdiv(M, BLOCK_M)
    num_pid_m = E * blocks_per_expert if LAYOUT == "masked" else blocks_per_expert
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m, pid_n = grouped_tile(tl.program_id(0), num_pid_m, num_pid_n, GROUP_SIZE_M)

    # Rows of this block, their validity and their expert; blocks with no valid row return.
    if LAYOUT == "masked":
        expert = pid_m // blocks_per_expert
        slot = (pid_m % blocks_per_expert) * BLOCK_M + tl.arange(0, BLOCK_M)
        used = tl.load(index_ptr + expert)
        if (pid_m % blocks_per_expert) * BLOCK_M >= used:
            return
        rows = expert.to(tl.int64) * M + slot
        valid = slot < used
    elif LAYOUT == "dense":
        expert = pid_m * 0  # expert 0, a tensor like the other layouts' expert
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        valid = rows < M
        rows = rows.to(tl.int64)
    else:
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        used = M
        if HAS_NUM_ROWS:
            used = tl.minimum(tl.load(num_rows_ptr), M)
        if pid_m * BLOCK_M >= used:
            return
        expert_of_row = tl.load(index_ptr + rows, mask=rows < used, other=-1)
        expert = tl.max(expert_of_row, axis=0)
        if expert < 0:
            return
        valid = expert_of_row >= 0
        rows = rows.to(tl.int64)
    a_rows = rows  # the rows of A (and of its scales) this block reads
    if GATHER:
        a_rows = tl.load(a_rows_ptr + rows, mask=valid, other=0).to(tl.int64)

    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    w_expert = w_ptr + expert.to(tl.int64) * stride_we
    ws_expert = w_scale_ptr + expert.to(tl.int64) * stride_wse
    if SCHEME == "fp8_per_tensor":
        tensor_scale = tl.load(a_scale_ptr) * tl.load(ws_expert)
    if SWAP_AB:  # out^T = W A^T: the expert's weight rows fill the MMA's M, few tokens its N
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + offs_k
        if SWAP_AB:  # A^T tile [BLOCK_K, BLOCK_M]
            a_mask = (k < K)[:, None] & valid[None, :]
            a = tl.load(
                a_ptr + a_rows[None, :] * stride_am + k[:, None] * stride_ak, mask=a_mask, other=0.0
            )
        else:
            a_mask = valid[:, None] & (k < K)[None, :]
            a = tl.load(
                a_ptr + a_rows[:, None] * stride_am + k[None, :] * stride_ak, mask=a_mask, other=0.0
            )
        if SCHEME == "mxfp8" or SCHEME == "mxfp4":
            # Dequantize both tiles with their 1 x 32 scales: value x 2**e is exact in bf16, and
            # so is each product in fp32. W is handled as [BLOCK_N, BLOCK_K] and transposed.
            g = k0 // 32 + tl.arange(0, BLOCK_K // 32)
            a_s_ptrs = a_scale_ptr + a_rows[:, None] * stride_asm + g[None, :] * stride_ask
            a_s = tl.load(a_s_ptrs, mask=valid[:, None] & (g * 32 < K)[None, :], other=0.0)
            w_s_ptrs = ws_expert + offs_n[:, None] * stride_wsn + g[None, :] * stride_wsk
            w_s = tl.load(w_s_ptrs, mask=(offs_n < N)[:, None] & (g * 32 < K)[None, :], other=0.0)
            a = tl.reshape(a.to(tl.float32), (BLOCK_M, BLOCK_K // 32, 32)) * a_s[:, :, None]
            if SCHEME == "mxfp4":  # bytes [BLOCK_N, BLOCK_K / 2]: low nibble even k, high odd k
                kp = k0 // 2 + tl.arange(0, BLOCK_K // 2)
                w_ptrs = w_expert + offs_n[:, None] * stride_wn + kp[None, :] * stride_wk
                w_mask = (offs_n < N)[:, None] & (kp * 2 < K)[None, :]
                packed = tl.load(w_ptrs, mask=w_mask, other=0).to(tl.int32)
                low, high = _grouped_gemm_e2m1(packed & 0xF), _grouped_gemm_e2m1(packed >> 4)
                w = tl.reshape(tl.join(low, high), (BLOCK_N, BLOCK_K // 32, 32))
            else:
                w_ptrs = w_expert + offs_n[:, None] * stride_wn + k[None, :] * stride_wk
                w_mask = (offs_n < N)[:, None] & (k < K)[None, :]
                w = tl.load(w_ptrs, mask=w_mask, other=0.0).to(tl.float32)
                w = tl.reshape(w, (BLOCK_N, BLOCK_K // 32, 32))
            a = tl.reshape(a, (BLOCK_M, BLOCK_K))
            w = tl.trans(tl.reshape(w * w_s[:, :, None], (BLOCK_N, BLOCK_K)))
            if not UPCAST:
                a = a.to(tl.bfloat16)
                w = w.to(tl.bfloat16)
            acc = tl.dot(a, w, acc)
        elif SWAP_AB:
            w_ptrs = w_expert + offs_n[:, None] * stride_wn + k[None, :] * stride_wk  # W tile
            w = tl.load(w_ptrs, mask=(offs_n < N)[:, None] & (k < K)[None, :], other=0.0)
            if SCHEME == "bf16":
                if UPCAST:
                    a = a.to(tl.float32)
                    w = w.to(tl.float32)
                acc = tl.dot(w, a, acc, input_precision="ieee")
            elif SCHEME == "fp8_per_tensor":  # promoted to fp32 per K block, see below
                acc += tl.dot(w, a, max_num_imprecise_acc=FP8_ACC) * tensor_scale
            else:  # "fp8_block"
                a_s, w_s = block_scales(
                    a_scale_ptr, a_rows, valid, ws_expert, pid_n * BLOCK_N, offs_n, N, k0 // 128,
                    stride_asm, stride_ask, stride_wsn, stride_wsk, BLOCK_N,
                )  # fmt: skip
                partial = tl.dot(w, a, max_num_imprecise_acc=FP8_ACC)
                acc += apply_block_scales(partial, a_s, w_s, BLOCK_N, True)
        else:
            w_ptrs = w_expert + offs_n[None, :] * stride_wn + k[:, None] * stride_wk  # W^T tile
            w = tl.load(w_ptrs, mask=(k < K)[:, None] & (offs_n < N)[None, :], other=0.0)
            if SCHEME == "bf16":
                if UPCAST:
                    a = a.to(tl.float32)
                    w = w.to(tl.float32)
                acc = tl.dot(a, w, acc, input_precision="ieee")
            elif SCHEME == "fp8_per_tensor":
                # Scaled per K block, not once at the end: the multiply keeps each BLOCK_K partial
                # product out of the tensor core's accumulator, whose fp8 accumulation on Hopper
                # is narrower than fp32 (measured over the bound on the H200 without it).
                acc += tl.dot(a, w, max_num_imprecise_acc=FP8_ACC) * tensor_scale
            else:  # "fp8_block": scale each BLOCK_K partial product
                a_s, w_s = block_scales(
                    a_scale_ptr, a_rows, valid, ws_expert, pid_n * BLOCK_N, offs_n, N, k0 // 128,
                    stride_asm, stride_ask, stride_wsn, stride_wsk, BLOCK_N,
                )  # fmt: skip
                partial = tl.dot(a, w, max_num_imprecise_acc=FP8_ACC)
                acc += apply_block_scales(partial, a_s, w_s, BLOCK_N, False)
    if SWAP_AB:
        acc = tl.trans(acc)

    out_ptrs = out_ptr + rows[:, None] * stride_om + offs_n[None, :] * stride_on
    out_mask = valid[:, None] & (offs_n < N)[None, :]
    tl.store(out_ptrs, round_output(acc, out_ptr.dtype.element_ty, SOFT_ROUND), mask=out_mask)


def grouped_gemm(
    a,
    a_scale,
    w,
    w_scale,
    out,
    *,
    scheme,
    config,
    m_indices=None,
    masked_m=None,
    num_rows=None,
    a_rows=None,
    pdl=False,
):
    """out = A @ W[e]^T per row's expert; see the comment above for each scheme's tensors.

    Contiguous layout (pass m_indices [M] int32, optionally num_rows [1] int32 on the device):
    a [M, K], out [M, N]; with a_rows [M] int32, a is [T, K] and row r of the layout reads
    a[a_rows[r]] (not with TMA tiles, which load whole blocks of rows). Masked layout (pass masked_m [E] int32): a [E, max_m, K], out
    [E, max_m, N] (each viewable as 2-D). Dense (pass neither): a [M, K], out [M, N], every row
    expert 0's. Any strides. config: BLOCK_M (dividing the layout's
    row alignment), BLOCK_N, BLOCK_K (dividing 128 for fp8_block, a multiple of 32 for mx),
    GROUP_SIZE_M, num_warps, num_stages; optional SWAP_AB, TMA (+ WARP_SPECIALIZE, PROGRAMS), and
    FP8_ACC: K elements the fp8 tensor cores sum before the fp32 promotion (default 32, one
    Hopper wgmma: Hopper's fp8 accumulation is narrower than fp32, see docs/numerics.md).
    pdl: programmatic dependent launch. Launches nothing when there are no rows. Returns out.
    """
    if m_indices is not None and masked_m is not None:
        raise ValueError("pass m_indices (contiguous), masked_m (masked), or neither (dense)")
    layout = "masked" if masked_m is not None else "dense" if m_indices is None else "contiguous"
    if a_rows is not None and (layout != "contiguous" or config.get("TMA")):
        raise ValueError("a_rows gathers rows of the contiguous layout, without TMA tiles")
    if scheme not in ("bf16", "fp8_per_tensor", "fp8_block", "mxfp8", "mxfp4"):
        raise ValueError(f"unknown scheme {scheme!r}")
    if scheme != "bf16" and (a_scale is None or w_scale is None):
        raise ValueError(f"scheme {scheme!r} needs a_scale and w_scale")
    num_experts, n, k = w.shape[0], w.shape[1], a.shape[-1]
    if scheme == "fp8_block" and 128 % config["BLOCK_K"]:
        raise ValueError(f"fp8_block needs BLOCK_K dividing 128, got {config['BLOCK_K']}")
    if config.get("SWAP_AB") and scheme in ("mxfp8", "mxfp4"):
        raise ValueError(f"SWAP_AB takes bf16 / fp8 schemes, not {scheme}")
    if scheme in ("mxfp8", "mxfp4") and (config["BLOCK_K"] % 32 or k % 32):
        raise ValueError(
            f"{scheme} needs BLOCK_K and K multiples of 32, got {config['BLOCK_K']}, {k}"
        )
    a2 = a.view(-1, k)
    out2 = out.view(-1, n)
    rows = a.shape[1] if masked_m is not None else a.shape[0] if a_rows is None else a_rows.numel()
    if scheme == "bf16":
        a_scale = w_scale = a
    stride_as = (0, 0) if a_scale.dim() < 2 else (a_scale.view(-1, a_scale.shape[-1]).stride())
    stride_ws = (list(w_scale.stride()) + [0, 0])[:3]
    blocks = triton.cdiv(rows, config["BLOCK_M"])
    if masked_m is not None:
        blocks *= num_experts
    grid = (blocks * triton.cdiv(n, config["BLOCK_N"]),)
    if grid[0] == 0:
        return out
    interpret = triton.knobs.runtime.interpret
    if config.get("TMA"):
        grouped_gemm_tma(
            a2,
            a_scale,
            w,
            w_scale,
            out2,
            scheme,
            config,
            layout,
            m_indices if masked_m is None else masked_m,
            num_rows,
            rows,
            stride_as,
            stride_ws,
            interpret,
            pdl,
        )
        return out
    _grouped_gemm_kernel[grid](
        # pointers
        a2,
        a_scale,
        w,
        w_scale,
        out2,
        {"contiguous": m_indices, "masked": masked_m, "dense": a2}[layout],
        num_rows if num_rows is not None else a2,
        a_rows if a_rows is not None else a2,
        # dims
        rows,
        n,
        k,
        num_experts,
        # strides
        a2.stride(0),
        a2.stride(1),
        w.stride(0),
        w.stride(1),
        w.stride(2),
        out2.stride(0),
        out2.stride(1),
        *stride_as,
        *stride_ws,
        # meta-parameters
        SCHEME=scheme,
        LAYOUT=layout,
        HAS_NUM_ROWS=num_rows is not None,
        GATHER=a_rows is not None,
        UPCAST=interpret,
        SOFT_ROUND=interpret,
        BLOCK_M=config["BLOCK_M"],
        BLOCK_N=config["BLOCK_N"],
        BLOCK_K=config["BLOCK_K"],
        GROUP_SIZE_M=config["GROUP_SIZE_M"],
        SWAP_AB=config.get("SWAP_AB", False),
        FP8_ACC=fp8_accumulation(config),
        num_warps=config["num_warps"],
        num_stages=config["num_stages"],
        **launch_options(pdl),
    )
    return out


def fp8_accumulation(config) -> int:
    """K elements one fp8 MMA chain sums before its fp32 promotion: FP8_ACC, at most BLOCK_K."""
    return min(config.get("FP8_ACC", 32), config["BLOCK_K"])


def grouped_gemm_contiguous(
    a, a_scale, w, w_scale, routing, *, scheme, config, out_dtype, gather=False, pdl=False
):
    """The grouped GEMM over a contiguous layout a [M, K] (routing: grouping.ContiguousRouting),
    or with `gather` over the tokens' rows a [T, K], each layout row reading its token's:
    returns [M, N] in out_dtype; padding rows and rows past num_rows are not written."""
    layout_rows = routing.token_of_row.shape[0]
    out = torch.empty((layout_rows, w.shape[1]), dtype=out_dtype, device=a.device)
    return grouped_gemm(
        a,
        a_scale,
        w,
        w_scale,
        out,
        scheme=scheme,
        config=config,
        m_indices=routing.m_indices,
        num_rows=routing.num_rows,
        a_rows=routing.token_of_row if gather else None,
        pdl=pdl,
    )


def grouped_gemm_masked(a, a_scale, w, w_scale, routing, *, scheme, config, out_dtype, pdl=False):
    """The grouped GEMM over a masked layout a [E, max_m, K] (routing: grouping.MaskedRouting):
    returns [E, max_m, N] in out_dtype; rows past each expert's count are not written."""
    out = torch.empty((*a.shape[:-1], w.shape[1]), dtype=out_dtype, device=a.device)
    return grouped_gemm(
        a,
        a_scale,
        w,
        w_scale,
        out,
        scheme=scheme,
        config=config,
        masked_m=routing.counts,
        pdl=pdl,
    )
