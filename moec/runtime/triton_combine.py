"""combine: weighted sum of each token's expert rows, in fp32, rounded once to the model dtype.

  out[t] = sum_k w[t, k] * y[row_of[t, k]]  (+ shared[t] with HAS_SHARED)

Terms are added in k order, then shared. A row_of entry of -1 (an assignment without a local
row) adds nothing. For the masked layout y is [E * max_m, H] and row_of holds e * max_m + slot.
"""

import torch
import triton
import triton.language as tl

from .triton_numerics import (
    launch_options,
    round_output,
    wait_inputs,
)

# Expert rows loaded per step unless the config says (TERMS_AT_ONCE): one dependent
# row-index-then-row load per expert, in a loop, left a decode token's combine waiting on memory
# K times in a row
TERMS_AT_ONCE = 4


@triton.jit
def _combine_kernel(
    # pointers
    y_ptr,  # [M, H] expert outputs, model dtype
    row_of_ptr,  # [T, K] int32
    weight_ptr,  # [T, K] fp32 (routed scaling already folded in)
    shared_ptr,  # [T, H] model dtype, with HAS_SHARED
    out_ptr,  # [T, H] model dtype
    # dims
    T,
    H,
    K,
    # strides
    stride_ym,
    stride_yh,
    stride_rt,
    stride_rk,
    stride_wt,
    stride_wk,
    stride_st,
    stride_sh,
    stride_ot,
    stride_oh,
    # meta-parameters
    HAS_SHARED: tl.constexpr,
    SOFT_ROUND: tl.constexpr,  # interpreter: round to bf16 in software (its cast truncates)
    BLOCK_T: tl.constexpr,
    BLOCK_H: tl.constexpr,
    TERMS_AT_ONCE: tl.constexpr,
    PDL: tl.constexpr,
):
    wait_inputs(PDL)
    offs_t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    t_ok = offs_t < T
    h_ok = offs_h < H
    acc = tl.zeros((BLOCK_T, BLOCK_H), dtype=tl.float32)
    for k0 in range(0, K, TERMS_AT_ONCE):  # in k order; the loads of a step issued together
        for i in tl.static_range(TERMS_AT_ONCE):
            k_ok = offs_t < tl.where(k0 + i < K, T, 0)  # past K: row -1 adds nothing
            row = tl.load(
                row_of_ptr + offs_t * stride_rt + (k0 + i) * stride_rk, mask=k_ok, other=-1
            )
            weight = tl.load(
                weight_ptr + offs_t * stride_wt + (k0 + i) * stride_wk, mask=k_ok, other=0.0
            )
            y_ptrs = y_ptr + row.to(tl.int64)[:, None] * stride_ym + offs_h[None, :] * stride_yh
            y = tl.load(y_ptrs, mask=(row >= 0)[:, None] & h_ok[None, :], other=0.0)
            acc += weight[:, None] * y.to(tl.float32)
    mask = t_ok[:, None] & h_ok[None, :]
    tokens = offs_t.to(tl.int64)
    if HAS_SHARED:
        shared_ptrs = shared_ptr + tokens[:, None] * stride_st + offs_h[None, :] * stride_sh
        acc += tl.load(shared_ptrs, mask=mask, other=0.0).to(tl.float32)
    out_ptrs = out_ptr + tokens[:, None] * stride_ot + offs_h[None, :] * stride_oh
    tl.store(out_ptrs, round_output(acc, out_ptr.dtype.element_ty, SOFT_ROUND), mask=mask)


def combine(y, row_of, weights, out, shared=None, *, config, pdl=False):
    """out[T, H] = sum_k weights[t, k] * y[row_of[t, k]] (+ shared[T, H]), see above.

    y [M, H] or masked [E, max_m, H] (viewed as [E * max_m, H]), model dtype; row_of [T, K] int32;
    weights [T, K] fp32; shared and out [T, H] in the model dtype. Any strides. config: BLOCK_T,
    BLOCK_H, num_warps, optionally TERMS_AT_ONCE (expert rows loaded per step). Returns out.
    """
    y2 = y.view(-1, y.shape[-1])
    tokens, hidden = out.shape
    if row_of.shape != weights.shape or row_of.shape[0] != tokens:
        raise ValueError(
            f"row_of {tuple(row_of.shape)} and weights {tuple(weights.shape)} "
            f"must both be [T={tokens}, K]"
        )
    if tokens == 0 or hidden == 0:
        return out
    grid = (triton.cdiv(tokens, config["BLOCK_T"]), triton.cdiv(hidden, config["BLOCK_H"]))
    shared_arg = shared if shared is not None else out
    _combine_kernel[grid](
        # pointers
        y2,
        row_of,
        weights,
        shared_arg,
        out,
        # dims
        tokens,
        hidden,
        row_of.shape[1],
        # strides
        y2.stride(0),
        y2.stride(1),
        row_of.stride(0),
        row_of.stride(1),
        weights.stride(0),
        weights.stride(1),
        shared_arg.stride(0),
        shared_arg.stride(1),
        out.stride(0),
        out.stride(1),
        # meta-parameters
        HAS_SHARED=shared is not None,
        SOFT_ROUND=triton.knobs.runtime.interpret,
        BLOCK_T=config["BLOCK_T"],
        BLOCK_H=config["BLOCK_H"],
        TERMS_AT_ONCE=config.get("TERMS_AT_ONCE", TERMS_AT_ONCE),
        num_warps=config["num_warps"],
        **launch_options(pdl),
    )
    return out


def combine_tokens(y, topk_weights, routing, shared, *, config, out_dtype, pdl=False):
    """out [T, H] = sum_k w[t, k] * y[row_of[t, k]] (+ shared[t]), one Triton pass."""
    return weighted_rows(
        y, routing.row_of, topk_weights, shared, config=config, out_dtype=out_dtype, pdl=pdl
    )


def weighted_rows(y, row_of, weights, shared=None, *, config, out_dtype, pdl=False):
    """out [R, H] = sum_k weights[r, k] * y[row_of[r, k]] (+ shared[r]) for row_of [R, K]
    (-1: no term), one Triton pass into a new tensor of out_dtype."""
    out = torch.empty((row_of.shape[0], y.shape[-1]), dtype=out_dtype, device=y.device)
    return combine(y, row_of, weights, out, shared, config=config, pdl=pdl)
