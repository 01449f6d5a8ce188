"""Plan decisions about kernels: the torch backend's GEMM, and Triton tile tables (tuned on a
GPU and shipped in moec/plan/tuned/, or the default table)."""

from __future__ import annotations

import json

from conftest import EXAMPLES

from moec.plan import Environment, make_plan
from moec.plan.tuning import TUNED_DIR, table_key
from moec.spec import load_spec

TRITON = Environment(frozenset({"triton"}))


def plan_of(example, *overrides):
    return make_plan(load_spec(EXAMPLES / example, list(overrides)).spec, TRITON)


def test_torch_gemm_on_cuda_bf16_is_one_launch_without_host_sync():
    contiguous = plan_of(
        "deepseek-v3-bf16.toml", "experts.gemm_backend=torch", "experts.layout=contiguous"
    )
    masked = plan_of("deepseek-v3-bf16.toml", "experts.gemm_backend=torch", "experts.layout=masked")
    assert contiguous.stage("gemm_gate_up").torch_kernel == "grouped_mm"
    assert masked.stage("gemm_down").torch_kernel == "bmm"
    for plan in (contiguous, masked):
        assert not plan.stage("gemm_gate_up").syncs_host
        assert plan.decision("CUDA graph").choice == "yes"


def test_torch_gemm_of_quantized_or_cpu_layers_loops_over_experts():
    for plan in (
        plan_of("deepseek-v3-fp8.toml", "experts.gemm_backend=torch"),
        plan_of("tiny-cpu-bf16.toml"),
    ):
        stage = plan.stage("gemm_gate_up")
        assert stage.torch_kernel == "loop" and stage.syncs_host
        assert plan.decision("CUDA graph").choice == "no"


def test_tuned_table_is_used_and_named():
    plan = plan_of("deepseek-v3-fp8.toml")
    facts = plan.layer
    tuned = json.loads((TUNED_DIR / "h200.json").read_text())
    buckets = plan.tiles.buckets
    assert [(b.max_tokens, b.block_m, b.gate_up, b.down) for b in buckets] == [
        (b["max_tokens"], b["block_m"], b["gate_up"], b["down"]) for b in tuned[table_key(facts)]
    ]
    elementwise = tuned[f"elementwise/{table_key(facts)}"]
    assert (plan.tiles.permute, plan.tiles.act, plan.tiles.combine) == (
        elementwise["permute"],
        elementwise["act"],
        elementwise["combine"],
    )
    decision = plan.decision("triton tiles")
    assert "tuned on the H200" in decision.reason and table_key(facts) in decision.reason
    limits = [b.max_tokens for b in buckets]
    assert limits[-1] is None and limits[:-1] == sorted(limits[:-1])


def test_fused_shared_experts_share_the_routed_table():
    separate = plan_of("deepseek-v3-fp8.toml")
    fused = plan_of("deepseek-v3-fp8.toml", "experts.shared_experts=fused")
    assert fused.tiles.buckets == separate.tiles.buckets


def test_untuned_shapes_get_the_default_table_and_cpu_one_bucket():
    untuned = plan_of("deepseek-v3-fp8.toml", "model.hidden_size=1024")
    assert "default table" in untuned.decision("triton tiles").reason
    assert len(untuned.tiles.buckets) > 1
    cpu = plan_of("tiny-cpu-triton.toml")
    assert len(cpu.tiles.buckets) == 1 and "interpreted" in cpu.decision("triton tiles").reason
