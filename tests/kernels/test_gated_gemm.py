"""grouped_gemm with `activation`: the down GEMM reading the gate/up output and computing its fp8
operand in the K loop must equal act_quant (1 x 128 groups) followed by the plain grouped_gemm,
bit for bit: both run the same activation, group scale and e4m3 rounding on the same fp32 values,
and the GEMM then sees the same e4m3 tile and scales.
"""

from __future__ import annotations

import pytest
import torch

from .harness import activation_function, activation_lines, load
from .reference import E4M3, poison, route
from .test_grouped_gemm import random_e4m3, random_scale

WIDTH, N, EXPERTS = 256, 256, 4  # I, H, experts
CONFIGS = {
    "plain": {"BLOCK_M": 16, "BLOCK_N": 128, "BLOCK_K": 128, "GROUP_SIZE_M": 2},
    "swap_ab": {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128, "GROUP_SIZE_M": 2, "SWAP_AB": True},
}
ACT_CONFIG = {"BLOCK_M": 2, "BLOCK_I": 128, "num_warps": 4}


def operands(rows: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    h = (torch.randn(rows, 2 * WIDTH, generator=gen) * 4).bfloat16()
    w = random_e4m3((EXPERTS, N, WIDTH), gen)
    w_scale = random_scale((EXPERTS, N // 128, WIDTH // 128), gen)
    return h, w, w_scale


def two_launches(kernels, h, w, w_scale, config, ue8m0, rows_kwargs):
    """act_quant into e4m3 and scales, then the plain grouped GEMM."""
    lead = h.shape[:-1]
    hq = torch.zeros(*lead, WIDTH, dtype=E4M3)
    scale = torch.zeros(*lead, WIDTH // 128)
    kernels.act_quant(
        h, hq, scale, quant="group", group_size=128, ue8m0=ue8m0, config=ACT_CONFIG, **rows_kwargs
    )
    out = poison(torch.empty(*lead, N, dtype=torch.bfloat16))
    kernels.grouped_gemm(hq, scale, w, w_scale, out, scheme="fp8_block", config=config, **rows_kwargs)
    return out


@pytest.mark.parametrize("ue8m0", [False, True])
@pytest.mark.parametrize("tiles", list(CONFIGS))
@pytest.mark.parametrize("layout", ["contiguous", "masked"])
def test_equals_act_quant_then_gemm(layout, tiles, ue8m0):
    kernels = load("silu")
    activation = activation_function(activation_lines("silu"))
    config = {**CONFIGS[tiles], "num_warps": 4, "num_stages": 2}
    routing = route(tokens=6, topk=2, experts=EXPERTS, block_m=16)
    if layout == "contiguous":
        h, w, w_scale = operands(len(routing.m_indices))
        rows_kwargs = {"m_indices": routing.m_indices}
        valid = routing.m_indices >= 0
    else:
        h, w, w_scale = operands(EXPERTS * routing.max_m)
        h = h.view(EXPERTS, routing.max_m, 2 * WIDTH)
        rows_kwargs = {"masked_m": routing.masked_m}
        valid = (torch.arange(routing.max_m)[None, :] < routing.masked_m[:, None]).flatten()
    want = two_launches(kernels, h, w, w_scale, config, ue8m0, rows_kwargs)
    got = poison(torch.empty(*h.shape[:-1], N, dtype=torch.bfloat16))
    kernels.grouped_gemm(
        h,
        None,
        w,
        w_scale,
        got,
        scheme="fp8_block",
        config=config,
        activation=activation,
        ue8m0=ue8m0,
        **rows_kwargs,
    )
    got, want = got.view(-1, N), want.view(-1, N)
    assert valid.any() and not got[valid].float().isnan().any()
    assert torch.equal(got[valid], want[valid])
    assert got[~valid].float().isnan().all(), "a padding row was written"


def test_rejects_other_schemes_and_tiles():
    kernels = load("silu")
    activation = activation_function(activation_lines("silu"))
    h, w, w_scale = operands(16)
    out = torch.empty(16, N, dtype=torch.bfloat16)
    config = {**CONFIGS["plain"], "BLOCK_K": 64, "num_warps": 4, "num_stages": 2}
    with pytest.raises(ValueError, match="BLOCK_K 128"):
        kernels.grouped_gemm(
            h, None, w, w_scale, out, scheme="fp8_block", config=config, activation=activation
        )
