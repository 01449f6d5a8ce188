"""Every combination rule in `moec/spec/rules.py`, each broken by a spec that names its rule and
key path; and the `Problem` / `MoecError` records the rules and the loader produce.

The specs here are data (what TOML parses to) over a small valid base, so each case shows only
the keys that break the rule. The corpus in `tests/bad_specs/` breaks every rule once more
through `moec validate`.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest

from moec.errors import MoecError, Problem, problem
from moec.plan.matrix import rejecting_rules, support_matrix
from moec.spec import check_raw, parse_spec
from moec.spec.locate import key_lines, line_of
from moec.spec.rules import RULES

BASE: dict[str, Any] = {
    "name": "rules",
    "model": {
        "hidden_size": 256,
        "moe_intermediate_size": 128,
        "n_routed_experts": 16,
        "num_experts_per_tok": 4,
        "n_shared_experts": 1,
    },
}
CUDA = {"target.device": "cuda", "target.arch": "sm90"}
LOW_LATENCY = {
    **CUDA,
    "parallel.dispatch": "deepep_low_latency",
    "parallel.ep_size": 2,
    "parallel.max_tokens_per_rank": 128,
    "target.max_num_tokens": 128,
}


def spec_data(changes: dict[str, Any]) -> dict[str, Any]:
    """BASE with dotted `changes` applied."""
    data = copy.deepcopy(BASE)
    for key, value in changes.items():
        *tables, leaf = key.split(".")
        node = data
        for table in tables:
            node = node.setdefault(table, {})
        node[leaf] = value
    return data


def problems_of(changes: dict[str, Any]) -> list[Problem]:
    with pytest.raises(MoecError) as caught:
        check_raw(spec_data(changes))
    return caught.value.problems


# (rule, the keys that break it, the key path its problem names)
CASES: list[tuple[str, dict[str, Any], str]] = [
    ("block_shape", {"quant.weight_block": [128, 128]}, "quant.weight_block"),
    (
        "block_shape",
        {"quant.scheme": "fp8_per_tensor", "quant.weight_block": [128, 128]},
        "quant.weight_block",
    ),
    (
        "block_shape",
        {"quant.scheme": "fp8_block", "quant.weight_block": [128]},
        "quant.weight_block",
    ),
    (
        "block_shape",
        {"quant.scheme": "fp8_block", "quant.weight_block": [128, 128, 1]},
        "quant.weight_block",
    ),
    (
        "mx_block_and_scales",
        {"quant.scheme": "mxfp8", "quant.weight_block": [32, 32]},
        "quant.weight_block",
    ),
    (
        "mx_block_and_scales",
        {"quant.scheme": "mxfp4", "quant.scale_dtype": "fp32"},
        "quant.scale_dtype",
    ),
    (
        "fp8_block_shape",
        {"quant.scheme": "fp8_block", "quant.weight_block": [128, 64]},
        "quant.weight_block",
    ),
    (
        "block_dynamic_activations",
        {"quant.scheme": "mxfp8", "quant.activation_scheme": "static"},
        "quant.activation_scheme",
    ),
    ("static_needs_per_tensor", {"quant.activation_scheme": "static"}, "quant.activation_scheme"),
    ("scale_dtype_applies", {"quant.scale_dtype": "ue8m0"}, "quant.scale_dtype"),
    (
        "scale_dtype_applies",
        {"quant.scheme": "fp8_per_tensor", "quant.scale_dtype": "ue8m0"},
        "quant.scale_dtype",
    ),
    (
        "block_divides_intermediate",
        {"quant.scheme": "fp8_block", "model.moe_intermediate_size": 320},
        "model.moe_intermediate_size",
    ),
    (
        "block_divides_intermediate",
        {"quant.scheme": "fp8_block", "model.moe_intermediate_size": 256, "parallel.tp_size": 4},
        "model.moe_intermediate_size",
    ),
    (
        "block_divides_shared",
        {
            "quant.scheme": "mxfp8",
            "quant.shared_scheme": "fp8_block",
            "experts.shared_experts": "separate",
            "model.moe_intermediate_size": 64,
        },
        "model.moe_intermediate_size",
    ),
    (
        "block_divides_shared",  # mxfp4's shared experts default to fp8_block
        {"quant.scheme": "mxfp4", "model.moe_intermediate_size": 64},
        "model.moe_intermediate_size",
    ),
    (
        "group_divides_hidden",
        {"quant.scheme": "mxfp8", "model.hidden_size": 200},
        "model.hidden_size",
    ),
    (
        "groups_divide_intermediate",
        {"quant.scheme": "mxfp4", "model.moe_intermediate_size": 80},
        "model.moe_intermediate_size",
    ),
    (
        "checkpoint_format",
        {"quant.scheme": "mxfp4", "quant.checkpoint": "bf16"},
        "quant.checkpoint",
    ),
    (
        "checkpoint_format",
        {
            "quant.scheme": "fp8_per_tensor",
            "quant.activation_scheme": "static",
            "quant.checkpoint": "bf16",
        },
        "quant.checkpoint",
    ),
    ("topk_within_experts", {"model.num_experts_per_tok": 20}, "model.num_experts_per_tok"),
    ("grouped_topk_shape", {"router.topk_group": 2}, "router.topk_group"),
    ("grouped_topk_shape", {"router.n_group": 2}, "router.n_group"),
    (
        "grouped_topk_shape",
        {"router.topk_method": "group_limited_greedy", "router.n_group": 5},
        "router.n_group",
    ),
    (
        "grouped_topk_shape",
        {"router.topk_method": "group_limited_greedy", "router.n_group": 2, "router.topk_group": 3},
        "router.topk_group",
    ),
    (
        "grouped_topk_shape",
        {"router.topk_method": "group_limited_greedy", "router.n_group": 16},
        "model.num_experts_per_tok",
    ),
    (
        "grouped_topk_shape",
        {
            "router.scoring_func": "sigmoid",
            "router.topk_method": "noaux_tc",
            "router.n_group": 16,
            "router.topk_group": 4,
        },
        "router.n_group",
    ),
    ("noaux_tc_scoring", {"router.topk_method": "noaux_tc"}, "router.scoring_func"),
    ("hash_routing", {"router.topk_method": "hash"}, "model.vocab_size"),
    ("hash_routing", {"model.vocab_size": 64}, "model.vocab_size"),
    (
        "hash_routing",
        {
            "router.topk_method": "hash",
            "model.vocab_size": 64,
            "router.n_group": 2,
            "router.topk_group": 1,
        },
        "router.n_group",
    ),
    (
        "shared_scheme_without_shared_experts",
        {"quant.shared_scheme": "fp8_block", "model.n_shared_experts": 0},
        "quant.shared_scheme",
    ),
    (
        "overlapped_shared_experts",
        {"experts.shared_experts": "overlapped", "model.n_shared_experts": 0},
        "experts.shared_experts",
    ),
    (
        "fused_shared_experts",
        {"experts.shared_experts": "fused", "model.n_shared_experts": 0},
        "experts.shared_experts",
    ),
    (
        "fused_shared_experts",
        {"experts.shared_experts": "fused", "quant.scheme": "mxfp4"},  # shared default fp8_block
        "quant.shared_scheme",
    ),
    (
        "fused_shared_experts",
        {"experts.shared_experts": "fused", "parallel.dispatch": "all2all", "parallel.ep_size": 2},
        "experts.shared_experts",
    ),
    (
        "fused_shared_experts",
        {"experts.shared_experts": "fused", "parallel.tp_size": 2},
        "experts.shared_experts",
    ),
    ("deep_gemm_target", {"experts.gemm_backend": "deep_gemm"}, "experts.gemm_backend"),
    (
        "deep_gemm_target",
        {**CUDA, "target.arch": "sm89", "experts.gemm_backend": "deep_gemm"},
        "experts.gemm_backend",
    ),
    (
        "deep_gemm_target",
        {
            **CUDA,
            "experts.gemm_backend": "deep_gemm",
            "activation": {"kind": "situ", "beta": 1.0, "linear_beta": 1.0},
        },
        "activation.kind",
    ),
    (  # mxfp4 runs on deep_gemm only on sm90 (converted to fp8 blocks)
        "deep_gemm_target",
        {
            **CUDA,
            "target.arch": "sm100",
            "experts.gemm_backend": "deep_gemm",
            "quant.scheme": "mxfp4",
        },
        "quant.scheme",
    ),
    (
        "deep_gemm_target",
        {**CUDA, "experts.gemm_backend": "deep_gemm", "quant.scheme": "fp8_per_tensor"},
        "quant.scheme",
    ),
    (
        "deep_gemm_target",
        {**CUDA, "experts.gemm_backend": "deep_gemm", "quant.scheme": "mxfp8"},
        "quant.scheme",
    ),
    (
        "deep_gemm_target",
        {**CUDA, "experts.gemm_backend": "deep_gemm", "target.dtype": "float16"},
        "target.dtype",
    ),
    (
        "deep_gemm_target",
        {**CUDA, "experts.gemm_backend": "deep_gemm", "model.moe_intermediate_size": 192},
        "model.moe_intermediate_size",
    ),
    (
        "deep_gemm_target",
        {
            **CUDA,
            "experts.gemm_backend": "deep_gemm",
            "parallel.tp_size": 2,
            "model.moe_intermediate_size": 128,
        },
        "model.moe_intermediate_size",
    ),
    (
        "deep_gemm_target",
        {
            **CUDA,
            "target.arch": "sm100",
            "experts.gemm_backend": "deep_gemm",
            "quant.scheme": "fp8_block",
            "quant.scale_dtype": "fp32",
        },
        "quant.scale_dtype",
    ),
    (
        "fp8_needs_arch",
        {
            **CUDA,
            "target.arch": "sm80",
            "quant.scheme": "fp8_per_tensor",
            "experts.gemm_backend": "triton",
        },
        "target.arch",
    ),
    (
        "quantized_not_float16",
        {"quant.scheme": "fp8_per_tensor", "target.dtype": "float16"},
        "target.dtype",
    ),
    (
        "masked_budget_needs_auto",
        {"experts.layout": "contiguous", "experts.masked_memory_budget_gib": 4.0},
        "experts.masked_memory_budget_gib",
    ),
    ("nodes_divide_ranks", {"parallel.tp_size": 2, "parallel.nodes": 3}, "parallel.nodes"),
    ("tp_within_experts", {"parallel.tp_size": 32}, "parallel.tp_size"),
    ("tp_within_experts", {"parallel.tp_size": 5}, "parallel.tp_size"),
    (
        "ep_divides_experts",
        {"parallel.dispatch": "all2all", "parallel.ep_size": 5},
        "parallel.ep_size",
    ),
    (
        "ep_divides_experts",
        {"parallel.dispatch": "all2all", "parallel.ep_size": 2, "parallel.redundant_experts": 3},
        "parallel.ep_size",
    ),
    ("placement_covers_experts", {"parallel.placement": [[0, 1, 2]]}, "parallel.placement"),
    (
        "placement_covers_experts",
        {"parallel.redundant_experts": 1, "parallel.placement": [list(range(16)) + [16]]},
        "parallel.placement",
    ),
    (
        "placement_covers_experts",
        {
            "parallel.dispatch": "all2all",
            "parallel.ep_size": 2,
            "parallel.redundant_experts": 2,
            "parallel.placement": [list(range(10)), list(range(10, 16)) + [0, 1]],
        },
        "parallel.placement",
    ),
    (
        "replicas_not_fused_shared",
        {
            "parallel.redundant_experts": 2,
            "experts.shared_experts": "fused",
            "model.n_shared_experts": 1,
        },
        "experts.shared_experts",
    ),  # fmt: skip
    ("replicas_not_fused_shared", {"parallel.replica_choice": "random"}, "parallel.replica_choice"),
    ("dispatch_matches_ep", {"parallel.ep_size": 4}, "parallel.dispatch"),
    ("dispatch_matches_ep", {"parallel.dispatch": "all2all"}, "parallel.ep_size"),
    (
        "dispatch_matches_ep",
        {"parallel.dispatch": "all2all", "parallel.ep_size": 2, "parallel.tp_size": 2},
        "parallel.tp_size",
    ),
    (
        "ep_needs_group_scales",
        {"quant.scheme": "fp8_per_tensor", "parallel.dispatch": "all2all", "parallel.ep_size": 2},
        "quant.scheme",
    ),
    (
        "deepep_target",
        {"parallel.dispatch": "deepep_normal", "parallel.ep_size": 2},
        "parallel.dispatch",
    ),
    (
        "deepep_target",
        {**LOW_LATENCY, "target.arch": "sm89"},
        "parallel.dispatch",
    ),
    (
        "low_latency_needs_masked_and_bound",
        {**LOW_LATENCY, "experts.layout": "contiguous"},
        "experts.layout",
    ),
    (
        "low_latency_needs_masked_and_bound",
        {k: v for k, v in LOW_LATENCY.items() if k != "parallel.max_tokens_per_rank"},
        "parallel.max_tokens_per_rank",
    ),
    (
        "low_latency_needs_masked_and_bound",
        {**LOW_LATENCY, "parallel.max_tokens_per_rank": 1025, "target.max_num_tokens": 1},
        "parallel.max_tokens_per_rank",
    ),
    (
        "low_latency_needs_masked_and_bound",
        {**LOW_LATENCY, "target.max_num_tokens": 129},
        "target.max_num_tokens",
    ),
    (
        "deepep_target",
        {"parallel.dispatch": "deepep_normal", "parallel.ep_size": 2, "target.dtype": "float32"},
        "target.dtype",
    ),
    (
        "deepep_activation_format",
        {**LOW_LATENCY, "quant.scheme": "fp8_per_tensor"},
        "quant.scheme",
    ),
    (
        "deepep_normal_ranks",
        {**CUDA, "parallel.dispatch": "deepep_normal", "parallel.ep_size": 16},
        "parallel.nodes",
    ),
    (
        "deepep_normal_ranks",
        {**CUDA, "parallel.dispatch": "deepep_normal", "parallel.ep_size": 16, "parallel.nodes": 4},
        "parallel.nodes",
    ),
    (
        "low_latency_needs_masked_and_bound",
        {
            **LOW_LATENCY,
            "parallel.max_tokens_per_rank": 3,
            "parallel.ep_size": 2,
            "target.max_num_tokens": 3,
        },
        "parallel.max_tokens_per_rank",
    ),
    ("low_latency_kernel_shapes", LOW_LATENCY, "model.hidden_size"),
    (
        "low_latency_kernel_shapes",
        {**LOW_LATENCY, "model.num_experts_per_tok": 12},
        "model.num_experts_per_tok",
    ),
    (
        "normal_dispatch_needs_contiguous",
        {
            **CUDA,
            "parallel.dispatch": "deepep_normal",
            "parallel.ep_size": 2,
            "experts.layout": "masked",
        },
        "experts.layout",
    ),
    ("token_bound_applies", {"parallel.max_tokens_per_rank": 64}, "parallel.max_tokens_per_rank"),
    (
        "nic_bandwidth_needs_nodes",
        {"parallel.nic_bandwidth_gbs": 50.0},
        "parallel.nic_bandwidth_gbs",
    ),
    (
        "checkpoint_format",
        {"quant.scheme": "bf16", "quant.shared_scheme": "mxfp4", "model.n_shared_experts": 1},
        "quant.shared_scheme",
    ),
    ("arch_needs_cuda", {"target.arch": "sm100"}, "target.arch"),
    # DeepSeek-V3 experts 16 times wider: 367 GiB of bf16 weights, over the H200's 139.8 GiB
    (
        "layer_fits_device",
        {
            **CUDA,
            "model.hidden_size": 7168 * 16,
            "model.n_routed_experts": 256,
            "model.moe_intermediate_size": 2048,
        },
        "model",
    ),
    ("layer_fits_device", {"target.max_num_tokens": 2**31 - 1}, "target.max_num_tokens"),
    ("gpu_needs_cuda", {"target.gpu": "nvidia-h100"}, "target.gpu"),
]


def _case_id(case: tuple[str, dict[str, Any], str]) -> str:
    return f"{case[0]}-{case[2]}"


@pytest.mark.parametrize(("rule", "changes", "path"), CASES, ids=[_case_id(c) for c in CASES])
def test_rule_rejects(rule: str, changes: dict[str, Any], path: str):
    found = problems_of(changes)
    assert any(p.rule == rule and p.path == path for p in found), [
        (p.rule, p.path, p.message) for p in found
    ]
    for each in found:
        assert each.message and each.hint, each


def test_every_rule_has_a_test():
    tested = {case[0] for case in CASES}
    assert {rule.name for rule in RULES} <= tested, "a rule has no test in CASES"
    assert tested <= {rule.name for rule in RULES}, "CASES names a rule that does not exist"


def test_every_rule_is_named_and_documented():
    names = [rule.name for rule in RULES]
    assert len(names) == len(set(names))
    for rule in RULES:
        assert re.fullmatch(r"[a-z][a-z0-9_]*", rule.name)
        assert len(rule.doc) > 20, f"rule {rule.name} has no docstring"


def test_base_passes_every_rule():
    assert check_raw(spec_data({})).spec.name == "rules"


@pytest.mark.parametrize(
    "changes",
    [
        {"quant.scheme": "fp8_block"},
        {"quant.scheme": "mxfp8", "quant.weight_block": [1, 32], "quant.scale_dtype": "ue8m0"},
        {"quant.scheme": "fp8_per_tensor", "quant.activation_scheme": "static"},
        {"router.scoring_func": "sqrtsoftplus", "router.topk_method": "noaux_tc"},
        {"parallel.tp_size": 2, "quant.scheme": "bf16"},
        {"parallel.dispatch": "all2all", "parallel.ep_size": 16},
        {
            **LOW_LATENCY,
            "experts.layout": "masked",
            "quant.scheme": "fp8_block",
            "model.hidden_size": 2048,
        },
        {**CUDA, "experts.gemm_backend": "deep_gemm", "quant.scheme": "fp8_block"},
        {
            **CUDA,
            "target.arch": "sm100",
            "experts.gemm_backend": "deep_gemm",
            "quant.scheme": "mxfp8",
        },
        {"experts.shared_experts": "fused", "quant.scheme": "fp8_block"},
        {  # a shared width of 2 x 64 fills one fp8 block
            "quant.scheme": "mxfp8",
            "quant.shared_scheme": "fp8_block",
            "model.moe_intermediate_size": 64,
            "model.n_shared_experts": 2,
        },
        {"activation": {"kind": "oai_swiglu"}},
        {"router.topk_method": "hash", "model.vocab_size": 64, "router.scoring_func": "softmax"},
        {  # the selection in torch beside Triton GEMMs, fused shared experts appended
            **CUDA,
            "router.topk_method": "hash",
            "model.vocab_size": 64,
            "experts.gemm_backend": "triton",
            "experts.shared_experts": "fused",
        },
    ],
    ids=lambda changes: ",".join(f"{k}={v}" for k, v in changes.items())[:60],
)
def test_rules_accept_near_misses(changes):
    """Specs next to a rule's edge that are right: no rule may reject them."""
    check_raw(spec_data(changes))


def test_static_bf16_reports_one_problem():
    """bf16 with static activations is one mistake, not also a checkpoint one (checkpoint is
    normalized to bf16 for scheme bf16, and the user never wrote it)."""
    found = problems_of({"quant.activation_scheme": "static"})
    assert [(p.rule, p.path) for p in found] == [
        ("static_needs_per_tensor", "quant.activation_scheme")
    ]


def test_every_rule_runs_even_after_one_fails():
    found = problems_of(
        {
            "target.arch": "sm90",
            "parallel.max_tokens_per_rank": 8,
            "quant.scale_dtype": "fp32",
            "model.num_experts_per_tok": 17,
        }
    )
    assert {p.rule for p in found} == {
        "arch_needs_cuda",
        "token_bound_applies",
        "scale_dtype_applies",
        "topk_within_experts",
    }


def test_support_matrix_names_only_rules():
    names = {rule.name for rule in RULES} | {"renderer"}
    matrix = support_matrix()
    for row in matrix["kernels"] + matrix["dispatch"]:
        for rejected in row["targets"].values():
            assert set(rejected) <= names
    assert rejecting_rules(spec_data({})) == []


# --- the records --------------------------------------------------------------------------

TEXT = """name = "rules"
[model]
hidden_size = 256
moe_intermediate_size = 128
n_routed_experts = 16
num_experts_per_tok = 4
[quant]
scheme = "fp8_block"
weight_block = [128, 128, 1]
"""


def test_problem_carries_path_line_value_message_hint_rule():
    with pytest.raises(MoecError) as caught:
        parse_spec(TEXT, "s.toml")
    error = caught.value
    assert error.source == "s.toml"
    assert error.kind == "spec"
    (found,) = error.problems
    assert found.path == "quant.weight_block"
    assert found.line == 9
    assert found.value == [128, 128, 1] and found.has_value
    assert found.rule == "block_shape"
    assert "two block dims" in found.message
    assert found.hint == "[block_n, block_k], e.g. [128, 128]"
    assert str(error) == error.report() == found.format("s.toml")
    assert error.report() == (
        "s.toml:9: quant.weight_block = [128, 128, 1]: block quantization needs two block dims, "
        "got 3 ([block_n, block_k], e.g. [128, 128])"
    )


def test_unhashable_values_do_not_break_reporting():
    """Problems with list or table values are deduplicated without hashing the value."""
    text = TEXT.replace('name = "rules"\n', 'name = "rules"\nquantt = { a = [1] }\n')
    with pytest.raises(MoecError) as caught:
        parse_spec(text, "s.toml")
    assert caught.value.problems[0].path == "quantt"
    twice = [problem("a", "m", value=[1]), problem("a", "m", value=[1])]
    assert len(dict.fromkeys(twice)) == 1


@pytest.mark.parametrize(
    ("found", "text"),
    [
        (Problem("a.b", "is bad", "use c", 3, True, 7), "f.toml:7: a.b = 3: is bad (use c)"),
        (Problem("a.b", "is required", "set it"), "f.toml: a.b: is required (set it)"),
        (Problem("a", "m", value=None, has_value=True), "f.toml: a = None: m"),
        (Problem("a", "m", value=True, has_value=True), "f.toml: a = true: m"),
        (
            Problem("a", "m", value="x", has_value=True, origin="--set"),
            'f.toml (--set): a = "x": m',
        ),
        (
            Problem("", "TOML syntax: column 3: bad", "see", line=2),
            "f.toml:2: TOML syntax: column 3: bad (see)",
        ),
        (Problem("a", "m", value={"k": [1, 2]}, has_value=True), "f.toml: a = {k = [1, 2]}: m"),
    ],
)
def test_problem_format(found: Problem, text: str):
    assert found.format("f.toml") == text


def test_problem_without_source():
    assert Problem("a", "m").format() == "<spec>: a: m"


def test_key_lines_know_tables_dotted_and_inline_keys():
    text = (
        'name = "x"  # comment\n'
        "model = { hidden_size = 1, n_routed_experts = 2 }\n"
        "router.n_group = 3\n"
        "[quant]\n"
        'scheme = "bf16"\n'
        "[[experts]]\n"
        '"layout" = "masked"\n'
    )
    lines = key_lines(text)
    assert lines["name"] == 1
    assert lines["model"] == 1 + 1
    assert lines["model.n_routed_experts"] == 2
    assert lines["router.n_group"] == 3
    assert lines["quant"] == 4
    assert lines["quant.scheme"] == 5
    assert lines["experts"] == lines["experts.0"] == 6
    assert lines["experts.0.layout"] == 7  # the first table of the array
    assert line_of(lines, "quant.weight_block.0") == 4
    assert line_of(lines, "target.arch") is None


def test_preset_values_point_at_the_preset():
    text = 'name = "p"\n[model]\npreset = "deepseek-v3"\nn_routed_experts = 4\n'
    with pytest.raises(MoecError) as caught:
        parse_spec(text, "p.toml")
    preset_made = [p for p in caught.value.problems if p.origin == "from preset deepseek-v3"]
    assert preset_made and all(p.line == 3 for p in preset_made)
    own = [p for p in caught.value.problems if not p.origin]
    assert all(p.path != "model.num_experts_per_tok" for p in own)


def test_set_values_are_marked_and_have_no_line():
    with pytest.raises(MoecError) as caught:
        parse_spec(TEXT, "s.toml", ["quant.weight_block=[128, 128, 0]"])
    (found,) = caught.value.problems
    assert found.path == "quant.weight_block.2"
    assert found.origin == "--set" and found.line is None


def test_explicit_keys_win_over_the_preset():
    text = 'name = "p"\n[model]\npreset = "deepseek-v3"\nn_routed_experts = 64\n'
    spec = parse_spec(text).spec
    assert spec.model.n_routed_experts == 64
    assert spec.model.hidden_size == 7168
    assert spec.router.n_group == 8 and spec.quant.scheme == "fp8_block"


def test_deep_gemm_sm100_defaults_to_ue8m0_scales():
    """The default scale dtype follows the backend: fp8_block on DeepGEMM sm100 is UE8M0, so a
    spec that leaves scale_dtype out is not rejected for a value the user never wrote."""
    changes = {
        **CUDA,
        "target.arch": "sm100",
        "experts.gemm_backend": "deep_gemm",
        "quant.scheme": "fp8_block",
    }
    assert check_raw(spec_data(changes)).spec.quant.scale_dtype == "ue8m0"
    assert check_raw(spec_data({**changes, "target.arch": "sm90"})).spec.quant.scale_dtype == "fp32"
    triton = {**changes, "experts.gemm_backend": "triton"}
    assert check_raw(spec_data(triton)).spec.quant.scale_dtype == "fp32"


def test_unknown_activation_key_lists_the_kinds_keys():
    (found,) = problems_of({"activation": {"kind": "silu_clamped", "swiglu_limit": 1.0, "x": 1}})
    assert found.path == "activation.x"
    assert found.hint == "known keys: kind, swiglu_limit"
