"""permute_quant against a gather + the numerics.md quantization, bit for bit; the rows no
assignment names (padding, the unused tail) are left as they were."""

from __future__ import annotations

import pytest
import torch

from moec.runtime import all2all, grouping

from .harness import load
from .reference import E4M3, poison, quant_e4m3, quant_group, quant_tensor, route

CONFIG = {"BLOCK_M": 16, "BLOCK_H": 256, "num_warps": 4}


def gather(x: torch.Tensor, token_of_row: torch.Tensor) -> torch.Tensor:
    """x[token_of_row] with zero rows where token_of_row == -1."""
    out = torch.zeros(len(token_of_row), x.shape[1], dtype=x.dtype)
    valid = token_of_row >= 0
    out[valid] = x[token_of_row[valid].long()]
    return out


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def untouched(t: torch.Tensor) -> bool:
    """Every element still holds the poison (NaN; 0xFF bytes in e4m3)."""
    if t.dtype == E4M3:
        return bool((t.view(torch.uint8) == 0xFF).all())
    return bool(t.isnan().all())


def make_x(tokens: int, hidden: int, dtype: torch.dtype) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1)
    # Rows of very different magnitudes, so scales span many binades.
    magnitude = torch.logspace(-4, 4, max(tokens, 1))[:tokens, None]
    return (torch.randn(tokens, hidden, generator=gen) * magnitude).to(dtype)


@pytest.mark.parametrize("layout", ["contiguous", "masked"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_scatter(layout, dtype):
    kernels = load()
    routing = route(tokens=12, topk=2, experts=4, block_m=16)
    token_of_row, row_of = rows_of(routing, layout)
    x = make_x(12, 256, dtype)
    out = poison(torch.empty(len(token_of_row), 256, dtype=dtype))
    kernels.permute_quant(x, row_of, out, quant="none", config=CONFIG)
    named = token_of_row >= 0
    assert torch.equal(out[named], gather(x, token_of_row)[named])
    assert untouched(out[~named])


def rows_of(routing, layout: str):
    """(token_of_row [M], row_of [T, K]) of the layout."""
    if layout == "contiguous":
        return routing.token_of_row, routing.row_of
    return routing.masked_token_of_row, routing.masked_row_of


@pytest.mark.parametrize("layout", ["contiguous", "masked"])
@pytest.mark.parametrize(
    "dtype,hidden,group,pow2_scales",
    [
        (torch.bfloat16, 256, 128, False),
        (torch.bfloat16, 256, 128, True),
        (torch.bfloat16, 256, 32, True),
        (torch.float16, 256, 32, False),
        (torch.float32, 200, 128, False),  # a partial last group and a partial tile
        (torch.float32, 160, 32, True),
    ],
)
def test_group(layout, dtype, hidden, group, pow2_scales):
    kernels = load()
    routing = route(tokens=12, topk=2, experts=4, block_m=16)
    token_of_row, row_of = rows_of(routing, layout)
    x = make_x(12, hidden, dtype)
    lead = (len(token_of_row),) if layout == "contiguous" else (4, routing.max_m)  # [E, max_m, .]
    out = poison(torch.empty(*lead, hidden, dtype=E4M3))
    scale = poison(torch.empty(*lead, -(-hidden // group)))
    config = dict(CONFIG, BLOCK_H=128)
    kernels.permute_quant(
        x,
        row_of,
        out,
        scale,
        quant="group",
        group_size=group,
        pow2_scales=pow2_scales,
        config=config,
    )
    q_ref, scale_ref = quant_group(gather(x, token_of_row), group, pow2_scales)
    named = token_of_row >= 0
    out, scale = out.view(-1, hidden), scale.view(len(token_of_row), -1)
    assert same_bytes(out[named], q_ref[named])
    assert torch.equal(scale[named], scale_ref[named])
    assert untouched(out[~named]) and untouched(scale[~named])


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_tensor(dynamic, dtype):
    kernels = load()
    routing = route(tokens=12, topk=2, experts=4, block_m=16)
    x = make_x(12, 256, dtype)
    rows = len(routing.token_of_row)
    out = poison(torch.empty(rows, 256, dtype=E4M3))
    if dynamic:
        scale = poison(torch.empty(1))
        _, scale_ref = quant_tensor(x)
    else:
        scale = scale_ref = torch.tensor([0.37])  # a static checkpoint scale, not a power of 2
    kernels.permute_quant(
        x, routing.row_of, out, scale, quant="tensor", dynamic=dynamic, config=CONFIG
    )
    assert torch.equal(scale, scale_ref)
    named = routing.token_of_row >= 0
    expected = quant_e4m3(gather(x, routing.token_of_row), scale_ref)
    assert same_bytes(out[named], expected[named])
    assert untouched(out[~named])


@pytest.mark.parametrize("pow2_scales", [False, True])
def test_scale_edges(pow2_scales):
    """amax / 448 exactly a power of two stays put under power-of-two scales; one fp32 ulp above (and 1.5x)
    rounds up to the next power; an all-zero group takes the 1e-10 floor."""
    kernels = load()
    powers = [2.0**k for k in range(-20, 20, 3)]
    amax, expected = [], []
    for p in powers:
        exact = torch.tensor(448.0 * p)
        above = torch.nextafter(exact, torch.tensor(float("inf")))
        assert above / 448 > p  # the scale itself lands one ulp above the power of two
        amax += [exact, above, exact * 1.5]
        expected += [p, 2 * p, 2 * p]
    amax = torch.stack(amax)
    rows = len(amax) + 1
    gen = torch.Generator().manual_seed(2)
    x = torch.zeros(rows, 32)
    x[:-1] = (torch.rand(rows - 1, 32, generator=gen) * 1.8 - 0.9) * amax[:, None]
    x[:-1, 7] = amax  # the largest |value| of each row; the last row is all zeros
    out = poison(torch.empty(rows, 32, dtype=E4M3))
    scale = poison(torch.empty(rows, 1))
    config = {"BLOCK_M": 64, "BLOCK_H": 32, "num_warps": 4}
    kernels.permute_quant(  # row_of None: row t to row t
        x, None, out, scale, quant="group", group_size=32, pow2_scales=pow2_scales, config=config
    )
    q_ref, scale_ref = quant_group(x, 32, pow2_scales)
    assert torch.equal(scale, scale_ref)
    assert same_bytes(out, q_ref)
    if pow2_scales:
        assert scale[:-1, 0].tolist() == expected
    floor = torch.tensor(2.0**-42) if pow2_scales else torch.tensor(1e-10) / 448
    assert scale[-1, 0] == floor


def test_rounding_ties():
    """Values exactly halfway between e4m3 neighbours, and subnormals, round to nearest even."""
    kernels = load()
    halfway = torch.tensor([124.0, 84.0, 120.0 + 4, 2**-9 * 1.5, 2**-9 * 2.5, 2**-10, 3 * 2**-10])
    x = torch.zeros(1, 256)
    x[0, : len(halfway)] = halfway
    x[0, len(halfway) : 2 * len(halfway)] = -halfway
    out = poison(torch.empty(1, 256, dtype=E4M3))
    scale = torch.ones(1)
    kernels.permute_quant(
        x, torch.zeros(1, 1, dtype=torch.int32), out, scale, quant="tensor", config=CONFIG
    )
    assert same_bytes(out, quant_e4m3(x, scale))


@pytest.mark.parametrize("quant", ["none", "group", "tensor"])
def test_no_rows(quant):
    kernels = load()
    x = torch.empty(0, 256, dtype=torch.bfloat16)
    row_of = torch.empty(0, 2, dtype=torch.int32)
    out = torch.empty(0, 256, dtype=torch.bfloat16 if quant == "none" else E4M3)
    scale = {"none": None, "group": torch.empty(0, 2), "tensor": poison(torch.empty(1))}[quant]
    kernels.permute_quant(
        x, row_of, out, scale, quant=quant, dynamic=quant == "tensor", config=CONFIG
    )
    if quant == "tensor":  # amax over nothing is 0, floored at 1e-10
        assert torch.equal(scale, torch.tensor([1e-10]) / 448)


def test_dropped_assignments_and_tile_edges():
    """Assignments with row -1 write nothing; a token tile past T and a partial H tile are
    masked; the K rows of one token all receive the same quantized bytes."""
    kernels = load()
    x = make_x(5, 200, torch.bfloat16)
    row_of = torch.tensor([[3, -1], [0, 7], [-1, -1], [5, 1], [2, 6]], dtype=torch.int32)
    out = poison(torch.empty(9, 200, dtype=E4M3))
    scale = poison(torch.empty(9, 2))
    config = {"BLOCK_M": 4, "BLOCK_H": 128, "num_warps": 4}
    kernels.permute_quant(x, row_of, out, scale, quant="group", group_size=128, config=config)
    q_ref, scale_ref = quant_group(x.float(), 128, False)
    for t, rows in enumerate(row_of.tolist()):
        for row in (r for r in rows if r >= 0):
            assert same_bytes(out[row], q_ref[t]) and torch.equal(scale[row], scale_ref[t])
    assert untouched(out[[4, 8]]) and untouched(scale[[4, 8]])


@pytest.mark.parametrize("layout", ["contiguous", "masked"])
@pytest.mark.parametrize("scaled", [True, False])
def test_permute_rows_of_received_bytes(layout, scaled):
    """Expert parallelism: received rows (e4m3 values and group scales, views into packed rows
    of bytes, as all2all delivers them; or bf16 rows) copied into the layout of their local
    assignments bit for bit; ids of other ranks' experts (-1) get no row."""
    kernels = load()
    tokens, experts, hidden = 9, 4, 256
    gen = torch.Generator().manual_seed(4)
    ids = torch.stack([torch.randperm(2 * experts, generator=gen)[:2] for _ in range(tokens)])
    ids = torch.where(ids < experts, ids, -1).to(torch.int32)
    ids[5] = -1  # a row none of whose experts is local
    values, scales = quant_group(make_x(tokens, hidden, torch.float32), 128, False)
    parts = [values, scales, ids] if scaled else [make_x(tokens, hidden, torch.bfloat16), ids]
    packed = all2all.pack_rows(parts, torch.arange(tokens))
    rows, *row_scales, _ = all2all.unpack_rows(packed, parts)
    row_scales = row_scales[0] if scaled else None
    if layout == "contiguous":
        routing = grouping.route_contiguous(ids, experts, 16)
    else:
        routing = grouping.route_masked(ids, experts)
    a, a_scale = kernels.permute_rows(rows, row_scales, routing, experts, config=CONFIG)
    a, token_of_row = a.view(-1, hidden), routing.token_of_row
    named = token_of_row >= 0
    assert int(named.sum()) == int((ids >= 0).sum())
    assert same_bytes(a[named], rows[token_of_row[named].long()])
    if scaled:
        a_scale = a_scale.view(-1, scales.shape[1])
        assert torch.equal(a_scale[named], scales[token_of_row[named].long()])
    else:
        assert a_scale is None
