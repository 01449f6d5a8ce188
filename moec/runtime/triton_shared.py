"""The shared experts with the routed experts' Triton kernels: one dense gated MLP, run as a
one-expert grouped GEMM over the T token rows (quantize, gate/up GEMM, activation (+ quantize),
down GEMM), the GEMMs in their dense layout (every row expert 0's: no index tensor to fill)."""

import torch

from .triton_act import act_quant_rows
from .triton_gemm import grouped_gemm
from .triton_permute import quantize_rows


def shared_mlp(
    x,
    w13,
    w13_scale,
    w2,
    w2_scale,
    *,
    scheme,
    quant,
    group_size,
    pow2_scales,
    input_scales,
    activation,
    gate_up_config,
    down_config,
    permute_config,
    act_config,
    pdl=False,
):
    """x [T, H] -> [T, H] in x's dtype. w13 [2Is, H], w2 [H, Is] in `scheme` (with their scales,
    or None); quant: how activations are quantized ("none", "group", "tensor");
    input_scales: the static (w13, w2) per-tensor activation scales, or None (dynamic);
    pdl: programmatic dependent launch of the four kernels."""
    tokens = x.shape[0]
    static = input_scales or (None, None)
    quantized = {"quant": quant, "group_size": group_size, "pow2_scales": pow2_scales, "pdl": pdl}
    if quant == "none":
        xq, x_scale = x, None
    else:
        xq, x_scale = quantize_rows(x, config=permute_config, scale=static[0], **quantized)
    h = torch.empty((tokens, w13.shape[0]), dtype=x.dtype, device=x.device)
    grouped_gemm(
        xq,
        x_scale,
        w13[None],
        None if w13_scale is None else w13_scale[None],
        h,
        scheme=scheme,
        config=gate_up_config,
        pdl=pdl,
    )
    g, g_scale = act_quant_rows(
        h,
        activation=activation,
        config=act_config,
        out_dtype=x.dtype,
        scale=static[1],
        **quantized,
    )
    out = torch.empty_like(x)
    return grouped_gemm(
        g,
        g_scale,
        w2[None],
        None if w2_scale is None else w2_scale[None],
        out,
        scheme=scheme,
        config=down_config,
        pdl=pdl,
    )
