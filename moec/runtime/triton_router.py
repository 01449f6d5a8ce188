"""router: logits = x W^T in fp32, on bf16 tensor cores, from the fp32 router weight split in three.

x is bf16 (the model dtype); the fp32 weight W is stored as three bf16 parts, W = p0 + p1 + p2
(p0 = bf16(W), p1 = bf16(W - p0), p2 = bf16(W - p0 - p1): 24 significant bits, W to within one
fp32 rounding). Every product of a bf16 x and a bf16 part is exact in fp32, and the tensor
cores add bf16 products in fp32: the logits are the fp32 GEMM's up to summation order, at the
bf16 rate (three bf16 GEMMs cost less than one fp32 GEMM on CUDA cores). A weight the
checkpoint stores in bf16 (DeepSeek's do) is its first part alone: p1 = p2 = 0, and the layer
passes only p0 (one GEMM, the same logits bit for bit, since adding products of zero changes
no fp32 sum).

Split K: few tokens make few output tiles (256 experts in tiles of 32 are 8 programs at decode),
so the hidden dim is cut into S slices that run as programs of their own, each writing its
partial logits; the result is [S, T, E] and select_topk adds the S partials in fp32, in order.
S is chosen so that the grid holds about config["PROGRAMS"] programs. partial_logits and
store_partial_logits are the program's work, which triton_gate's kernel shares.
"""

import torch
import triton
import triton.language as tl

from .triton_numerics import launch_options, wait_inputs


@triton.jit
def partial_logits(
    x_ptr,
    parts_ptr,
    T,
    E,
    H,
    K_SLICE,
    stride_xt,
    stride_xh,
    stride_pp,
    stride_pe,
    stride_ph,
    PARTS: tl.constexpr,
    UPCAST: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """This program's tile of partial logits [BLOCK_T, BLOCK_E] fp32: experts program_id(0),
    tokens program_id(1), hidden elements of K slice program_id(2). The expert tiles of a
    token tile are neighbouring programs, which run together: its rows of x are read from
    memory once, then from L2."""
    offs_t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_e = tl.program_id(0) * BLOCK_E + tl.arange(0, BLOCK_E)
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_T, BLOCK_E), dtype=tl.float32)
    k_start = tl.program_id(2) * K_SLICE
    for k0 in range(k_start, tl.minimum(k_start + K_SLICE, H), BLOCK_K):
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
    return acc


@triton.jit
def store_partial_logits(
    out_ptr,
    acc,
    T,
    E,
    stride_os,
    stride_ot,
    stride_oe,
    BLOCK_T: tl.constexpr,
    BLOCK_E: tl.constexpr,
):
    """Store a tile of partial_logits at slice program_id(2) of out [S, T, E]."""
    offs_t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_e = tl.program_id(0) * BLOCK_E + tl.arange(0, BLOCK_E)
    out_ptr += tl.program_id(2) * stride_os
    out_ptrs = out_ptr + offs_t[:, None].to(tl.int64) * stride_ot + offs_e[None, :] * stride_oe
    tl.store(out_ptrs, acc, mask=(offs_t < T)[:, None] & (offs_e < E)[None, :])


@triton.jit
def _router_kernel(
    # pointers
    x_ptr,  # [T, H] bf16
    parts_ptr,  # [PARTS, E, H] bf16
    out_ptr,  # [S, T, E] fp32: the partial logits of each K slice
    # dims
    T,
    E,
    H,
    K_SLICE,  # hidden elements per K slice, a multiple of BLOCK_K
    # strides
    stride_xt,
    stride_xh,
    stride_pp,
    stride_pe,
    stride_ph,
    stride_os,
    stride_ot,
    stride_oe,
    # meta-parameters
    PARTS: tl.constexpr,  # bf16 parts of the weight: 3, or fewer where the rest are zero
    UPCAST: tl.constexpr,  # interpreter: dot on fp32 tiles (its bf16 dot is wrong)
    BLOCK_T: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
):
    wait_inputs(PDL)
    acc = partial_logits(
        x_ptr, parts_ptr, T, E, H, K_SLICE, stride_xt, stride_xh, stride_pp, stride_pe,
        stride_ph, PARTS, UPCAST, BLOCK_T, BLOCK_E, BLOCK_K,
    )  # fmt: skip
    store_partial_logits(out_ptr, acc, T, E, stride_os, stride_ot, stride_oe, BLOCK_T, BLOCK_E)


def router_logits(x, parts, *, config, pdl=False):
    """x [T, H] bf16, parts [P, E, H] bf16 (the first P of the weight's three parts, P = 3 or
    fewer where the rest are zero) -> partial logits [S, T, E] fp32 (their sum over S is
    x W^T). config: BLOCK_T, BLOCK_E, BLOCK_K, PROGRAMS, num_warps, num_stages."""
    tokens, hidden = x.shape
    experts = parts.shape[1]
    grid, k_slice = split_k(tokens, experts, hidden, config)
    out = torch.empty((grid[2], tokens, experts), dtype=torch.float32, device=x.device)
    if tokens == 0:
        return out
    _router_kernel[grid](
        # pointers
        x,
        parts,
        out,
        # dims
        tokens,
        experts,
        hidden,
        k_slice,
        # strides
        x.stride(0),
        x.stride(1),
        parts.stride(0),
        parts.stride(1),
        parts.stride(2),
        out.stride(0),
        out.stride(1),
        out.stride(2),
        # meta-parameters
        PARTS=parts.shape[0],
        UPCAST=triton.knobs.runtime.interpret,
        BLOCK_T=config["BLOCK_T"],
        BLOCK_E=config["BLOCK_E"],
        BLOCK_K=config["BLOCK_K"],
        num_warps=config["num_warps"],
        num_stages=config.get("num_stages", 2),
        **launch_options(pdl),
    )
    return out


def split_k(tokens: int, experts: int, hidden: int, config) -> tuple[tuple[int, int, int], int]:
    """The router's grid (expert tiles, token tiles, K slices) and the hidden elements per slice:
    as many slices as fill about config["PROGRAMS"] programs, none of them empty."""
    tiles = triton.cdiv(tokens, config["BLOCK_T"]) * triton.cdiv(experts, config["BLOCK_E"])
    k_blocks = triton.cdiv(hidden, config["BLOCK_K"])
    slices = max(1, min(k_blocks, config["PROGRAMS"] // max(tiles, 1)))
    k_slice = triton.cdiv(k_blocks, slices) * config["BLOCK_K"]
    grid = (
        triton.cdiv(experts, config["BLOCK_E"]),
        triton.cdiv(tokens, config["BLOCK_T"]),
        triton.cdiv(hidden, k_slice),  # no empty slice
    )
    return grid, k_slice
