"""The communication cost model (moec/plan/comm.py): counting, hand-computed bytes, and the
check against DeepEP's published numbers."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
from conftest import EXAMPLES

from moec.plan import Environment, cost, device_for, make_plan
from moec.plan.comm import distinct_holders
from moec.spec import load_spec

FULL = Environment(frozenset({"triton", "deep_gemm", "deep_ep"}))
ROW_FP8 = 7168 + 7168 // 128 * 4 + 8 * 8  # e4m3 values, fp32 1x128 scales, top-8 ids + weights


def plan_of(*overrides, example="deepseek-v3-ep2-all2all.toml"):
    return make_plan(load_spec(EXAMPLES / example, list(overrides)).spec, FULL)


def stage_row(plan, tokens, name, device=None):
    device = device or device_for("cuda", "sm90")
    (row,) = [s for s in cost(plan, device, tokens).stages if s.stage == name]
    return row


@pytest.mark.parametrize(("experts", "k", "holders"), [(8, 2, 4), (12, 3, 3), (8, 4, 8), (6, 6, 2)])
def test_distinct_holders_counts_every_draw(experts, k, holders):
    per = experts // holders
    draws = list(itertools.combinations(range(experts), k))
    brute = sum(len({e // per for e in draw}) for draw in draws) / len(draws)
    assert distinct_holders(experts, k, holders) == pytest.approx(brute)


def test_group_limited_routing_reaches_topk_group_ranks():
    """DeepSeek-V3 at EP=8: each rank holds one of the 8 groups, a token keeps 4: 4 ranks."""
    plan = plan_of("parallel.ep_size=8")
    row = stage_row(plan, 100, "dispatch")
    assert row.link_bytes == pytest.approx(100 * 4 * 7 / 8 * ROW_FP8)
    assert row.nic_bytes == 0


def test_all2all_bytes_by_hand_at_ep2():
    """EP=2: 8 groups over 2 ranks, 4 kept: a token misses a rank only when its 4 groups are
    the other rank's 4 (1 in 70); half of its destinations are remote."""
    plan = plan_of()
    ranks = 2 * (1 - 1 / 70)
    dispatch = stage_row(plan, 4096, "dispatch")
    assert dispatch.link_bytes == pytest.approx(4096 * ranks / 2 * ROW_FP8)
    combine = stage_row(plan, 4096, "combine")
    assert combine.link_bytes == pytest.approx(4096 * ranks / 2 * 7168 * 2)  # bf16 partials
    assert dispatch.floor_ms >= dispatch.link_bytes / 389.6e9 * 1e3


def test_tensor_parallel_all_reduce_is_a_ring():
    plan = plan_of(
        "parallel.dispatch=local", "parallel.ep_size=1", "parallel.tp_size=4", "experts.layout=auto"
    )
    row = stage_row(plan, 64, "finalize")
    assert row.link_bytes == pytest.approx(2 * 3 / 4 * 64 * 7168 * 2)


def test_nodes_split_traffic_between_nvlink_and_network():
    """EP=64 on 8 nodes: all2all sends to remote ranks; 7 of the other 63 share the node."""
    plan = plan_of("parallel.ep_size=64", "parallel.nodes=8")
    row = stage_row(plan, 128, "dispatch")
    total = row.link_bytes + row.nic_bytes
    assert row.link_bytes / total == pytest.approx(7 / 63)
    assert row.floor_ms == pytest.approx(row.nic_bytes / 50e9 * 1e3)


# DeepEP's published low-latency dispatch (its README: H800, CX7 400 Gb/s RDMA, 128 tokens,
# hidden 7168, top-8 of 256 experts, FP8 dispatch), in microseconds per EP width, 8 GPUs a node.
DEEPEP_LOW_LATENCY_DISPATCH_US = {8: 77, 16: 118, 32: 155, 64: 173, 128: 192, 256: 194}
H800 = {"link_gbs": 160.0, "nic_gbs": 50.0}  # DeepEP's own figures for its test machines


@pytest.mark.parametrize(("ep", "published"), sorted(DEEPEP_LOW_LATENCY_DISPATCH_US.items()))
def test_low_latency_floor_against_deepep_published(ep, published):
    """The model is a floor: the published time is at or above it, and within 2.5x of it."""
    plan = plan_of(
        "parallel.dispatch=deepep_low_latency",
        f"parallel.ep_size={ep}",
        f"parallel.nodes={max(1, ep // 8)}",
        "parallel.max_tokens_per_rank=128",
        "experts.layout=masked",
        "target.max_num_tokens=128",
    )
    device = replace(device_for("cuda", "sm90"), **H800)
    floor_us = stage_row(plan, 128, "dispatch", device).floor_ms * 1e3
    assert floor_us <= published <= 2.5 * floor_us, f"floor {floor_us:.0f} us"


# DeepEP's published normal-kernel dispatch bandwidth (its README: H800, 4096 tokens, hidden
# 7168, top-8 of 256 experts, FP8 dispatch), GB/s per EP width. Its tests count bytes their own
# way (tests/test_intranode.py, test_internode.py): intranode, every row a rank receives (its own
# included) at (1 + 4 / 128) bytes per value; internode, one row per (token, destination node),
# the token's own node included. Their routing: intranode, top-8 of all experts; internode,
# min(nodes, 4) of `nodes` groups (one per node) by their best score, then top-8 within them.
DEEPEP_NORMAL_DISPATCH_GBS = {8: 153, 16: 43, 32: 58, 64: 51}


def deepep_normal_ratio(ep: int, published: float) -> float:
    """DeepEP's published dispatch time over the model's floor on DeepEP's machines."""
    nodes, tokens, hidden, top_k = max(1, ep // 8), 4096, 7168, 8
    kept = min(nodes, 4)
    plan = plan_of(
        "parallel.dispatch=deepep_normal",
        f"parallel.ep_size={ep}",
        f"parallel.nodes={nodes}",
        f"router.n_group={nodes}",
        f"router.topk_group={kept}",
    )
    device = replace(device_for("cuda", "sm90"), **H800)
    floor_us = stage_row(plan, tokens, "dispatch", device).floor_ms * 1e3
    row = hidden * (1 + 4 / 128)  # DeepEP's bytes per row: e4m3 values and fp32 1x128 scales
    if nodes == 1:  # rows received per rank: a token reaches each rank holding one of its experts
        rows = tokens * distinct_holders(256, top_k, ep)
    elif kept < nodes:  # each kept group is one node, and its best expert is among the top-8
        rows = tokens * kept
    else:  # no group limit: the nodes holding any of the top-8 of all experts
        rows = tokens * distinct_holders(256, top_k, nodes)
    return rows * row / (published * 1e9) * 1e6 / floor_us


@pytest.mark.parametrize(("ep", "published"), sorted(DEEPEP_NORMAL_DISPATCH_GBS.items()))
def test_normal_floor_against_deepep_published(ep, published):
    """The published time (DeepEP's bytes over its bandwidth) is at or above the model's floor,
    and within 2.5x of it."""
    assert 1.0 <= deepep_normal_ratio(ep, published) <= 2.5


def test_explain_shows_what_each_rank_sends(capsys):
    from moec.cli import main

    assert main(["explain", str(EXAMPLES / "deepseek-v3-ep2-all2all.toml"), "--tokens", "64"]) == 0
    text = capsys.readouterr().out
    assert "2 ranks on 1 node(s): NVLink 389.6 GB/s" in text
    assert "NVLink" in text.split("T = 64")[1] and "network" in text.split("T = 64")[1]
    assert main(["explain", str(EXAMPLES / "tiny-cpu.toml")]) == 0
    assert "NVLink" not in capsys.readouterr().out  # one rank: no traffic columns


def test_the_dispatch_reason_counts_the_experts_a_rank_holds():
    """With replicas a rank holds more physical experts than its share of the logical ones:
    the dispatch decision says so (it said 8 where the layer holds 10)."""
    from moec.plan.resolve import _dispatch_reason

    sets = ["parallel.ep_size=2", "parallel.dispatch=all2all", "parallel.redundant_experts=4"]
    reason = _dispatch_reason(load_spec(EXAMPLES / "tiny-cpu.toml", sets).spec)
    assert reason.startswith("10 experts per rank (of 20 physical: 4 replicas)")
