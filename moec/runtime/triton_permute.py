"""permute_quant: gather token rows into the grouped layout, optionally quantizing them to e4m3.

  out[m, :] = quant(x[token_of_row[m], :])        token_of_row[m] == -1: a padding row of zeros

QUANT "none"   out in x's dtype, a plain gather.
      "group"  out e4m3 + scales [M, ceil(H / G)] fp32, one per 1 x G group (UE8M0: round up).
      "tensor" out e4m3 with one given fp32 scale (static, or computed by the "amax" pass).
      "amax"   no out: atomic max of |x| over the rows into scale[0] (dynamic per-tensor pass 1).
A padding row is quantized as a row of zeros: q = 0 and, for "group", scale = 1e-10 / 448 (the
definition applied to zeros; 2**-42 with UE8M0), so out == quant(gather(x)) for every row.
The masked layout [E, max_m, H] is the same kernel over E * max_m rows.
"""

import torch
import triton
import triton.language as tl

from .grouping import rows_shape
from .scale_layout import mn_major as mn_major_empty
from .triton_numerics import (
    group_scale,
    launch_options,
    release_dependents,
    tensor_scale_kernel,
    to_e4m3,
    wait_inputs,
)


@triton.jit
def _permute_quant_kernel(
    # pointers
    x_ptr,  # [T, H] bf16 / fp16 / fp32
    token_of_row_ptr,  # [M] int32, -1 = padding row (unused without GATHER: row m is token m)
    out_ptr,  # [M, H] e4m3, or x's dtype for QUANT="none"
    scale_ptr,  # group: [M, ceil(H / G)] fp32 out; tensor: [1] fp32 in; amax: [1] fp32 in/out
    # dims
    M,
    H,
    # strides
    stride_xt,
    stride_xh,
    stride_om,
    stride_oh,
    stride_sm,
    stride_sg,
    # meta-parameters
    QUANT: tl.constexpr,
    GROUP_SIZE: tl.constexpr,
    UE8M0: tl.constexpr,
    GATHER: tl.constexpr,
    SOFT_ROUND: tl.constexpr,  # round to e4m3 in software (the interpreter's cast does not RNE)
    BLOCK_M: tl.constexpr,
    BLOCK_H: tl.constexpr,
    PDL: tl.constexpr,
):
    wait_inputs(PDL)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    if GATHER:
        token = tl.load(token_of_row_ptr + offs_m, mask=offs_m < M, other=-1)
    else:
        token = tl.where(offs_m < M, offs_m, -1)
    x_ptrs = x_ptr + token.to(tl.int64)[:, None] * stride_xt + offs_h[None, :] * stride_xh
    x = tl.load(x_ptrs, mask=(token >= 0)[:, None] & (offs_h < H)[None, :], other=0.0)
    rows = offs_m.to(tl.int64)
    store_mask = (offs_m < M)[:, None] & (offs_h < H)[None, :]
    out_ptrs = out_ptr + rows[:, None] * stride_om + offs_h[None, :] * stride_oh
    # One branch per mode: code after a constexpr branch's `return` is still compiled.
    if QUANT == "amax":
        tl.atomic_max(scale_ptr, tl.max(tl.max(tl.abs(x.to(tl.float32)), axis=1), axis=0))
    elif QUANT == "none":
        tl.store(out_ptrs, x, mask=store_mask)
    else:
        if QUANT == "group":
            x = tl.reshape(x.to(tl.float32), (BLOCK_M, BLOCK_H // GROUP_SIZE, GROUP_SIZE))
            scale = group_scale(tl.max(tl.abs(x), axis=2), UE8M0)
            q = tl.reshape(tl.math.div_rn(x, scale[:, :, None]), (BLOCK_M, BLOCK_H))
            offs_g = tl.program_id(1) * (BLOCK_H // GROUP_SIZE) + tl.arange(
                0, BLOCK_H // GROUP_SIZE
            )
            scale_ptrs = scale_ptr + rows[:, None] * stride_sm + offs_g[None, :] * stride_sg
            scale_mask = (offs_m < M)[:, None] & (offs_g * GROUP_SIZE < H)[None, :]
            tl.store(scale_ptrs, scale, mask=scale_mask)
        else:  # "tensor"
            q = tl.math.div_rn(x.to(tl.float32), tl.load(scale_ptr))
        tl.store(out_ptrs, to_e4m3(q, SOFT_ROUND), mask=store_mask)
    release_dependents(PDL)


def permute_quant(
    x,
    token_of_row,
    out,
    scale=None,
    *,
    quant,
    config,
    group_size=128,
    ue8m0=False,
    dynamic=False,
    pdl=False,
):
    """Gather `x[T, H]` rows into `out[M, H]` by `token_of_row[M]` (int32, -1 = padding row).

    quant: "none" (out has x's dtype, scale is None), "group" (out e4m3, scale [M, ceil(H / G)]
    fp32 written), "tensor" (out e4m3, scale [1] fp32: read, or with dynamic=True first computed
    as max(amax(x), 1e-10) / 448 over all of x in two extra launches). config: BLOCK_M, BLOCK_H
    (a multiple of group_size for "group"), num_warps. Any strides; a masked [E, max_m, H] out is
    viewed as [E * max_m, H]. Returns out.
    """
    if quant not in ("none", "group", "tensor"):
        raise ValueError(f"unknown quant {quant!r}")
    if quant != "none" and scale is None:
        raise ValueError(f"quant {quant!r} needs a scale tensor")
    out2 = out.view(-1, out.shape[-1])
    rows, hidden = out2.shape
    if token_of_row.shape != (rows,) or token_of_row.dtype != torch.int32:
        raise ValueError(
            f"token_of_row must be int32 [{rows}], got {token_of_row.dtype} "
            f"{tuple(token_of_row.shape)}"
        )
    if x.shape[-1] != hidden:
        raise ValueError(f"x has {x.shape[-1]} columns, out has {hidden}")
    if quant == "group" and config["BLOCK_H"] % group_size:
        raise ValueError(
            f"BLOCK_H={config['BLOCK_H']} is not a multiple of group_size={group_size}"
        )
    meta = {
        "GROUP_SIZE": group_size,
        "UE8M0": ue8m0,
        "SOFT_ROUND": triton.knobs.runtime.interpret,
        "BLOCK_M": config["BLOCK_M"],
        "BLOCK_H": config["BLOCK_H"],
        "num_warps": config["num_warps"],
    }
    dummy = scale if scale is not None else out2
    if quant == "tensor" and dynamic:  # amax over all of x (its rows in order), then the scale
        scale.zero_()
        if x.shape[0] > 0:
            grid = (
                triton.cdiv(x.shape[0], config["BLOCK_M"]),
                triton.cdiv(hidden, config["BLOCK_H"]),
            )
            _permute_quant_kernel[grid](
                x,
                token_of_row,
                out2,
                scale,
                x.shape[0],
                hidden,
                x.stride(0),
                x.stride(1),
                0,
                0,
                0,
                0,
                QUANT="amax",
                GATHER=False,
                **meta,
                **launch_options(pdl),
            )
        tensor_scale_kernel[(1,)](scale, UE8M0=ue8m0, **launch_options(pdl))
    if rows == 0 or hidden == 0:
        return out
    strides_s = scale.view(-1, scale.shape[-1]).stride() if quant == "group" else (0, 0)
    grid = (triton.cdiv(rows, config["BLOCK_M"]), triton.cdiv(hidden, config["BLOCK_H"]))
    _permute_quant_kernel[grid](
        # pointers
        x,
        token_of_row,
        out2,
        dummy,
        # dims
        rows,
        hidden,
        # strides
        x.stride(0),
        x.stride(1),
        out2.stride(0),
        out2.stride(1),
        *strides_s,
        # meta-parameters
        QUANT=quant,
        GATHER=True,
        **meta,
        **launch_options(pdl),
    )
    return out


def permute(
    x,
    routing,
    experts,
    *,
    config,
    quant="none",
    group_size=128,
    ue8m0=False,
    scale=None,
    pdl=False,
    mn_major_scales=False,
):
    """Token rows x [T, H] copied into the grouped layout of `routing` ([M, H] contiguous,
    [E, max_m, H] masked), quantized to e4m3 on the way for quant "group" or "tensor" (with
    `scale` the static per-tensor scale, or None for a dynamic one). Returns (a, a_scale), a_scale
    None for quant "none"; mn_major_scales: group scales written MN-major, TMA-aligned (2-D)."""
    leading = rows_shape(routing, experts)
    scales = (quant, group_size, ue8m0, scale, mn_major_scales)
    return _into(x, routing.token_of_row, leading, config, *scales, pdl)


def quantize_rows(x, *, config, quant, group_size=128, ue8m0=False, scale=None, pdl=False):
    """x [T, H] quantized row by row (no permutation): (e4m3 [T, H], scales)."""
    rows = torch.arange(x.shape[0], dtype=torch.int32, device=x.device)
    return _into(x, rows, (x.shape[0],), config, quant, group_size, ue8m0, scale, False, pdl)


def _into(x, token_of_row, leading, config, quant, group_size, ue8m0, scale, mn_major, pdl):
    hidden = x.shape[1]
    dtype = x.dtype if quant == "none" else torch.float8_e4m3fn
    out = torch.empty((*leading, hidden), dtype=dtype, device=x.device)
    if quant == "none":
        permute_quant(x, token_of_row, out, quant="none", config=config, pdl=pdl)
        return out, None
    if quant == "group":
        groups = -(-hidden // group_size)
        if mn_major:
            scale = mn_major_empty(leading[0], groups, device=x.device)
        else:
            scale = torch.empty((*leading, groups), dtype=torch.float32, device=x.device)
        permute_quant(
            x,
            token_of_row,
            out,
            scale,
            quant="group",
            config=config,
            group_size=group_size,
            ue8m0=ue8m0,
            pdl=pdl,
        )
        return out, scale
    dynamic = scale is None
    if dynamic:
        scale = torch.zeros(1, dtype=torch.float32, device=x.device)
    permute_quant(
        x,
        token_of_row,
        out,
        scale,
        quant="tensor",
        config=config,
        ue8m0=ue8m0,
        dynamic=dynamic,
        pdl=pdl,
    )
    return out, scale
