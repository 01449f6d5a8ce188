"""act_quant: gated activation of the gate/up GEMM output, optionally quantized to e4m3.

  out[m, :] = quant(act(gate = h[m, :I], up = h[m, I:]))     in fp32

ACTIVATION is a `@triton.jit` function (gate, up) -> out over fp32 tiles, passed as a constexpr:
each package renders its own from the one definition in moec/plan/activations.py.

QUANT "none"   out [M, I] in the model dtype, rounded once.
      "group"  out e4m3 + scales [M, ceil(I / G)] fp32, one per 1 x G group (pow2_scales: rounded up to a power of two).
      "tensor" out e4m3 with one fp32 scale, read from scale[0].
      "amax"   no out: atomic max of |act| over the valid rows into scale[0]. Dynamic per-tensor
               quantization is three launches: "amax", the scale kernel (amax -> scale in
               place), then "tensor".
LAYOUT "contiguous": the programs walk the assignments and take their rows from row_of (-1:
none), so the layout's padding and unused tail cost no programs (DeepSeek-V3 at T=1024: 9216
rows in use of 41728); "masked" skips rows at or past masked_m[e] of [E, max_m, 2I]; "dense"
uses every row. Rows not reached are not written.
"""

import torch
import triton
import triton.language as tl

from .scale_layout import mn_major as mn_major_empty
from .triton_numerics import (
    group_scale,
    launch_options,
    round_output,
    tensor_scale_kernel,
    to_e4m3,
    wait_inputs,
)


@triton.jit
def _act_quant_kernel(
    # pointers
    h_ptr,  # [M, 2I] model dtype: gate columns [0, I), up columns [I, 2I)
    out_ptr,  # [M, I] e4m3, or the model dtype for QUANT="none"
    scale_ptr,  # group: [M, ceil(I / G)] fp32 out; tensor: [1] fp32 in; amax: [1] fp32 in/out
    index_ptr,  # contiguous: row_of [A] int32; masked: masked_m [E] int32
    # dims
    M,  # rows (masked: E * max_m), or assignments (contiguous)
    N,  # I: out has N columns, h has 2N
    max_m,
    # strides
    stride_hm,
    stride_hi,
    stride_om,
    stride_oi,
    stride_sm,
    stride_sg,
    # meta-parameters
    ACTIVATION: tl.constexpr,
    QUANT: tl.constexpr,
    LAYOUT: tl.constexpr,
    GROUP_SIZE: tl.constexpr,
    POW2_SCALES: tl.constexpr,
    SOFT_ROUND: tl.constexpr,  # interpreter: round to bf16 / e4m3 in software (its casts do not)
    BLOCK_M: tl.constexpr,
    BLOCK_I: tl.constexpr,
    PDL: tl.constexpr,
):
    wait_inputs(PDL)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_i = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)
    valid = offs_m < M
    if LAYOUT == "masked":
        used = tl.load(index_ptr + offs_m // max_m, mask=valid, other=0)
        valid = valid & (offs_m % max_m < used)
    elif LAYOUT == "contiguous":  # offs_m are assignments
        offs_m = tl.load(index_ptr + offs_m, mask=valid, other=-1)
        valid = offs_m >= 0
    if tl.max(valid.to(tl.int32), axis=0) == 0:
        return
    rows = tl.where(valid, offs_m, 0).to(tl.int64)
    mask = valid[:, None] & (offs_i < N)[None, :]
    h_ptrs = h_ptr + rows[:, None] * stride_hm + offs_i[None, :] * stride_hi
    gate = tl.load(h_ptrs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(h_ptrs + N * stride_hi, mask=mask, other=0.0).to(tl.float32)
    out = tl.where(mask, ACTIVATION(gate, up), 0.0)
    out_ptrs = out_ptr + rows[:, None] * stride_om + offs_i[None, :] * stride_oi
    # One branch per mode: code after a constexpr branch's `return` is still compiled.
    if QUANT == "amax":
        tl.atomic_max(scale_ptr, tl.max(tl.max(tl.abs(out), axis=1), axis=0))
    elif QUANT == "none":
        tl.store(out_ptrs, round_output(out, out_ptr.dtype.element_ty, SOFT_ROUND), mask=mask)
    else:
        if QUANT == "group":
            out = tl.reshape(out, (BLOCK_M, BLOCK_I // GROUP_SIZE, GROUP_SIZE))
            scale = group_scale(tl.max(tl.abs(out), axis=2), POW2_SCALES)
            q = tl.reshape(tl.math.div_rn(out, scale[:, :, None]), (BLOCK_M, BLOCK_I))
            offs_g = tl.program_id(1) * (BLOCK_I // GROUP_SIZE) + tl.arange(
                0, BLOCK_I // GROUP_SIZE
            )
            scale_ptrs = scale_ptr + rows[:, None] * stride_sm + offs_g[None, :] * stride_sg
            scale_mask = valid[:, None] & (offs_g * GROUP_SIZE < N)[None, :]
            tl.store(scale_ptrs, scale, mask=scale_mask)
        else:  # "tensor"
            q = tl.math.div_rn(out, tl.load(scale_ptr))
        tl.store(out_ptrs, to_e4m3(q, SOFT_ROUND), mask=mask)


def act_quant(
    h,
    out,
    scale=None,
    *,
    activation,
    quant,
    config,
    group_size=128,
    pow2_scales=False,
    dynamic=False,
    row_of=None,
    masked_m=None,
    pdl=False,
):
    """out = act(h[..., :I], h[..., I:]), optionally quantized; see the comment above.

    h [M, 2I] with row_of [T, K] int32 (the rows of the assignments, -1 none), or
    [E, max_m, 2I] with masked_m [E] int32, or [M, 2I] with neither (every row). out [..., I]
    (model dtype for quant="none", else e4m3). scale: "group" [..., ceil(I / G)] fp32 written; "tensor" [1] fp32 read, or computed
    first with dynamic=True. Any strides. config: BLOCK_M, BLOCK_I (a multiple of group_size),
    num_warps. Returns out.
    """
    if quant not in ("none", "group", "tensor"):
        raise ValueError(f"unknown quant {quant!r}")
    if quant != "none" and scale is None:
        raise ValueError(f"quant {quant!r} needs a scale tensor")
    width = h.shape[-1] // 2
    h2 = h.view(-1, h.shape[-1])
    out2 = out.view(-1, width)
    rows = h2.shape[0]
    if out2.shape[0] != rows:
        raise ValueError(f"out has {out2.shape[0]} rows, h has {rows}")
    if quant == "group" and config["BLOCK_I"] % group_size:
        raise ValueError(
            f"BLOCK_I={config['BLOCK_I']} is not a multiple of group_size={group_size}"
        )
    layout = "masked" if masked_m is not None else "dense" if row_of is None else "contiguous"
    index = masked_m if masked_m is not None else row_of if row_of is not None else h2
    walked = row_of.numel() if row_of is not None else rows
    scale2 = scale.view(-1, scale.shape[-1]) if quant == "group" else scale
    grid = (triton.cdiv(walked, config["BLOCK_M"]), triton.cdiv(width, config["BLOCK_I"]))
    launch = _act_quant_kernel[grid] if walked > 0 and width > 0 else None

    def run(mode):
        if launch is not None:
            launch(
                # pointers
                h2,
                out2,
                scale2 if scale2 is not None else out2,
                index,
                # dims
                walked,
                width,
                h.shape[1] if masked_m is not None else rows,
                # strides
                h2.stride(0),
                h2.stride(1),
                out2.stride(0),
                out2.stride(1),
                *(scale2.stride() if mode == "group" else (0, 0)),
                # meta-parameters
                ACTIVATION=activation,
                QUANT=mode,
                LAYOUT=layout,
                GROUP_SIZE=group_size,
                POW2_SCALES=pow2_scales,
                SOFT_ROUND=triton.knobs.runtime.interpret,
                BLOCK_M=config["BLOCK_M"],
                BLOCK_I=config["BLOCK_I"],
                num_warps=config["num_warps"],
                **launch_options(pdl),
            )

    if quant == "tensor" and dynamic:
        scale.zero_()
        run("amax")
        tensor_scale_kernel[(1,)](scale, POW2_SCALES=pow2_scales, **launch_options(pdl))
    run(quant)
    return out


def act_quant_contiguous(h, routing, **kwargs):
    """act_quant over a contiguous layout h [M, 2I]; returns (out [M, I], scale or None)."""
    return _act_into(h, {"row_of": routing.row_of}, **kwargs)


def act_quant_masked(h, routing, **kwargs):
    """act_quant over a masked layout h [E, max_m, 2I]; returns (out, scale or None)."""
    return _act_into(h, {"masked_m": routing.counts}, **kwargs)


def act_quant_rows(h, **kwargs):
    """act_quant over every row of h [T, 2I]; returns (out [T, I], scale or None)."""
    return _act_into(h, {}, **kwargs)


def _act_into(
    h,
    rows,
    *,
    activation,
    config,
    out_dtype,
    quant="none",
    group_size=128,
    pow2_scales=False,
    scale=None,
    pdl=False,
    mn_major_scales=False,
):
    """Allocate the output (and scales) and run act_quant. quant "tensor" with scale=None
    computes a dynamic scale; with a scale, it is the static one."""
    width = h.shape[-1] // 2
    dtype = out_dtype if quant == "none" else torch.float8_e4m3fn
    out = torch.empty((*h.shape[:-1], width), dtype=dtype, device=h.device)
    common = {"activation": activation, "config": config, "pdl": pdl, **rows}
    if quant == "none":
        return act_quant(h, out, quant="none", **common), None
    if quant == "group":
        groups = -(-width // group_size)
        if mn_major_scales:  # 2-D: [M, groups] MN-major, TMA-aligned
            scale = mn_major_empty(h.shape[0], groups, device=h.device)
        else:
            scale = torch.empty((*h.shape[:-1], groups), dtype=torch.float32, device=h.device)
        act_quant(
            h, out, scale, quant="group", group_size=group_size, pow2_scales=pow2_scales, **common
        )
        return out, scale
    dynamic = scale is None
    if dynamic:
        scale = torch.zeros(1, dtype=torch.float32, device=h.device)
    act_quant(h, out, scale, quant="tensor", pow2_scales=pow2_scales, dynamic=dynamic, **common)
    return out, scale
