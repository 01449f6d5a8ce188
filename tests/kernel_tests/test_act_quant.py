"""act_quant against the activations of numerics.md (written out here) and its quantization.

The activations call exp, so the kernel (fp32, the interpreter's numpy exp) and a torch reference
can differ in the last fp32 bits: each kind is checked against an fp64 reference within
    |out - ref| <= rounding of the output + 2**-18 * max |ref| of the row
where rounding is u * |ref| for the model dtype (u = 2**-8 for bf16), and for e4m3 half an e4m3
step: 2**-4 * |ref| (normals) + 2**-10 * scale (subnormals); 2**-18 of the row's largest value
(64 fp32 ulps) covers the fp32 evaluation, including the cancellation of tanh written through
sigmoid near 0. The quantization itself is checked bit for bit with `out = gate * up`, an
activation with one exact fp32 operation, against the numerics.md definition.
"""

from __future__ import annotations

import pytest
import torch

from .harness import activation_lines, load, load_lines
from .reference import (
    E4M3,
    UNIT_ROUNDOFF,
    dequant_group,
    is_nan,
    poison,
    quant_group,
    quant_tensor,
    route,
    ue8m0_round_up,
)

ACTIVATIONS = {
    "silu": {},
    "silu_clamped": {"swiglu_limit": 7.0},
    "oai_swiglu": {"alpha": 1.702, "limit": 7.0},
    "situ": {"beta": 5.0, "linear_beta": 3.0},
}
MODES = ["none", "group128", "group32_ue8m0", "tensor"]
CONFIG = {"BLOCK_M": 16, "BLOCK_I": 128, "num_warps": 4}
WIDTH = 128  # I


def activation(kind: str, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """The table of numerics.md, in fp64."""
    p = ACTIVATIONS[kind]
    if kind == "silu":
        return gate * torch.sigmoid(gate) * up
    if kind == "silu_clamped":
        g = gate.clamp(max=p["swiglu_limit"])
        return g * torch.sigmoid(g) * up.clamp(-p["swiglu_limit"], p["swiglu_limit"])
    if kind == "oai_swiglu":
        g, u = gate.clamp(max=p["limit"]), up.clamp(-p["limit"], p["limit"])
        return (u + 1) * g * torch.sigmoid(p["alpha"] * g)
    beta, linear_beta = p["beta"], p["linear_beta"]
    gated = beta * torch.tanh(gate / beta) * torch.sigmoid(gate)
    return gated * linear_beta * torch.tanh(up / linear_beta)


def make_h(rows: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, 2 * WIDTH, generator=gen) * 4).bfloat16()  # beyond the clamps


def launch(kernels, h, mode, rows_kwargs, dtype=torch.bfloat16):
    """Run act_quant in `mode` on h [..., 2I]; returns (out, scale) as 2-D views."""
    lead = h.shape[:-1]
    if mode == "none":
        out, scale = poison(torch.empty(*lead, WIDTH, dtype=dtype)), None
        kernels.act_quant(h, out, quant="none", config=CONFIG, **rows_kwargs)
        return out.view(-1, WIDTH), None
    out = poison(torch.empty(*lead, WIDTH, dtype=E4M3))
    if mode == "tensor":
        scale = poison(torch.empty(1))
        kernels.act_quant(h, out, scale, quant="tensor", dynamic=True, config=CONFIG, **rows_kwargs)
        return out.view(-1, WIDTH), scale
    group, pow2_scales = (128, False) if mode == "group128" else (32, True)
    scale = poison(torch.empty(*lead, WIDTH // group))
    kernels.act_quant(
        h,
        out,
        scale,
        quant="group",
        group_size=group,
        pow2_scales=pow2_scales,
        config=CONFIG,
        **rows_kwargs,
    )
    return out.view(-1, WIDTH), scale.view(-1, WIDTH // group)


def layout(name: str):
    """(h rows, kwargs selecting the rows, valid-row mask) for each row layout."""
    routing = route(tokens=10, topk=2, experts=4, block_m=16)
    if name == "contiguous":
        m_indices = routing.m_indices
        return make_h(len(m_indices)), {"row_of": routing.row_of}, m_indices >= 0
    if name == "masked":
        experts, max_m = 4, routing.max_m
        h = make_h(experts * max_m).view(experts, max_m, 2 * WIDTH)
        valid = torch.arange(max_m)[None, :] < routing.masked_m[:, None]
        return h, {"masked_m": routing.masked_m}, valid.flatten()
    if name == "no_expert":  # contiguous, some assignments without a row (expert parallelism)
        row_of = torch.where(routing.topk_ids % 2 == 0, routing.row_of, -1)
        valid = torch.zeros(len(routing.m_indices), dtype=torch.bool)
        valid[row_of[row_of >= 0].long()] = True
        return make_h(len(valid)), {"row_of": row_of}, valid
    return make_h(24), {}, torch.ones(24, dtype=torch.bool)  # dense


def check_skipped(out, scale, valid, mode):
    assert is_nan(out[~valid]).all(), "a skipped row was written"
    assert not is_nan(out[valid]).any(), "a valid row was not fully written"
    if mode.startswith("group"):
        assert is_nan(scale[~valid]).all() and not is_nan(scale[valid]).any()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", list(ACTIVATIONS))
@pytest.mark.parametrize("rows", ["contiguous", "masked"])
def test_activation(kind, mode, rows):
    kernels = load(kind, ACTIVATIONS[kind])
    h, rows_kwargs, valid = layout(rows)
    out, scale = launch(kernels, h, mode, rows_kwargs)
    check_skipped(out, scale, valid, mode)
    h2 = h.view(-1, 2 * WIDTH)[valid].double()
    ref = activation(kind, h2[:, :WIDTH], h2[:, WIDTH:])
    noise = 2.0**-18 * ref.abs().amax(dim=1, keepdim=True)
    if mode == "none":
        bound = UNIT_ROUNDOFF[torch.bfloat16] * ref.abs() + noise
        assert ((out[valid].double() - ref).abs() <= bound).all()
        return
    if mode == "tensor":
        scale_ref = ref.abs().amax() / 448
        assert (scale.double() - scale_ref).abs() <= 2.0**-18 * scale_ref
        value = out[valid].double() * scale.double()
        step = scale.double()
    else:
        group = 128 if mode == "group128" else 32
        scale_ref = ref.view(len(ref), -1, group).abs().amax(dim=2) / 448
        if mode == "group32_ue8m0":
            scale_ref = ue8m0_round_up(scale_ref.float()).double()
            assert torch.equal(scale[valid].double(), scale_ref)
        else:
            assert ((scale[valid].double() - scale_ref).abs() <= 2.0**-18 * scale_ref).all()
        value = dequant_group(out[valid], scale[valid], group)
        step = scale[valid].double().repeat_interleave(group, dim=1)
    bound = 2.0**-4 * ref.abs() + 2.0**-10 * step + noise
    assert ((value - ref).abs() <= bound).all()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("rows", ["contiguous", "masked", "no_expert", "dense"])
def test_quant_exact(mode, rows):
    """With out = gate * up (exact in fp32) the outputs equal the definition bit for bit."""
    kernels = load_lines(("out = gate * up",))
    h, rows_kwargs, valid = layout(rows)
    out, scale = launch(kernels, h, mode, rows_kwargs)
    check_skipped(out, scale, valid, mode)
    h2 = h.view(-1, 2 * WIDTH)[valid].float()
    product = h2[:, :WIDTH] * h2[:, WIDTH:]
    if mode == "none":
        assert torch.equal(out[valid], product.bfloat16())
        return
    if mode == "tensor":
        q_ref, scale_ref = quant_tensor(product)
        assert torch.equal(scale, scale_ref)
    else:
        group, pow2_scales = (128, False) if mode == "group128" else (32, True)
        q_ref, scale_ref = quant_group(product, group, pow2_scales)
        assert torch.equal(scale[valid], scale_ref)
    assert torch.equal(out[valid].view(torch.uint8), q_ref.view(torch.uint8))


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_model_dtypes(dtype):
    kernels = load_lines(("out = gate * up",))
    h, rows_kwargs, valid = layout("contiguous")
    h = h.to(dtype)
    out, _ = launch(kernels, h, "none", rows_kwargs, dtype=dtype)
    product = h[valid, :WIDTH].float() * h[valid, WIDTH:].float()
    assert torch.equal(out[valid], product.to(dtype))


def test_static_tensor_scale():
    kernels = load_lines(("out = gate * up",))
    h, rows_kwargs, valid = layout("contiguous")
    out = poison(torch.empty(len(h), WIDTH, dtype=E4M3))
    scale = torch.tensor([0.3])
    kernels.act_quant(h, out, scale, quant="tensor", config=CONFIG, **rows_kwargs)
    assert torch.equal(scale, torch.tensor([0.3]))  # read, not written
    product = h[valid, :WIDTH].float() * h[valid, WIDTH:].float()
    q_ref = (product / scale).clamp(-448, 448).to(E4M3)
    assert torch.equal(out[valid].view(torch.uint8), q_ref.view(torch.uint8))


@pytest.mark.parametrize("mode", MODES)
def test_no_rows(mode):
    kernels = load()
    h = torch.empty(0, 2 * WIDTH, dtype=torch.bfloat16)
    out, scale = launch(kernels, h, mode, {"row_of": torch.empty(0, 2, dtype=torch.int32)})
    assert out.shape == (0, WIDTH)
    if mode == "tensor":  # amax over no rows is 0, floored at 1e-10
        assert torch.equal(scale, torch.tensor([1e-10]) / 448)
    h = torch.empty(4, 0, 2 * WIDTH, dtype=torch.bfloat16)
    launch(kernels, h, mode, {"masked_m": torch.zeros(4, dtype=torch.int32)})


def test_lowering_is_used():
    """The rendered activation is the one from moec/plan/activations.py, not a copy."""
    lines = activation_lines("situ", ACTIVATIONS["situ"])
    assert any("tl.sigmoid" in line for line in lines)
    assert lines[-1].startswith("out = ")
