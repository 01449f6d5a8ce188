"""router: logits = x W^T in fp32, on bf16 tensor cores, from the fp32 router weight split in three.

x is bf16 (the model dtype); the fp32 weight W is stored as three bf16 parts, W = p0 + p1 + p2
(p0 = bf16(W), p1 = bf16(W - p0), p2 = bf16(W - p0 - p1): 24 significant bits, W to within one
fp32 rounding). Every product of a bf16 x and a bf16 part is exact in fp32, and the tensor
cores add bf16 products in fp32: the logits are the fp32 GEMM's up to summation order, at the
bf16 rate (three bf16 GEMMs cost less than one fp32 GEMM on CUDA cores).
"""

import torch
import triton
import triton.language as tl

from .triton_numerics import launch_options, release_dependents, wait_inputs

PARTS = tl.constexpr(3)  # bf16 parts of the fp32 weight (quant.split_bf16x3)


@triton.jit
def _router_kernel(
    # pointers
    x_ptr,  # [T, H] bf16
    parts_ptr,  # [3, E, H] bf16
    out_ptr,  # [T, E] fp32
    # dims
    T,
    E,
    H,
    # strides
    stride_xt,
    stride_xh,
    stride_pp,
    stride_pe,
    stride_ph,
    stride_ot,
    stride_oe,
    # meta-parameters
    UPCAST: tl.constexpr,  # interpreter: dot on fp32 tiles (its bf16 dot is wrong)
    BLOCK_T: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
):
    wait_inputs(PDL)
    offs_t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_e = tl.program_id(1) * BLOCK_E + tl.arange(0, BLOCK_E)
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_T, BLOCK_E), dtype=tl.float32)
    for k0 in range(0, H, BLOCK_K):
        k = k0 + offs_k
        x_ptrs = x_ptr + offs_t[:, None].to(tl.int64) * stride_xt + k[None, :] * stride_xh
        x = tl.load(x_ptrs, mask=(offs_t < T)[:, None] & (k < H)[None, :], other=0.0)
        w_mask = (k < H)[:, None] & (offs_e < E)[None, :]
        for part in tl.static_range(PARTS):
            w_ptrs = (
                parts_ptr + part * stride_pp + offs_e[None, :] * stride_pe + k[:, None] * stride_ph
            )
            w = tl.load(w_ptrs, mask=w_mask, other=0.0)  # [BLOCK_K, BLOCK_E]
            if UPCAST:
                acc = tl.dot(x.to(tl.float32), w.to(tl.float32), acc, input_precision="ieee")
            else:
                acc = tl.dot(x, w, acc)
    out_ptrs = out_ptr + offs_t[:, None].to(tl.int64) * stride_ot + offs_e[None, :] * stride_oe
    tl.store(out_ptrs, acc, mask=(offs_t < T)[:, None] & (offs_e < E)[None, :])
    release_dependents(PDL)


def router_logits(x, parts, *, config, pdl=False):
    """x [T, H] bf16, parts [3, E, H] bf16 -> logits [T, E] fp32. config: BLOCK_T, BLOCK_E,
    BLOCK_K, num_warps, num_stages."""
    tokens, hidden = x.shape
    experts = parts.shape[1]
    out = torch.empty((tokens, experts), dtype=torch.float32, device=x.device)
    if tokens == 0:
        return out
    grid = (triton.cdiv(tokens, config["BLOCK_T"]), triton.cdiv(experts, config["BLOCK_E"]))
    _router_kernel[grid](
        # pointers
        x,
        parts,
        out,
        # dims
        tokens,
        experts,
        hidden,
        # strides
        x.stride(0),
        x.stride(1),
        parts.stride(0),
        parts.stride(1),
        parts.stride(2),
        out.stride(0),
        out.stride(1),
        # meta-parameters
        UPCAST=triton.knobs.runtime.interpret,
        BLOCK_T=config["BLOCK_T"],
        BLOCK_E=config["BLOCK_E"],
        BLOCK_K=config["BLOCK_K"],
        num_warps=config["num_warps"],
        num_stages=config.get("num_stages", 2),
        **launch_options(pdl),
    )
    return out
