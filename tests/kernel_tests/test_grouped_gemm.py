"""grouped_gemm against an fp64 GEMM of the same dequantized operands (numerics.md, Grouped GEMM).

Tolerance, from the output dtype and fp32 accumulation (not tuned): for each output element,
    |out - ref| <= u_out * |ref| + (K + 3 * K_blocks + 4) * 2**-24 * sum_k |a_k * w_k|
u_out is the unit roundoff of out's dtype (one final rounding: 2**-8 for bf16); the second term
bounds fp32 accumulation of K exact products (products of e4m3 / bf16 values, and of mx values
times powers of two, are exact in fp32) plus the per-K-block scale multiplies of fp8_block.
"""

from __future__ import annotations

import json

import pytest
import torch

from .harness import ROOT, load
from .reference import E4M3, UNIT_ROUNDOFF, e2m1_pack, e2m1_unpack, is_nan, poison, route

SCHEMES = ["bf16", "fp8_per_tensor", "fp8_block", "mxfp8", "mxfp4"]
CONFIG = {
    "BLOCK_M": 32,
    "BLOCK_N": 128,
    "BLOCK_K": 128,
    "GROUP_SIZE_M": 2,
    "num_warps": 4,
    "num_stages": 2,
}


def random_e4m3(shape, gen) -> torch.Tensor:
    return (torch.randn(shape, generator=gen) * 64).clamp(-448, 448).to(E4M3)


def random_scale(shape, gen) -> torch.Tensor:
    return (torch.rand(shape, generator=gen) + 0.5) * 2.0**-7


def random_power_of_two(shape, gen) -> torch.Tensor:
    return 2.0 ** torch.randint(-9, -3, shape, generator=gen).float()


def operands(scheme: str, rows: int, n: int, k: int, experts: int, dtype, seed: int = 0):
    """Random operands of `scheme` and their fp64 dequantized values.

    Returns a [rows, K], a_scale, w, w_scale, a_deq [rows, K] fp64, w_deq [E, N, K] fp64."""
    gen = torch.Generator().manual_seed(seed)
    if scheme == "bf16":
        a = torch.randn(rows, k, generator=gen).to(dtype)
        w = (torch.randn(experts, n, k, generator=gen) * 0.05).to(dtype)
        return a, None, w, None, a.double(), w.double()
    a = random_e4m3((rows, k), gen)
    if scheme == "fp8_per_tensor":
        a_scale, w = random_scale(1, gen), random_e4m3((experts, n, k), gen)
        w_scale = random_scale(experts, gen)
        return a, a_scale, w, w_scale, a.double() * a_scale, w.double() * w_scale[:, None, None]
    if scheme == "fp8_block":
        kb, nb = -(-k // 128), -(-n // 128)
        a_scale, w = random_scale((rows, kb), gen), random_e4m3((experts, n, k), gen)
        w_scale = random_scale((experts, nb, kb), gen)
        a_s = a_scale.double().repeat_interleave(128, 1)[:, :k]
        w_s = w_scale.double().repeat_interleave(128, 1)[:, :n].repeat_interleave(128, 2)[..., :k]
        return a, a_scale, w, w_scale, a.double() * a_s, w.double() * w_s
    # mxfp8 / mxfp4: 1 x 32 power-of-two scales on both sides
    a_scale = random_power_of_two((rows, k // 32), gen)
    w_scale = random_power_of_two((experts, n, k // 32), gen)
    a_deq = a.double() * a_scale.double().repeat_interleave(32, 1)
    if scheme == "mxfp8":
        w = random_e4m3((experts, n, k), gen)
        w_values = w.double()
    else:
        w = e2m1_pack(torch.randint(0, 16, (experts, n, k), generator=gen))
        w_values = e2m1_unpack(w)
    return a, a_scale, w, w_scale, a_deq, w_values * w_scale.double().repeat_interleave(32, 2)


def check(out, a_deq, w_deq, expert_of_row, valid, k, block_k):
    """Valid rows within the bound above; every other row untouched (still NaN)."""
    u = UNIT_ROUNDOFF[out.dtype]
    gamma = (k + 3 * -(-k // block_k) + 4) * 2.0**-24
    rows = valid.nonzero().flatten()
    assert len(rows) > 0
    for m in rows.tolist():
        w = w_deq[expert_of_row[m]]
        ref = w @ a_deq[m]
        bound = u * ref.abs() + gamma * (w.abs() @ a_deq[m].abs())
        err = (out[m].double() - ref).abs()
        assert not is_nan(out[m]).any(), f"row {m} not fully written"
        assert (err <= bound).all(), f"row {m}: max err/bound {(err / bound).max():.3g}"
    assert is_nan(out[~valid]).all(), "a padding / skipped row was written"


def run_contiguous(
    scheme, n=256, k=256, dtype=torch.bfloat16, config=CONFIG, num_rows=None, block_m=None
):
    kernels = load()
    routing = route(tokens=16, topk=2, experts=4, block_m=block_m or config["BLOCK_M"])
    rows = len(routing.m_indices)
    a, a_scale, w, w_scale, a_deq, w_deq = operands(scheme, rows, n, k, 4, dtype)
    out = poison(torch.empty(rows, n, dtype=dtype))
    kernels.grouped_gemm(
        a,
        a_scale,
        w,
        w_scale,
        out,
        scheme=scheme,
        config=config,
        m_indices=routing.m_indices,
        num_rows=None if num_rows is None else torch.tensor([num_rows], dtype=torch.int32),
    )
    valid = routing.m_indices >= 0
    if num_rows is not None:
        valid &= torch.arange(rows) < num_rows
    check(out, a_deq, w_deq, routing.m_indices.long(), valid, k, config["BLOCK_K"])


@pytest.mark.parametrize("scheme", SCHEMES)
def test_contiguous(scheme):
    run_contiguous(scheme)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_masked(scheme):
    kernels = load()
    experts, n, k = 4, 256, 256
    routing = route(tokens=16, topk=2, experts=experts, block_m=32)
    max_m = routing.max_m
    a, a_scale, w, w_scale, a_deq, w_deq = operands(
        scheme, experts * max_m, n, k, experts, torch.bfloat16
    )
    a = a.view(experts, max_m, k)  # [E, max_m, K] and scales [E, max_m, K / G]
    if a_scale is not None and a_scale.dim() == 2:
        a_scale = a_scale.view(experts, max_m, -1)
    out = poison(torch.empty(experts, max_m, n, dtype=torch.bfloat16))
    kernels.grouped_gemm(
        a, a_scale, w, w_scale, out, scheme=scheme, config=CONFIG, masked_m=routing.masked_m
    )
    slot = torch.arange(max_m)
    valid = (slot[None, :] < routing.masked_m[:, None]).flatten()
    expert_of_row = torch.arange(experts).repeat_interleave(max_m)
    check(out.view(-1, n), a_deq, w_deq, expert_of_row, valid, k, CONFIG["BLOCK_K"])


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_model_dtypes(dtype):
    run_contiguous("bf16", dtype=dtype)


@pytest.mark.parametrize(
    "scheme,n,k,block_k",
    [
        ("bf16", 192, 200, 128),
        ("fp8_block", 192, 200, 128),  # partial 128 x 128 weight blocks, zero-padded
        ("fp8_block", 256, 256, 64),  # two K steps per scale block
        ("mxfp8", 160, 224, 128),
        ("mxfp4", 160, 224, 64),
    ],
)
def test_ragged(scheme, n, k, block_k):
    run_contiguous(scheme, n=n, k=k, config=dict(CONFIG, BLOCK_K=block_k))


@pytest.mark.parametrize("scheme", ["bf16", "fp8_block"])
def test_num_rows(scheme):
    """Blocks at or past the device-side row count are skipped, rows past it not written."""
    run_contiguous(scheme, num_rows=40)


def test_no_rows():
    kernels = load()
    out = torch.empty(0, 256, dtype=torch.bfloat16)
    a = torch.empty(0, 128, dtype=E4M3)
    w, w_scale = torch.zeros(4, 256, 128, dtype=E4M3), torch.ones(4, 2, 1)
    m_indices = torch.empty(0, dtype=torch.int32)
    kernels.grouped_gemm(
        a,
        torch.empty(0, 1),
        w,
        w_scale,
        out,
        scheme="fp8_block",
        config=CONFIG,
        m_indices=m_indices,
    )
    out = torch.empty(4, 0, 256, dtype=torch.bfloat16)
    masked_m = torch.zeros(4, dtype=torch.int32)
    a, w = a.view(4, 0, 128).bfloat16(), w.bfloat16()
    kernels.grouped_gemm(a, None, w, None, out, scheme="bf16", config=CONFIG, masked_m=masked_m)


def test_block_m_below_alignment():
    """BLOCK_M dividing the layout's row alignment: all-padding blocks return without work."""
    run_contiguous("fp8_block", config=dict(CONFIG, BLOCK_M=16), block_m=64)


TMA_CONFIG = dict(CONFIG, TMA=True, PROGRAMS=3)  # 3 programs: each walks several tiles


@pytest.mark.parametrize("scheme", ["bf16", "fp8_per_tensor", "fp8_block"])
def test_tma_persistent_contiguous(scheme):
    run_contiguous(scheme, config=TMA_CONFIG)
    run_contiguous(scheme, config=TMA_CONFIG, num_rows=40)


@pytest.mark.parametrize("scheme", ["bf16", "fp8_block"])
def test_tma_persistent_masked(scheme):
    kernels = load()
    experts, n, k = 4, 256, 256
    routing = route(tokens=16, topk=2, experts=experts, block_m=32)
    max_m = routing.max_m
    a, a_scale, w, w_scale, a_deq, w_deq = operands(
        scheme, experts * max_m, n, k, experts, torch.bfloat16
    )
    a = a.view(experts, max_m, k)
    if a_scale is not None:
        a_scale = a_scale.view(experts, max_m, -1)
    out = poison(torch.empty(experts, max_m, n, dtype=torch.bfloat16))
    kernels.grouped_gemm(
        a, a_scale, w, w_scale, out, scheme=scheme, config=TMA_CONFIG, masked_m=routing.masked_m
    )
    valid = (torch.arange(max_m)[None, :] < routing.masked_m[:, None]).flatten()
    expert_of_row = torch.arange(experts).repeat_interleave(max_m)
    check(out.view(-1, n), a_deq, w_deq, expert_of_row, valid, k, CONFIG["BLOCK_K"])


@pytest.mark.parametrize("scheme", ["bf16", "fp8_per_tensor", "fp8_block"])
@pytest.mark.parametrize(
    "config",
    [CONFIG, dict(CONFIG, SWAP_AB=True, BLOCK_M=16), TMA_CONFIG],
    ids=["plain", "swap_ab", "tma"],
)
def test_dense(scheme, config):
    """No index tensor: every row is expert 0's (the shared experts' MLP), 37 rows so the last
    tile is partly past the end."""
    kernels = load()
    rows, n, k = 37, 256, 256
    a, a_scale, w, w_scale, a_deq, w_deq = operands(scheme, rows, n, k, 1, torch.bfloat16)
    out = poison(torch.empty(rows, n, dtype=torch.bfloat16))
    kernels.grouped_gemm(a, a_scale, w, w_scale, out, scheme=scheme, config=config)
    expert_of_row = torch.zeros(rows, dtype=torch.long)
    check(
        out, a_deq, w_deq, expert_of_row, torch.ones(rows, dtype=torch.bool), k, config["BLOCK_K"]
    )


@pytest.mark.parametrize("scheme", ["bf16", "fp8_per_tensor", "fp8_block"])
def test_swap_ab(scheme):
    """W A^T tiles (the expert's weight rows as the MMA's M): the same output."""
    run_contiguous(scheme, config=dict(CONFIG, SWAP_AB=True, BLOCK_M=16), block_m=16)
    run_contiguous(scheme, config=dict(CONFIG, SWAP_AB=True), num_rows=40)


GATHER_CASES = [(s, CONFIG) for s in SCHEMES] + [
    (s, dict(CONFIG, SWAP_AB=True, BLOCK_M=16)) for s in ("bf16", "fp8_per_tensor", "fp8_block")
]


@pytest.mark.parametrize(("scheme", "config"), GATHER_CASES, ids=lambda v: str(v)[:30])
def test_gathered_rows(scheme, config):
    """a_rows: each layout row reads its token's row of A [T, K] (and its scales): the same
    output, bit for bit, as the GEMM over the rows copied into the layout."""
    kernels = load()
    tokens, n, k = 16, 256, 256
    routing = route(tokens=tokens, topk=2, experts=4, block_m=config["BLOCK_M"])
    rows = len(routing.m_indices)
    a, a_scale, w, w_scale, a_deq, w_deq = operands(scheme, tokens, n, k, 4, torch.bfloat16)
    valid = routing.m_indices >= 0
    source = routing.token_of_row.clamp(min=0).long()  # padding rows: any token, never read
    copied = a[source]
    copied_scale = a_scale[source] if a_scale is not None and a_scale.dim() == 2 else a_scale
    outs = []
    for operand, scale, a_rows in (
        (copied, copied_scale, None),
        (a, a_scale, routing.token_of_row),
    ):
        out = poison(torch.empty(rows, n, dtype=torch.bfloat16))
        kernels.grouped_gemm(
            operand, scale, w, w_scale, out, scheme=scheme, config=config,
            m_indices=routing.m_indices, a_rows=a_rows,
        )  # fmt: skip
        outs.append(out)
    check(outs[1], a_deq[source], w_deq, routing.m_indices.long(), valid, k, config["BLOCK_K"])
    assert torch.equal(outs[0][valid], outs[1][valid])


def test_gathered_rows_need_the_contiguous_layout_without_tma():
    kernels = load()
    routing = route(tokens=4, topk=2, experts=4, block_m=32)
    a, a_scale, w, w_scale, *_ = operands("fp8_block", 4, 128, 128, 4, torch.bfloat16)
    out = torch.empty(len(routing.m_indices), 128, dtype=torch.bfloat16)
    for layout in ({"m_indices": routing.m_indices}, {"masked_m": routing.masked_m}):
        config = TMA_CONFIG if "m_indices" in layout else CONFIG
        with pytest.raises(ValueError, match="a_rows gathers rows of the contiguous layout"):
            kernels.grouped_gemm(
                a, a_scale, w, w_scale, out, scheme="fp8_block", config=config,
                a_rows=routing.token_of_row, **layout,
            )  # fmt: skip


def test_tma_warp_specialized():
    """The warp-specialized K loop (a GPU schedule) computes the same GEMM."""
    run_contiguous("fp8_block", config=dict(TMA_CONFIG, WARP_SPECIALIZE=True, num_warps=8))


def test_fp8_block_tile_spanning_two_weight_blocks():
    """BLOCK_N = 256 covers two 128-row weight blocks: per-column scales, not one per tile."""
    run_contiguous("fp8_block", config=dict(CONFIG, BLOCK_N=256))
    run_contiguous("fp8_block", config=dict(TMA_CONFIG, BLOCK_N=256))


def _shipped_configs():
    """Every distinct GEMM config of the shipped tuned table, with its scheme."""
    table = json.loads((ROOT / "moec" / "plan" / "tuned" / "h200.json").read_text())
    found = {}
    for key, buckets in table.items():
        scheme = key.split("/")[0]
        if scheme not in SCHEMES:
            continue
        for bucket in buckets:
            for config in (bucket["gate_up"], bucket["down"]):
                found[json.dumps([scheme, config], sort_keys=True)] = (scheme, config)
    return sorted(found.values(), key=json.dumps)


@pytest.mark.parametrize(("scheme", "config"), _shipped_configs(), ids=lambda v: str(v)[:60])
def test_shipped_tuned_configs(scheme, config):
    """What ships runs within the bound, on the GPU too (its fp8 accumulation interval: FP8_ACC),
    over several K blocks."""
    run_contiguous(scheme, n=256, k=512, config=config)
