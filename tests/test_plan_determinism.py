"""Same spec, same plan, same order: building twice, from a spec written in another key order,
or in another process with another hash seed, gives byte-identical JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from moec.plan import Environment, device_for, make_plan
from moec.plan.export import plan_data
from moec.spec import load_spec, parse_spec

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
FULL = Environment(frozenset({"triton", "deep_gemm", "deep_ep"}))
TOKENS = [1, 64, 4096]

V3_FP8 = """
name = "deepseek_v3_fp8"
description = "DeepSeek-V3 MoE layer, fp8 block-scaled, one H200"

[model]
preset = "deepseek-v3"

[quant]
scheme = "fp8_block"
checkpoint = "quantized"

[experts]
gemm_backend = "auto"
layout = "auto"

[target]
device = "cuda"
arch = "sm90"
dtype = "bfloat16"
max_num_tokens = 16384
"""

# The same layer: tables, keys and preset values spelled out in another order.
V3_FP8_REORDERED = """
# tables in another order, preset values written out, defaults explicit
[target]
max_num_tokens = 16384
dtype = "bfloat16"
arch = "sm90"
device = "cuda"

[experts]
layout = "auto"
gemm_backend = "auto"

[router]
routed_scaling_factor = 2.5
norm_topk_prob = true
topk_group = 4
n_group = 8
topk_method = "noaux_tc"
scoring_func = "sigmoid"

[quant]
checkpoint = "quantized"
scale_dtype = "fp32"
weight_block = [128, 128]
scheme = "fp8_block"

[model]
n_shared_experts = 1
num_experts_per_tok = 8
n_routed_experts = 256
moe_intermediate_size = 2048
hidden_size = 7168
preset = "deepseek-v3"

[parallel]
dispatch = "local"
"""


def data_of(text: str, env: Environment) -> str:
    # the description is free text and part of the spec's hash
    spec = parse_spec(text).spec
    plan = make_plan(spec, env)
    device = device_for(spec.target.device, spec.target.arch)
    return json.dumps(plan_data(plan, spec, device, TOKENS), indent=2)


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.toml")), ids=lambda p: p.stem)
@pytest.mark.parametrize("env", [Environment(frozenset({"triton"})), FULL], ids=["plain", "dg"])
def test_building_twice_gives_identical_json(path, env):
    text = path.read_text()
    assert data_of(text, env) == data_of(text, env)


@pytest.mark.parametrize("env", [Environment(frozenset({"triton"})), FULL], ids=["plain", "dg"])
def test_key_order_does_not_change_the_plan(env):
    reordered = 'description = "DeepSeek-V3 MoE layer, fp8 block-scaled, one H200"\n'
    reordered += 'name = "deepseek_v3_fp8"\n' + V3_FP8_REORDERED
    first, second = data_of(V3_FP8, env), data_of(reordered, env)
    assert first == second
    assert json.loads(first)["spec"]["hash"] == json.loads(second)["spec"]["hash"]
    # and the example file is this spec
    assert first == data_of((EXAMPLES / "deepseek-v3-fp8.toml").read_text(), env)


def test_a_different_spec_gives_a_different_hash():
    other = V3_FP8.replace("max_num_tokens = 16384", "max_num_tokens = 8192")
    assert (
        json.loads(data_of(V3_FP8, FULL))["spec"]["hash"]
        != json.loads(data_of(other, FULL))["spec"]["hash"]
    )


def test_plan_order_is_stable_across_builds():
    spec = load_spec(EXAMPLES / "deepseek-v3-fp8.toml").spec
    orders = {tuple(s.name for s in make_plan(spec, FULL).order()) for _ in range(3)}
    assert len(orders) == 1
    decisions = {tuple(make_plan(spec, FULL).decisions) for _ in range(3)}
    assert len(decisions) == 1


_CHILD = """
import json, sys
from moec.plan import Environment, device_for, make_plan
from moec.plan.export import plan_data
from moec.spec import load_spec



spec = load_spec(sys.argv[1]).spec
plan = make_plan(spec, Environment(frozenset({"triton"})))
device = device_for(spec.target.device, spec.target.arch)
sys.stdout.write(json.dumps(plan_data(plan, spec, device, [1, 64, 4096]), indent=2))
"""


def test_json_is_identical_across_processes_and_hash_seeds():
    path = str(EXAMPLES / "deepseek-v3-ep2-all2all.toml")
    outputs = []
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run(
            [sys.executable, "-c", _CHILD, path],
            capture_output=True,
            text=True,
            env=env,
            cwd=ROOT,
            check=True,
        )
        outputs.append(done.stdout)
    assert outputs[0] == outputs[1]
    assert outputs[0] == data_of(Path(path).read_text(), Environment(frozenset({"triton"})))
