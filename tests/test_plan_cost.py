"""The roofline cost model, against numbers computed here by hand from the DeepSeek-V3 dims
(H = 7168, I = 2048, E = 256, top-8, one shared expert, fp8 128x128 weights, 1x128 activation
groups), not by moec's size helpers; and buffer lifetimes / peak memory.

T = 1: 8 routed experts + 1 shared expert, each 3 * 7168 * 2048 B = 44.04 MB of fp8 weights plus
fp32 block scales, dominate the ~404 MB the layer moves.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from moec.plan import Backends, Environment, Plan, cost, device_for, make_plan
from moec.plan.cost import experts_hit, peak_bytes
from moec.plan.devices import H200
from moec.plan.sizes import scale_bytes
from moec.plan.stages import Convert, Input, Output
from moec.plan.types import DType, ScaleType, TensorType
from moec.spec import load_spec

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
PLAIN = Environment(frozenset({"triton"}))
FULL = Environment(frozenset({"triton", "deep_gemm", "deep_ep"}))

H, I, E, K = 7168, 2048, 256, 8  # noqa: E741 (the paper's names)
BANDWIDTH = 4274e9  # B/s, the default H200 ceilings
BF16 = 688e12  # FLOP/s
FP8 = 1414e12
FP32 = 51e12  # moec's H200 fp32 rate (the torch router's GEMM), from its device table


def g(n: int) -> int:
    """Groups of 128 along a dim."""
    return math.ceil(n / 128)


EXPERT_FP8_BYTES = 3 * H * I  # gate, up, down
assert EXPERT_FP8_BYTES == 44_040_192
W13_BYTES = 2 * I * H + g(2 * I) * g(H) * 4  # e4m3 + fp32 128x128 scales
W2_BYTES = H * I + g(H) * g(I) * 4


# Slices of the router's hidden dim (its partial logits [S, T, E]): at most 64 tokens, tiles of
# 16 tokens x 32 experts and 128-column K blocks aim at 264 programs: T = 1 has 8 tiles, so 33
# slices wanted, of 2 blocks each (56 blocks): 28; T = 64 has 32 tiles, 8 slices of 7 blocks.
# Beyond 64 tokens, 128 x 128 tiles aim at 132 programs: T = 4096 has 64 tiles, two slices.
ROUTER_SLICES = {1: 28, 64: 8, 4096: 2}


def hand_costs(tokens: int) -> dict[str, tuple[float, float, float]]:
    """(bytes, FLOPs, rate) per stage of the DeepSeek-V3 fp8 plan with Triton (contiguous,
    quantize fused into dispatch, activation + quantize fused, finalize fused into combine).
    Grouped tensors count the T*K rows that carry a token."""
    T, rows = tokens, tokens * K
    S = ROUTER_SLICES[tokens]
    hit = E * (1 - (1 - K / E) ** T)
    return {
        # the router fused into select (moec/runtime/triton_gate.py): x in, the fp32 gate weight
        # as three bf16 parts [3, E, H] (three bf16 GEMMs), S partial fp32 logits written and
        # read back, weights (fp32) and ids (int32) out, correction bias [E]
        "select": (
            T * H * 2 + 3 * E * H * 2 + 2 * S * T * E * 4 + T * K * 4 * 2 + E * 4,
            3 * 2 * T * H * E,
            BF16,
        ),
        # x and ids in; the tokens' e4m3 rows + fp32 1x128 scales (no copy into the layout:
        # the gate/up GEMM gathers them) + m_indices out
        "dispatch": (T * H * 2 + T * K * 4 + T * (H + g(H) * 4) + rows * 4, 0, 0),
        # x in, out; all of its fp8 weights and their 128x128 scales
        "shared_expert": (
            2 * T * H * 2 + EXPERT_FP8_BYTES + (g(2 * I) * g(H) + g(H) * g(I)) * 4,
            6 * T * H * I,
            FP8,
        ),
        "gemm_gate_up": (  # each token's row read once from memory (later reads hit L2)
            T * (H + g(H) * 4) + rows * 4 + rows * 2 * I * 2 + hit * W13_BYTES,
            2 * rows * 2 * I * H,
            FP8,
        ),
        "activation": (rows * 2 * I * 2 + rows * 4 + rows * (I + g(I) * 4), 0, 0),
        "gemm_down": (
            rows * (I + g(I) * 4) + rows * 4 + rows * H * 2 + hit * W2_BYTES,
            2 * rows * H * I,
            FP8,
        ),
        # expert rows, weights, routing, shared output in; the layer's output out
        "combine": (rows * H * 2 + T * K * 4 + rows * 4 + T * H * 2 + T * H * 2, 0, 0),
    }


def spec_of(name: str, *overrides: str):
    return load_spec(EXAMPLES / name, list(overrides)).spec


def plan_of(name: str, *overrides: str, env: Environment = PLAIN):
    """The plan with the shared expert a stage of its own, as the hand computations count it
    (`experts.shared_experts = "auto"` fuses it for Triton and DeepGEMM; see the fused test)."""
    return make_plan(spec_of(name, "experts.shared_experts=separate", *overrides), env)


def cost_of(plan: Plan, tokens: int, device=H200):
    return cost(plan, device, tokens)


def test_default_ceilings_are_the_h200():
    device = device_for("cuda", "sm90")
    assert (device.bandwidth_gbs, device.bf16_tflops, device.fp8_tflops) == (4274, 688, 1414)
    assert device.measured


def test_ceilings_can_be_overridden():
    device = device_for("cuda", "sm90", {"bandwidth_gbs": 3000.0, "fp8_tflops": 1000.0})
    assert (device.bandwidth_gbs, device.bf16_tflops, device.fp8_tflops) == (3000, 688, 1000)
    assert not device.measured  # no longer the measured row


def test_experts_hit_under_uniform_routing():
    assert experts_hit(256, 8, 0) == 0
    assert experts_hit(256, 8, 1) == pytest.approx(8)
    assert experts_hit(256, 8, 64) == pytest.approx(256 * (1 - (1 - 8 / 256) ** 64))
    assert experts_hit(256, 8, 64) == pytest.approx(222.4, abs=0.05)
    assert experts_hit(256, 8, 4096) == pytest.approx(256)
    # 32 local experts of 256, one token: 32 * 8/256 = 1 expected
    assert experts_hit(32, 8, 1, 256) == pytest.approx(1)


@pytest.mark.parametrize("tokens", [1, 64, 4096])
def test_deepseek_v3_fp8_cost_matches_hand_computation(tokens):
    plan = plan_of("deepseek-v3-fp8.toml")
    result = cost_of(plan, tokens)
    expected = hand_costs(tokens)
    got = {s.stage: s for s in result.stages}
    assert list(got) == [s.name for s in plan.order() if s.kind not in ("input", "output")]
    assert set(got) == set(expected)
    for name, (nbytes, flops, rate) in expected.items():
        stage = got[name]
        assert stage.bytes == pytest.approx(nbytes, rel=1e-12), name
        assert stage.flops == pytest.approx(flops, rel=1e-12), name
        floor_s = max(nbytes / BANDWIDTH, flops / rate if flops else 0.0)
        assert stage.floor_ms == pytest.approx(floor_s * 1e3, rel=1e-12), name
    total_bytes = sum(b for b, _, _ in expected.values())
    compute_s = sum(f / r for _, f, r in expected.values() if f)
    assert result.bytes == pytest.approx(total_bytes, rel=1e-12)
    assert result.flops == pytest.approx(sum(f for _, f, _ in expected.values()), rel=1e-12)
    assert result.floor_ms == pytest.approx(max(total_bytes / BANDWIDTH, compute_s) * 1e3)
    assert result.experts_hit == pytest.approx(E * (1 - (1 - K / E) ** tokens))


def test_deepseek_v3_fp8_at_one_token_is_nine_experts_of_weights():
    result = {s.stage: s for s in cost_of(plan_of("deepseek-v3-fp8.toml"), 1).stages}
    expert_stages = ("shared_expert", "gemm_gate_up", "gemm_down")
    weights_and_io = sum(result[s].bytes for s in expert_stages)
    scales = 9 * (g(2 * I) * g(H) + g(H) * g(I)) * 4
    io = hand_costs(1)
    activations = sum(io[s][0] for s in expert_stages) - 9 * EXPERT_FP8_BYTES - scales
    assert weights_and_io == pytest.approx(9 * EXPERT_FP8_BYTES + scales + activations)
    assert 9 * EXPERT_FP8_BYTES == pytest.approx(396.36e6, rel=1e-4)
    assert activations < 1e6  # weights are everything at T = 1
    total = cost_of(plan_of("deepseek-v3-fp8.toml"), 1)
    assert total.bytes == pytest.approx(408.02e6, rel=1e-4)  # router: 3 bf16 parts, 11 MB
    # memory bound: the floor is bytes / bandwidth, about 0.095 ms
    assert total.floor_ms == pytest.approx(total.bytes / BANDWIDTH * 1e3)
    assert total.floor_ms == pytest.approx(0.0955, abs=1e-4)


def test_floor_follows_the_ceilings():
    plan = plan_of("deepseek-v3-fp8.toml")
    base = cost_of(plan, 4096)
    slow = cost_of(plan, 4096, device_for("cuda", "sm90", {"bandwidth_gbs": 2137.0}))
    assert slow.floor_ms == pytest.approx(2 * base.floor_ms)  # memory bound at 4096
    # with unlimited bandwidth the floor is the compute time, stage by stage
    fast = cost_of(plan, 4096, device_for("cuda", "sm90", {"bandwidth_gbs": 1e12}))
    expected = hand_costs(4096)
    compute_s = sum(f / r for _, f, r in expected.values() if f)
    assert fast.floor_ms == pytest.approx(compute_s * 1e3, rel=1e-6)
    faster = cost_of(
        plan, 4096, device_for("cuda", "sm90", {"bandwidth_gbs": 1e12, "fp8_tflops": 2828.0})
    )
    gemm_s = sum(f / r for _, f, r in expected.values() if r == FP8)
    assert faster.floor_ms == pytest.approx((compute_s - gemm_s / 2) * 1e3, rel=1e-6)


def test_fused_shared_expert_at_one_token_is_still_nine_experts_of_weights():
    """Fused (the auto choice for Triton), the shared expert is a ninth expert of the GEMMs."""
    fused = {
        s.stage: s
        for s in cost_of(plan_of("deepseek-v3-fp8.toml", "experts.shared_experts=fused"), 1).stages
    }
    separate = {s.stage: s for s in cost_of(plan_of("deepseek-v3-fp8.toml"), 1).stages}
    assert "shared_expert" not in fused
    weights = (
        3 * H * I + 9 * (g(2 * I) * g(H) + g(H) * g(I)) * 4 / 9
    )  # one expert's values + scales
    moved = fused["gemm_gate_up"].bytes + fused["gemm_down"].bytes
    before = separate["gemm_gate_up"].bytes + separate["gemm_down"].bytes
    assert moved - before == pytest.approx(weights, rel=0.01)


def test_bf16_plan_computes_at_the_bf16_rate():
    result = cost_of(plan_of("deepseek-v3-bf16.toml"), 4096)
    computes = {s.stage: s.compute for s in result.stages}
    assert computes["gemm_gate_up"] == computes["gemm_down"] == "bf16"
    assert computes["shared_expert"] == "bf16"
    assert computes["select"] == "bf16"  # the three-part router (fused in) beside Triton kernels
    torch = {s.stage: s.compute for s in cost_of(plan_of("tiny-cpu-bf16.toml"), 64).stages}
    assert torch["router"] == "fp32"
    fp8 = {s.stage: s.compute for s in cost_of(plan_of("deepseek-v3-fp8.toml"), 1).stages}
    assert fp8["gemm_gate_up"] == fp8["shared_expert"] == "fp8"
    # at T = 1 the weights are the bytes: bf16 experts weigh about twice the fp8 ones
    bf16 = {s.stage: s.bytes for s in cost_of(plan_of("deepseek-v3-bf16.toml"), 1).stages}
    fp8_bytes = {s.stage: s.bytes for s in cost_of(plan_of("deepseek-v3-fp8.toml"), 1).stages}
    assert bf16["gemm_down"] == pytest.approx(2 * fp8_bytes["gemm_down"], rel=0.01)


def test_flops_are_linear_in_tokens():
    plan = plan_of("deepseek-v3-fp8.toml")
    one, many = cost_of(plan, 1), cost_of(plan, 1000)
    for a, b in zip(one.stages, many.stages, strict=True):
        assert b.flops == pytest.approx(1000 * a.flops)


def test_expert_parallel_ranks_see_the_tokens_of_every_rank():
    """ep = 2: each rank holds 128 experts and receives the tokens of both ranks."""
    plan = plan_of("deepseek-v3-ep2-all2all.toml")
    for tokens in (1, 16, 256):
        result = cost_of(plan, tokens)
        assert result.experts_hit == pytest.approx(128 * (1 - (1 - 8 / 256) ** (2 * tokens)))
    ll = plan_of("deepseek-v3-deepep-ll-ep8.toml")
    assert cost_of(ll, 1).experts_hit == pytest.approx(32 * (1 - (1 - 8 / 256) ** 8))


def test_fused_shared_experts_count_as_hit_experts():
    plan = plan_of("deepseek-v3-fp8.toml", 'experts.shared_experts="fused"')
    result = cost_of(plan, 1)
    assert result.experts_hit == pytest.approx(9)
    stages = {s.stage: s for s in result.stages}
    assert "shared_expert" not in stages
    assert stages["gemm_gate_up"].flops == 2 * 9 * 2 * I * H


def test_converters_cost_only_their_scales():
    """A converter rewrites scales; the e4m3 values pass through untouched."""
    rows = 64 * K
    masked = plan_of(
        "deepseek-v3-fp8.toml",
        "experts.layout=masked",
        'experts.gemm_backend="deep_gemm"',
        env=FULL,
    )
    sm90 = {s.stage: s.bytes for s in cost_of(masked, 64).stages}
    # K-major fp32 in, MN-major TMA-aligned fp32 out (512 rows: already 16-byte aligned)
    assert sm90["convert_a_for_gemm_gate_up"] == 2 * rows * g(H) * 4
    assert sm90["convert_hq_for_gemm_down"] == 2 * rows * g(I) * 4
    # UE8M0 packed four per int32 (sm100's layout): a byte per group, groups padded to 4
    packed = TensorType(
        DType.e4m3, ("M", "H"), scale=ScaleType("1x128", DType.ue8m0x4, "MN", True, True)
    )
    assert scale_bytes(packed, rows, H) == rows * ((g(H) + 3) // 4 * 4)


# --- buffer lifetimes and peak memory -----------------------------------------------------


def test_peak_memory_by_hand_triton_contiguous():
    """T = 1, Triton, contiguous with block_m 16: buffers hold 16 * 8 = 128 rows (worst case:
    8 experts with one row each, each padded to 16). The peak is while gemm_down runs: the
    quantized intermediate, its output, the routing, the top-k weights and the shared output."""
    plan = plan_of("deepseek-v3-fp8.toml")
    assert plan.tiles.buckets[0].block_m == 16 and plan.stage("dispatch").row_padding is None
    buf = 16 * 8
    at_gemm_down = K * 4 + buf * 4 + H * 2 + buf * (I + g(I) * 4) + buf * H * 2
    assert cost_of(plan, 1).peak_bytes == at_gemm_down == 2_120_224


def test_peak_memory_by_hand_deep_gemm():
    """T = 1, deep_gemm, contiguous with block_m 128: 8 * 128 = 1024 rows."""
    plan = plan_of("deepseek-v3-fp8.toml", 'experts.gemm_backend="deep_gemm"', env=FULL)
    buf = 8 * 128
    at_gemm_down = K * 4 + buf * 4 + H * 2 + buf * (I + g(I) * 4) + buf * H * 2
    assert cost_of(plan, 1).peak_bytes == at_gemm_down == 16_861_216


def test_peak_memory_masked_layout_uses_max_m_rows():
    plan = plan_of("tiny-cpu.toml")  # H 256, I 128, E 16, top-4, torch, masked
    assert plan.backends.layout == "masked"
    for tokens in (1, 255, 256):
        max_m = (tokens // 256 + 1) * 256
        buf = 16 * max_m
        # while gemm_gate_up runs: its e4m3 input + fp32 scales (2 groups of 128), its bf16
        # [*, 2I] output, routing [E] int32, the top-k weights, the shared output
        at_gate_up = (
            buf * (256 + 2 * 4) + buf * 256 * 2 + 16 * 4 + tokens * 4 * 4 + tokens * 256 * 2
        )
        assert cost_of(plan, tokens).peak_bytes == at_gate_up


def test_peak_memory_grows_with_tokens():
    plan = plan_of("deepseek-v3-fp8.toml")
    peaks = [cost_of(plan, t).peak_bytes for t in (1, 64, 4096, 16384)]
    assert peaks == sorted(peaks) and peaks[0] < peaks[-1]


def test_a_converted_tensor_aliases_its_values():
    """input -> convert -> output: the converter allocates only new scales, so the peak is the
    values once plus both sets of scales, not the tensor twice."""
    v3 = plan_of("deepseek-v3-fp8.toml")
    have = TensorType(DType.e4m3, ("T", "H"), scale=ScaleType("1x128", DType.float32))
    want = have.with_scale(ScaleType("1x128", DType.float32, "MN", True))
    plan = Plan(v3.name, v3.spec_hash, v3.layer, backends=Backends("torch", "contiguous", "torch"))
    plan.add_stage(Input(name="input", backend="-", outputs={"x": have}))
    plan.add_stage(Convert(name="convert_x", backend="torch", steps=(), outputs={"xc": want}))
    plan.add_stage(Output(name="output", backend="-"))
    plan.connect("input", "convert_x", "x")
    plan.connect("convert_x", "output", "xc")
    tokens = 8
    values, scales = tokens * H, tokens * g(H) * 4
    assert peak_bytes(plan, tokens) == values + 2 * scales


@pytest.mark.parametrize("tokens", [1, 64, 200_000])
def test_a_hash_table_costs_the_rows_its_tokens_read(tokens):
    """The select stage of a hash-routed layer reads its partial logits and the token ids, one
    [K] int32 row of tid2eid per token (at most the whole table, V rows), and writes the
    weights and ids."""
    from moec.plan.tuning import router_slices

    plan = plan_of("deepseek-v4-flash-hash.toml", "target.max_num_tokens=262144")
    select = {s.stage: s for s in cost_of(plan, tokens).stages}["select"]
    experts, top_k, vocab = 256, 6, 129280
    logits = router_slices(plan.layer, tokens) * tokens * experts * 4
    token_ids, table = tokens * 8, min(tokens, vocab) * top_k * 4
    written = 2 * tokens * top_k * 4
    assert select.bytes == pytest.approx(logits + token_ids + table + written, rel=1e-12)
