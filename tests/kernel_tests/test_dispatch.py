"""dispatch: the layout's indices against the plain definition (reference.route), and its rows,
in one launch at few assignments, bit for bit against the numerics.md quantization."""

from __future__ import annotations

import pytest
import torch

from moec.plan.build import ONE_LAUNCH_ROUTE

from .harness import load
from .reference import quant_group, quant_tensor, route

CONFIG = {"BLOCK_M": 16, "BLOCK_H": 256, "num_warps": 4}
ONE_LAUNCH = 128


def make_x(tokens: int, hidden: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(3)
    magnitude = torch.logspace(-3, 3, max(tokens, 1))[:tokens, None]
    return (torch.randn(tokens, hidden, generator=gen) * magnitude).bfloat16()


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


@pytest.mark.parametrize(
    "tokens, top_k, experts, block_m, hidden",
    [
        (1, 9, 33, 16, 384),  # decode: one token, nine experts
        (3, 4, 8, 16, 256),  # experts shared by several tokens: ranks within an expert
        (14, 9, 20, 8, 256),  # 126 assignments: one launch
        (15, 9, 20, 8, 256),  # 135, over ONE_LAUNCH: route_layout + permute_quant
        (2, 2, 4, 64, 200),  # padding longer than the assignments, a short last group
    ],
)
@pytest.mark.parametrize("quant", ["group", "tensor", "none", "group_mn_major"])
def test_dispatch_contiguous(tokens, top_k, experts, block_m, hidden, quant):
    kernels = load()
    want = route(tokens, top_k, experts, block_m, seed=tokens)
    x = make_x(tokens, hidden)
    a, a_scale, routing = kernels.dispatch(
        x,
        want.topk_ids.to(torch.int32),
        experts,
        layout="contiguous",
        config=CONFIG,
        route_one_pass=ONE_LAUNCH_ROUTE,
        block_m=block_m,
        quant=quant.removesuffix("_mn_major"),
        group_size=128,
        mn_major_scales=quant.endswith("_mn_major"),  # DeepGEMM's scale layout
        one_launch=ONE_LAUNCH,
    )
    row_of, token_of_row, counts, m_indices, starts, ends, num_rows = (t.cpu() for t in routing)
    assert torch.equal(row_of, want.row_of)
    assert torch.equal(m_indices, want.m_indices)
    assert torch.equal(token_of_row, want.token_of_row)
    assert torch.equal(counts, want.masked_m)
    padded = (counts + block_m - 1) // block_m * block_m
    assert torch.equal(starts, torch.cumsum(padded, 0) - padded)
    assert torch.equal(ends, (starts + counts).to(torch.int32))
    assert num_rows.item() == padded.sum().item()
    valid = token_of_row >= 0
    tokens_of_valid = token_of_row[valid].long()
    if quant == "none":
        assert a_scale is None and torch.equal(a[valid], x[tokens_of_valid])
        return
    if quant.startswith("group"):
        q, scale = quant_group(x.float(), 128, False)
        assert torch.equal(a_scale[valid], scale[tokens_of_valid])
    else:
        q, scale = quant_tensor(x.float())
        assert torch.equal(a_scale.reshape(()), scale.reshape(()))
    assert same_bytes(a[valid], q[tokens_of_valid])


@pytest.mark.parametrize(
    "tokens, top_k, experts, block_m, hidden",
    [
        (1, 9, 33, 16, 384),  # decode: one launch, nine assignments of one token
        (14, 9, 20, 8, 256),  # 126 assignments: one launch, more assignments than tokens
        (15, 9, 20, 8, 256),  # 135: route_layout, then the tokens quantized row by row
    ],
)
@pytest.mark.parametrize("quant", ["group", "tensor", "none"])
def test_dispatch_gathered(tokens, top_k, experts, block_m, hidden, quant):
    """gather: the same indices, and the tokens' rows in token order, each quantized once (the
    gate/up GEMM reads them through token_of_row); unquantized, x itself."""
    kernels = load()
    want = route(tokens, top_k, experts, block_m, seed=tokens)
    x = make_x(tokens, hidden)
    a, a_scale, routing = kernels.dispatch(
        x, want.topk_ids.to(torch.int32), experts, layout="contiguous", config=CONFIG, route_one_pass=ONE_LAUNCH_ROUTE,
        block_m=block_m, quant=quant, group_size=128, one_launch=ONE_LAUNCH, gather=True,
    )  # fmt: skip
    assert torch.equal(routing.row_of.cpu(), want.row_of)
    assert torch.equal(routing.token_of_row.cpu(), want.token_of_row)
    assert torch.equal(routing.m_indices.cpu(), want.m_indices)
    if quant == "none":
        assert torch.equal(a, x) and a_scale is None
        return
    q, scale = quant_group(x.float(), 128, False) if quant == "group" else quant_tensor(x.float())
    assert a.shape == x.shape and same_bytes(a, q)
    assert torch.equal(a_scale.reshape(scale.shape), scale)


def test_dispatch_gathered_takes_the_contiguous_layout_only():
    kernels = load()
    ids = route(2, 2, 4, 16, seed=2).topk_ids.to(torch.int32)
    for layout, mn_major in (("masked", False), ("contiguous", True)):
        with pytest.raises(ValueError, match="gather is for the contiguous layout"):
            kernels.dispatch(
                make_x(2, 128), ids, 4, layout=layout, config=CONFIG, route_one_pass=ONE_LAUNCH_ROUTE, block_m=16,
                quant="group", mn_major_scales=mn_major, gather=True,
            )  # fmt: skip


def test_dispatch_masked_and_empty():
    """The masked layout and zero tokens take the two-launch path: the same routing."""
    kernels = load()
    want = route(5, 2, 6, 16, seed=5)
    x = make_x(5, 128)
    a, _, routing = kernels.dispatch(
        x, want.topk_ids.to(torch.int32), 6, layout="masked", config=CONFIG, route_one_pass=ONE_LAUNCH_ROUTE, quant="none",
        one_launch=ONE_LAUNCH,
    )  # fmt: skip
    assert torch.equal(routing.counts.cpu(), want.masked_m)
    assert a.shape[:2] == (6, routing.max_m)
    empty = torch.zeros(0, 3, dtype=torch.int32)
    a, _, routing = kernels.dispatch(
        x[:0], empty, 6, layout="contiguous", config=CONFIG, route_one_pass=ONE_LAUNCH_ROUTE, block_m=16, quant="group",
        one_launch=ONE_LAUNCH,
    )  # fmt: skip
    assert a.shape[0] == routing.token_of_row.numel() and routing.num_rows.item() == 0


def test_row_copy_after_route_leaves_pdl(monkeypatch):
    """Under PDL the route's launches take part and the row copy after them does not, as the
    plan asks (copy_pdl=False, measured on the H200)."""
    from moec.runtime import triton_dispatch

    asked = {}

    def recording(name, fn):
        def run(*args, **kwargs):
            asked[name] = kwargs["pdl"]
            return fn(*args, **kwargs)

        return run

    for name in ("route_contiguous", "permute"):
        monkeypatch.setattr(triton_dispatch, name, recording(name, getattr(triton_dispatch, name)))
    want = route(15, 9, 20, 8, seed=15)  # 135 assignments: over ONE_LAUNCH
    x = make_x(15, 256)
    load().dispatch(
        x, want.topk_ids.to(torch.int32), 20, layout="contiguous", config=CONFIG, route_one_pass=ONE_LAUNCH_ROUTE, block_m=8,
        quant="group", one_launch=ONE_LAUNCH, pdl=True, copy_pdl=False,
    )  # fmt: skip
    assert asked == {"route_contiguous": True, "permute": False}
