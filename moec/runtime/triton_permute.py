"""permute_quant: token rows scattered into the grouped layout, optionally quantized to e4m3.

  out[row_of[t, k], :] = quant(x[t, :])     for every assignment (t, k); row_of == -1: none

Each program reads a tile of token rows once, quantizes it once and writes it to each of its K
rows: x is read once and quantized once whatever top-k is (a gather by row would read and
quantize each token K times). Rows no assignment names (an expert's padding, the unused tail of
the worst-case buffer, a masked expert's slots past its count) are not written: every consumer
of the layout skips them (the GEMMs mask them out of their loads, the activation and combine
read only valid rows), as they skip the GEMM outputs of those rows.
QUANT "none"   out in x's dtype, a plain copy.
      "group"  out e4m3 + scales [M, ceil(H / G)] fp32, one per 1 x G group (pow2_scales: rounded up to a power of two).
      "tensor" out e4m3 with one given fp32 scale (static, or computed by the "amax" pass).
      "amax"   no out: atomic max of |x| over all rows into scale[0] (dynamic per-tensor pass 1).
Without SCATTER, row t goes to row t (K = 1): quantize_rows. The masked layout [E, max_m, H] is
the same kernel with rows of the flattened [E * max_m].
"""

import torch
import triton
import triton.language as tl

from .grouping import rows_shape
from .scale_layout import mn_major as mn_major_empty
from .triton_numerics import (
    group_scale,
    launch_options,
    tensor_scale_kernel,
    to_e4m3,
    wait_inputs,
)


@triton.jit
def _permute_quant_kernel(
    # pointers
    x_ptr,  # [T, H] bf16 / fp16 / fp32
    row_of_ptr,  # [T, K] int32: each assignment's row of out, -1 = none (read with SCATTER)
    out_ptr,  # [M, H] e4m3, or x's dtype for QUANT="none"
    scale_ptr,  # group: [M, ceil(H / G)] fp32 out; tensor: [1] fp32 in; amax: [1] fp32 in/out
    # dims
    T,
    H,
    K,
    # strides
    stride_xt,
    stride_xh,
    stride_rt,
    stride_rk,
    stride_om,
    stride_oh,
    stride_sm,
    stride_sg,
    # meta-parameters
    QUANT: tl.constexpr,
    GROUP_SIZE: tl.constexpr,
    POW2_SCALES: tl.constexpr,
    SCATTER: tl.constexpr,
    SOFT_ROUND: tl.constexpr,  # round to e4m3 in software (the interpreter's cast does not RNE)
    BLOCK_M: tl.constexpr,  # token rows per program
    BLOCK_H: tl.constexpr,
    PDL: tl.constexpr,
):
    wait_inputs(PDL)
    offs_t = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    in_t = offs_t < T
    in_h = offs_h < H
    tokens = offs_t.to(tl.int64)
    x_ptrs = x_ptr + tokens[:, None] * stride_xt + offs_h[None, :] * stride_xh
    x = tl.load(x_ptrs, mask=in_t[:, None] & in_h[None, :], other=0.0)
    # One branch per mode: code after a constexpr branch's `return` is still compiled.
    if QUANT == "amax":
        tl.atomic_max(scale_ptr, tl.max(tl.max(tl.abs(x.to(tl.float32)), axis=1), axis=0))
    else:
        value, scale = quantize_tile(x, scale_ptr, QUANT, GROUP_SIZE, POW2_SCALES, SOFT_ROUND)
        for k in range(K):
            if SCATTER:
                rows = tl.load(row_of_ptr + tokens * stride_rt + k * stride_rk, mask=in_t, other=-1)
            else:
                rows = tl.where(in_t, offs_t, -1)
            store_rows(
                out_ptr, scale_ptr, rows, tl.program_id(1) * BLOCK_H, H, value, scale,
                stride_om, stride_oh, stride_sm, stride_sg, QUANT, GROUP_SIZE,
            )  # fmt: skip


@triton.jit
def quantize_tile(
    x,  # [ROWS, COLUMNS] bf16 / fp16 / fp32 token values
    scale_ptr,  # "tensor": [1] fp32, the scale to divide by
    QUANT: tl.constexpr,  # "group" | "tensor" | "none"
    GROUP_SIZE: tl.constexpr,  # "group": COLUMNS is a multiple of it
    POW2_SCALES: tl.constexpr,
    SOFT_ROUND: tl.constexpr,
):
    """(values, scales) of a tile of token rows: e4m3 and [ROWS, COLUMNS / G] group scales
    ("group"), e4m3 and the tensor scale ("tensor"), or the tile itself and 1.0 ("none")."""
    if QUANT == "group":
        rows: tl.constexpr = x.shape[0]
        columns: tl.constexpr = x.shape[1]
        x = tl.reshape(x.to(tl.float32), (rows, columns // GROUP_SIZE, GROUP_SIZE))
        scale = group_scale(tl.max(tl.abs(x), axis=2), POW2_SCALES)
        value = tl.reshape(tl.math.div_rn(x, scale[:, :, None]), (rows, columns))
        return to_e4m3(value, SOFT_ROUND), scale
    elif QUANT == "tensor":
        scale = tl.load(scale_ptr)
        return to_e4m3(tl.math.div_rn(x.to(tl.float32), scale), SOFT_ROUND), scale
    else:
        return x, 1.0


@triton.jit
def store_rows(
    out_ptr,
    scale_ptr,
    rows,  # [ROWS] int: the row of out each tile row goes to, -1 = none
    h0,  # the tile's first column
    H,
    value,  # [ROWS, COLUMNS] from quantize_tile
    scale,  # from quantize_tile: "group" [ROWS, COLUMNS / G], stored beside the rows
    stride_om,
    stride_oh,
    stride_sm,
    stride_sg,
    QUANT: tl.constexpr,
    GROUP_SIZE: tl.constexpr,
):
    """One quantized tile of token rows written to its rows of out (and of the group scales)."""
    valid = rows >= 0
    rows = rows.to(tl.int64)
    offs_h = h0 + tl.arange(0, value.shape[1])
    out_ptrs = out_ptr + rows[:, None] * stride_om + offs_h[None, :] * stride_oh
    tl.store(out_ptrs, value, mask=valid[:, None] & (offs_h < H)[None, :])
    if QUANT == "group":
        groups: tl.constexpr = value.shape[1] // GROUP_SIZE
        offs_g = h0 // GROUP_SIZE + tl.arange(0, groups)
        scale_ptrs = scale_ptr + rows[:, None] * stride_sm + offs_g[None, :] * stride_sg
        tl.store(scale_ptrs, scale, mask=valid[:, None] & (offs_g * GROUP_SIZE < H)[None, :])


def permute_quant(
    x,
    row_of,
    out,
    scale=None,
    *,
    quant,
    config,
    group_size=128,
    pow2_scales=False,
    dynamic=False,
    pdl=False,
):
    """Scatter `x[T, H]` rows into `out[M, H]`: row t to rows `row_of[t, :]` ([T, K] int32, -1 =
    none), or to row t where row_of is None.

    quant: "none" (out has x's dtype, scale is None), "group" (out e4m3, scale [M, ceil(H / G)]
    fp32 written), "tensor" (out e4m3, scale [1] fp32: read, or with dynamic=True first computed
    as max(amax(x), 1e-10) / 448 over all of x in two extra launches). config: BLOCK_M (token
    rows per program), BLOCK_H (a multiple of group_size for "group"), num_warps. Any strides; a
    masked [E, max_m, H] out is viewed as [E * max_m, H]. Rows no assignment names are left as
    they were. Returns out.
    """
    if quant not in ("none", "group", "tensor"):
        raise ValueError(f"unknown quant {quant!r}")
    if quant != "none" and scale is None:
        raise ValueError(f"quant {quant!r} needs a scale tensor")
    out2 = out.view(-1, out.shape[-1])
    tokens, hidden = x.shape
    if row_of is not None and (
        row_of.dim() != 2 or row_of.shape[0] != tokens or row_of.dtype != torch.int32
    ):
        raise ValueError(
            f"row_of must be int32 [{tokens}, K], got {row_of.dtype} {tuple(row_of.shape)}"
        )
    if row_of is None and out2.shape[0] < tokens:
        raise ValueError(f"out has {out2.shape[0]} rows for {tokens} tokens")
    if out2.shape[1] != hidden:
        raise ValueError(f"x has {hidden} columns, out has {out2.shape[1]}")
    if quant == "group" and config["BLOCK_H"] % group_size:
        raise ValueError(
            f"BLOCK_H={config['BLOCK_H']} is not a multiple of group_size={group_size}"
        )
    meta = _meta(config, group_size, pow2_scales)
    dummy = scale if scale is not None else out2
    grid = (triton.cdiv(tokens, config["BLOCK_M"]), triton.cdiv(hidden, config["BLOCK_H"]))
    if quant == "tensor" and dynamic:
        dynamic_scale(x, scale, config=config, pow2_scales=pow2_scales, pdl=pdl)
    if tokens == 0 or hidden == 0:
        return out
    strides_s = scale.view(-1, scale.shape[-1]).stride() if quant == "group" else (0, 0)
    _permute_quant_kernel[grid](
        # pointers
        x,
        row_of if row_of is not None else x,
        out2,
        dummy,
        # dims
        tokens,
        hidden,
        row_of.shape[1] if row_of is not None else 1,
        # strides
        x.stride(0),
        x.stride(1),
        *(row_of.stride() if row_of is not None else (0, 0)),
        out2.stride(0),
        out2.stride(1),
        *strides_s,
        # meta-parameters
        QUANT=quant,
        SCATTER=row_of is not None,
        **meta,
        **launch_options(pdl),
    )
    return out


def _meta(config, group_size, pow2_scales) -> dict:
    return {
        "GROUP_SIZE": group_size,
        "POW2_SCALES": pow2_scales,
        "SOFT_ROUND": triton.knobs.runtime.interpret,
        "BLOCK_M": config["BLOCK_M"],
        "BLOCK_H": config["BLOCK_H"],
        "num_warps": config["num_warps"],
    }


def dynamic_scale(x, scale, *, config, pow2_scales=False, pdl=False):
    """The dynamic per-tensor scale of x [T, H] into scale [1] fp32: max(amax(x), 1e-10) / 448
    (pow2_scales: rounded up to a power of two), in two launches (atomic max of |x|, then the scale)."""
    scale.zero_()
    tokens, hidden = x.shape
    if tokens > 0:
        grid = (triton.cdiv(tokens, config["BLOCK_M"]), triton.cdiv(hidden, config["BLOCK_H"]))
        _permute_quant_kernel[grid](
            x, x, x, scale, tokens, hidden, 0, x.stride(0), x.stride(1), 0, 0, 0, 0, 0, 0,
            QUANT="amax", SCATTER=False, **_meta(config, 128, pow2_scales), **launch_options(pdl),
        )  # fmt: skip
    tensor_scale_kernel[(1,)](scale, POW2_SCALES=pow2_scales, **launch_options(pdl))
    return scale


def permute(
    x,
    routing,
    experts,
    *,
    config,
    quant="none",
    group_size=128,
    pow2_scales=False,
    scale=None,
    pdl=False,
    mn_major_scales=False,
):
    """Token rows x [T, H] copied into the grouped layout of `routing` ([M, H] contiguous,
    [E, max_m, H] masked), quantized to e4m3 on the way for quant "group" or "tensor" (with
    `scale` the static per-tensor scale, or None for a dynamic one). Returns (a, a_scale), a_scale
    None for quant "none"; mn_major_scales: group scales written MN-major, TMA-aligned (2-D)."""
    leading = rows_shape(routing, experts)
    scales = (quant, group_size, pow2_scales, scale, mn_major_scales)
    return _into(x, routing.row_of, leading, config, *scales, pdl)


def permute_rows(rows, row_scales, routing, experts, *, config, pdl=False):
    """Rows already in the GEMM's format (e4m3 or the model dtype, [R, H], any row stride) and
    their 1 x group scales ([R, H/group], or a per-tensor [1] / None passed through) copied into
    the grouped layout of `routing` (whose row_of is [R, K]): the expert-parallel receive side,
    where the rows arrive quantized. A plain copy of bytes, one launch for the values and one
    for the scales."""
    leading = rows_shape(routing, experts)
    a = rows.new_empty((*leading, rows.shape[1]))
    wire = torch.uint8 if rows.element_size() == 1 else rows.dtype  # e4m3 copied as bytes
    permute_quant(
        rows.view(wire), routing.row_of, a.view(wire), quant="none", config=config, pdl=pdl
    )
    if row_scales is None or row_scales.dim() != 2:
        return a, row_scales
    a_scale = row_scales.new_empty((*leading, row_scales.shape[1]))
    permute_quant(row_scales, routing.row_of, a_scale, quant="none", config=config, pdl=pdl)
    return a, a_scale


def quantize_rows(x, *, config, quant, group_size=128, pow2_scales=False, scale=None, pdl=False):
    """x [T, H] quantized row by row (no permutation): (e4m3 [T, H], scales)."""
    return _into(x, None, (x.shape[0],), config, quant, group_size, pow2_scales, scale, False, pdl)


def empty_rows(x, leading, quant, group_size=128, mn_major=False):
    """(out, scale) for x's rows in a layout of `leading` dims: out e4m3 unless quant is "none"
    (x's dtype, scale None); "group": scales [*leading, ceil(H / G)] (mn_major: MN-major,
    TMA-aligned); "tensor": scale [1], zero."""
    hidden = x.shape[1]
    dtype = x.dtype if quant == "none" else torch.float8_e4m3fn
    out = torch.empty((*leading, hidden), dtype=dtype, device=x.device)
    if quant == "none":
        return out, None
    if quant == "tensor":
        return out, torch.zeros(1, dtype=torch.float32, device=x.device)
    groups = -(-hidden // group_size)
    if mn_major:
        return out, mn_major_empty(leading[0], groups, device=x.device)
    return out, torch.empty((*leading, groups), dtype=torch.float32, device=x.device)


def _into(x, row_of, leading, config, quant, group_size, pow2_scales, scale, mn_major, pdl):
    out, empty_scale = empty_rows(x, leading, quant, group_size, mn_major)
    dynamic = quant == "tensor" and scale is None
    if quant != "tensor" or dynamic:
        scale = empty_scale
    permute_quant(
        x,
        row_of,
        out,
        scale,
        quant=quant,
        config=config,
        group_size=group_size,
        pow2_scales=pow2_scales,
        dynamic=dynamic,
        pdl=pdl,
    )
    return out, scale
