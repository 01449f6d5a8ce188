"""The planner's passes, each on its own: resolve `auto` (gemm backend, layout, dispatch),
insert converters, fuse, CUDA-graph safety; and the decisions each example gets.

Expected values are computed here by hand (seed 000's masked-layout estimate, the flip point of
the layout choice), not by calling the code under test.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from moec.plan import Environment, GemmSplit, make_plan
from moec.plan.convert import conversion_steps
from moec.plan.layer import layer_of
from moec.plan.layouts import masked_peak_bytes
from moec.plan.resolve import MASKED_BUDGET_FRACTION
from moec.plan.types import DType, Layout, ScaleType, TensorType
from moec.spec import load_spec

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
PLAIN = Environment(frozenset({"triton"}))
# deep_gemm installed, and planned as if its code were rendered (the planner's deep_gemm logic)
FULL = Environment(frozenset({"triton", "deep_gemm", "deep_ep"}))
NOTHING = Environment(frozenset())
GIB = 2**30
H200_GIB = 139.8  # the H200 row of moec's device table (moec/plan/devices.py)


def spec_of(name: str, *overrides: str):
    return load_spec(EXAMPLES / name, list(overrides)).spec


def plan_of(name: str, *overrides: str, env: Environment = PLAIN):
    return make_plan(spec_of(name, *overrides), env)


def choices(plan) -> dict[str, str]:
    return {d.what: d.choice for d in plan.decisions}


# --- resolve: gemm backend ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "overrides", "env", "choice", "reason"),
    [
        ("tiny-cpu.toml", ['experts.gemm_backend="auto"'], FULL, "torch", "CPU target"),
        ("deepseek-v3-fp8.toml", [], PLAIN, "triton", "deep_gemm is not installed"),
        # sm100 fp8_block: deep_gemm needs UE8M0 scales; the default (fp32) keeps it out
        ("deepseek-v3-fp8.toml", ['target.arch="sm100"'], FULL, "triton", "does not run"),
        # ... and with UE8M0 scales moec does not drive DeepGEMM's sm100 fp8 kernels
        (
            "deepseek-v3-fp8.toml",
            ['target.arch="sm100"', 'quant.scale_dtype="ue8m0"'],
            FULL,
            "triton",
            "moec does not drive deep_gemm for fp8_block on sm100",
        ),
        # deep_gemm has no fused kernel for SiTU
        (
            "deepseek-v3-fp8.toml",
            ['activation.kind="situ"', "activation.beta=1.0", "activation.linear_beta=1.0"],
            FULL,
            "triton",
            "does not run this combination",
        ),
        ("deepseek-v4-style.toml", [], FULL, "triton", "does not run this combination"),
        ("mxfp8-sm100.toml", [], FULL, "triton", "moec does not drive deep_gemm for mxfp8"),
        # no fp8 tensor cores on sm80: the torch reference
        ("deepseek-v3-fp8.toml", ['target.arch="sm80"'], FULL, "torch", "no fp8 tensor cores"),
        ("deepseek-v3-fp8.toml", ['target.arch="sm89"'], FULL, "triton", "does not run"),
        ("deepseek-v3-fp8.toml", ['experts.gemm_backend="torch"'], FULL, "torch", "set in"),
        ("tiny-cpu-triton.toml", [], PLAIN, "triton", "set in the spec"),
    ],
)
def test_resolve_gemm_backend(name, overrides, env, choice, reason):
    plan = plan_of(name, *overrides, env=env)
    decision = plan.decision("gemm_backend")
    assert decision.choice == choice
    assert reason in decision.reason
    assert plan.backends.gemm == choice
    gemms = [s for s in plan.order() if s.kind == "gemm"]
    assert [s.backend for s in gemms] == [choice, choice]


@pytest.mark.parametrize(
    ("name", "up_to"), [("deepseek-v3-fp8.toml", 1024), ("deepseek-v3-bf16.toml", 1024)]
)
def test_auto_splits_the_gemms_at_the_measured_crossover(name, up_to):
    """deep_gemm installed, and the H200 times of the layer shipped: Triton up to the largest
    T where it was faster, DeepGEMM above, with the times in the reason; the plan above the
    split runs DeepGEMM GEMMs on the same weights, and Triton's tiles stop at the split."""
    plan = plan_of(name, env=FULL)
    decision = plan.decision("gemm_backend")
    assert decision.choice == f"triton up to T={up_to}, deep_gemm above"
    assert "per token bucket" in decision.reason and f"T={up_to}: " in decision.reason
    assert plan.backends.gemm == "triton"
    assert plan.backends.split == GemmSplit(up_to, "deep_gemm")
    assert [s.backend for s in plan.order() if s.kind == "gemm"] == ["triton", "triton"]
    above = plan.above
    assert above.backends.gemm == "deep_gemm" and above.backends.split is None
    assert [s.backend for s in above.order() if s.kind == "gemm"] == ["deep_gemm", "deep_gemm"]
    assert plan.at(up_to) is plan and plan.at(up_to + 1) is above
    limits = [b.max_tokens for b in plan.tiles.buckets]
    assert limits[-1] is None and all(t < up_to for t in limits[:-1])
    assert plan.requires == ("deep_gemm", "triton")


def test_auto_takes_one_backend_where_the_times_say_so(tmp_path, monkeypatch):
    """Times where DeepGEMM is faster at every T (or Triton is) give one backend, no split."""
    key = "backends/fp8_block/H7168/I2048/E256/K8"
    for faster, expected in (("deep_gemm", "deep_gemm"), ("triton", "triton")):
        slower = {"deep_gemm": "triton", "triton": "deep_gemm"}[faster]
        ms = {faster: {"1": 1.0, "4096": 2.0}, slower: {"1": 1.5, "4096": 3.0}}
        (tmp_path / "nvidia-h200.json").write_text(json.dumps({key: {"source": "t", "ms": ms}}))
        plan = plan_of("deepseek-v3-fp8.toml", env=Environment(FULL.importable, tmp_path))
        assert plan.backends.gemm == expected and plan.backends.split is None
        assert plan.above is None
        assert "every T measured" in plan.decision("gemm_backend").reason


def test_named_backend_that_is_not_installed_is_reported_missing():
    plan = plan_of("deepseek-v3-fp8.toml", 'experts.gemm_backend="deep_gemm"', env=PLAIN)
    assert plan.requires == ("deep_gemm", "triton")
    assert plan.missing == ("deep_gemm",)
    plan = plan_of("deepseek-v3-fp8.toml", 'experts.gemm_backend="deep_gemm"', env=FULL)
    assert plan.missing == ()


def test_requires_lists_the_optional_modules_the_package_imports():
    assert plan_of("deepseek-v3-fp8.toml", env=FULL).requires == ("deep_gemm", "triton")
    assert plan_of("deepseek-v3-deepep-ll-ep8.toml", env=FULL).requires == (
        "deep_ep",
        "deep_gemm",
        "triton",
    )
    assert plan_of("deepseek-v3-fp8.toml", env=PLAIN).requires == ("triton",)
    assert plan_of("tiny-cpu.toml", env=FULL).requires == ()


def test_environment_detect_only_names_optional_backends():
    detected = Environment.detect()
    assert detected.importable <= {"deep_gemm", "deep_ep", "triton"}
    assert Environment(frozenset({"deep_gemm"})).has("deep_gemm")
    assert not Environment(frozenset()).has("deep_gemm")


def test_the_user_tables_are_the_environments(tmp_path, monkeypatch):
    """This machine's environment carries the user's tuning folder; a given environment reads
    only what it names, whatever the process's variables say."""
    monkeypatch.setenv("MOEC_TUNING_DIR", str(tmp_path))
    assert Environment.detect().tuning_dir == tmp_path
    (tmp_path / "nvidia-h200.json").write_text("not json")
    assert plan_of("deepseek-v3-fp8.toml", env=PLAIN).tiles is not None  # never read
    from moec.errors import MoecError

    with pytest.raises(MoecError, match="cannot be read"):
        plan_of("deepseek-v3-fp8.toml", env=Environment(PLAIN.importable, tmp_path))


def test_auto_never_picks_a_backend_that_is_not_importable():
    plan = plan_of("deepseek-v3-fp8.toml", env=NOTHING)
    assert plan.missing == ()
    assert plan.decision("gemm_backend").choice == "torch"


# --- resolve: layout ----------------------------------------------------------------------


def seed_masked_peak_bytes(
    tokens, experts, hidden, gateup, down_out, quantized, block_k=128, packed=False
):
    """Seed 000's `_estimate_masked_standard_layout_peak_bytes`, transcribed by hand:
    gateup = w13.shape[1] (2I), down_out = w2.shape[1] (H), bf16 outputs."""
    padded_m = (tokens // 256 + 1) * 256
    act = 1 if quantized else 2
    gateup_row = gateup * 2
    down_output_row = down_out * 2
    input_row = hidden * act
    down_input_row = gateup // 2 * act
    if quantized:
        item = 1 if packed else 4
        input_scale_row = math.ceil(hidden / block_k) * item
        down_scale_row = math.ceil(gateup // 2 / block_k) * item
    else:
        input_scale_row = down_scale_row = 0
    peak_row = max(
        input_row + input_scale_row + gateup_row,
        gateup_row + down_input_row + down_scale_row,
        down_input_row + down_scale_row + down_output_row,
    )
    return experts * padded_m * peak_row


def test_masked_peak_matches_seed_formula_by_hand_for_deepseek_v3_fp8():
    facts = layer_of(spec_of("deepseek-v3-fp8.toml"))
    # T = 4096: padded_m = 4352; rows: 7168 + 56*4 + 8192 = 15584, 8192 + 2048 + 16*4 = 10304,
    # 2048 + 64 + 14336 = 16448 -> 16448 bytes per row, 256 experts
    assert masked_peak_bytes(facts, 4096) == 256 * 4352 * 16448 == 18_324_914_176
    assert masked_peak_bytes(facts, 4096) == seed_masked_peak_bytes(
        4096, 256, 7168, 4096, 7168, quantized=True
    )


@pytest.mark.parametrize(
    ("name", "overrides", "seed_args"),
    [
        ("deepseek-v3-bf16.toml", [], (256, 7168, 4096, 7168, False)),
        ("deepseek-v2-lite.toml", [], (64, 2048, 2816, 2048, False)),
        ("kimi-k2.toml", [], (384, 7168, 4096, 7168, True)),
        # UE8M0 scales are one byte each (seed: use_mxfp8 or DEEPGEMM_SCALE_UE8M0)
        ("mxfp8-sm100.toml", [], (256, 7168, 4096, 7168, True, 32, True)),
        (
            "deepseek-v3-fp8.toml",
            ['target.arch="sm100"', 'quant.scale_dtype="ue8m0"'],
            (256, 7168, 4096, 7168, True, 128, True),
        ),
        # fused shared experts are extra local experts of the grouped GEMM
        ("deepseek-v3-fp8.toml", ['experts.shared_experts="fused"'], (257, 7168, 4096, 7168, True)),
    ],
)
@pytest.mark.parametrize("tokens", [1, 255, 256, 5000])
def test_masked_peak_matches_seed_formula(name, overrides, seed_args, tokens):
    facts = layer_of(spec_of(name, *overrides))
    experts, hidden, gateup, down_out, quantized, *rest = seed_args
    expected = seed_masked_peak_bytes(tokens, experts, hidden, gateup, down_out, quantized, *rest)
    assert masked_peak_bytes(facts, tokens) == expected


def test_masked_peak_with_expert_parallelism_covers_tokens_of_every_rank():
    """An expert of one rank can receive every token of all ep ranks (DeepEP low-latency's
    [E/ep, ep*T, H] buffers); seed 000 is given the received rows."""
    facts = layer_of(spec_of("deepseek-v3-ep2-all2all.toml"))
    assert facts.local_experts == 128 and facts.ep == 2
    assert masked_peak_bytes(facts, 1000) == seed_masked_peak_bytes(
        2000, 128, 7168, 4096, 7168, quantized=True
    )


def _layout_at(tokens: int, name="deepseek-v3-fp8.toml", *extra: str) -> str:
    return plan_of(name, f"target.max_num_tokens={tokens}", *extra).backends.layout


def _flip_point(row_bytes: int, experts: int, budget_bytes: float, ep: int = 1) -> int:
    """Smallest max_num_tokens for which masked exceeds the budget (by hand)."""
    padded_m_fits = int(budget_bytes // (experts * row_bytes)) // 256 * 256
    # masked while (ep*T // 256 + 1) * 256 <= padded_m_fits, i.e. ep*T < padded_m_fits
    return math.ceil(padded_m_fits / ep)


def test_layout_flips_from_masked_to_contiguous_for_deepseek_v3_fp8():
    budget = H200_GIB * MASKED_BUDGET_FRACTION * GIB  # 20% of the H200's memory
    flip = _flip_point(16448, 256, budget)
    assert flip == 6912  # 256 * 6912 * 16448 B = 27.1 GiB <= 27.96 GiB < 28.1 GiB at 7168
    assert _layout_at(flip - 1) == "masked"
    assert _layout_at(flip) == "contiguous"
    assert _layout_at(1) == "masked"
    assert _layout_at(16384) == "contiguous"


def test_layout_flip_follows_the_budget_key():
    budget = 10 * GIB
    flip = _flip_point(16448, 256, budget)
    assert flip == 2304
    extra = "experts.masked_memory_budget_gib=10"
    assert _layout_at(flip - 1, "deepseek-v3-fp8.toml", extra) == "masked"
    assert _layout_at(flip, "deepseek-v3-fp8.toml", extra) == "contiguous"
    decision = plan_of("deepseek-v3-fp8.toml", f"target.max_num_tokens={flip}", extra).decision(
        "layout"
    )
    assert "over the budget 10.0 GiB (experts.masked_memory_budget_gib)" in decision.reason


def test_layout_flip_with_expert_parallelism():
    budget = H200_GIB * MASKED_BUDGET_FRACTION * GIB
    flip = _flip_point(16448, 128, budget, ep=2)
    assert flip == 7040
    assert _layout_at(flip - 1, "deepseek-v3-ep2-all2all.toml") == "masked"
    assert _layout_at(flip, "deepseek-v3-ep2-all2all.toml") == "contiguous"


def test_layout_flips_once_as_max_num_tokens_grows():
    layouts = [_layout_at(t) for t in (1, 256, 1024, 4096, 6911, 6912, 8192, 16384, 65536)]
    assert layouts == ["masked"] * 5 + ["contiguous"] * 4


def test_layout_reason_states_the_estimate_and_the_budget():
    plan = plan_of("deepseek-v3-fp8.toml")
    need = 256 * ((16384 // 256 + 1) * 256) * 16448 / GIB
    reason = plan.decision("layout").reason
    assert f"masked needs {need:.1f} GiB at T=16384" in reason
    assert "over the budget 28.0 GiB (20% of the H200's 139.8 GiB)" in reason


@pytest.mark.parametrize(
    ("name", "overrides", "layout", "reason"),
    [
        ("deepseek-v3-deepep-ll-ep8.toml", [], "masked", "low-latency"),
        ("deepseek-v3-fp8.toml", ['experts.layout="masked"'], "masked", "set in the spec"),
        ("tiny-cpu.toml", ['experts.layout="contiguous"'], "contiguous", "set in the spec"),
        (
            "deepseek-v3-fp8.toml",
            ['parallel.dispatch="deepep_normal"', "parallel.ep_size=8", "target.max_num_tokens=1"],
            "contiguous",
            "DeepEP normal",
        ),
    ],
)
def test_layout_forced_or_set(name, overrides, layout, reason):
    plan = plan_of(name, *overrides)
    assert plan.backends.layout == layout
    assert reason in plan.decision("layout").reason
    assert plan.stage("dispatch").outputs["a"].layout is Layout(
        "masked-grouped" if layout == "masked" else "contiguous-grouped"
    )


def test_contiguous_row_padding_decision():
    assert (
        "block_m = 128"
        in choices(plan_of("deepseek-v3-fp8.toml", 'experts.gemm_backend="deep_gemm"', env=FULL))[
            "contiguous row padding"
        ]
    )
    plan = plan_of("deepseek-v3-fp8.toml", 'experts.gemm_backend="deep_gemm"', env=FULL)
    assert plan.stage("dispatch").row_padding == 128
    assert (
        "BLOCK_M per token bucket"
        in choices(plan_of("deepseek-v3-fp8.toml"))["contiguous row padding"]
    )
    assert "contiguous row padding" not in choices(plan_of("tiny-cpu.toml"))  # masked


# --- resolve: dispatch --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "choice", "dispatch_backend", "combine_backend"),
    [
        ("deepseek-v3-fp8.toml", "local (torch)", "triton", "triton"),
        ("tiny-cpu.toml", "local (torch)", "torch", "torch"),
        (
            "deepseek-v3-ep2-all2all.toml",
            "all2all (torch.distributed)",
            "torch.distributed",
            "torch.distributed",
        ),
        ("deepseek-v3-deepep-ll-ep8.toml", "deepep_low_latency (deep_ep)", "deep_ep", "deep_ep"),
    ],
)
def test_dispatch_decision(name, choice, dispatch_backend, combine_backend):
    plan = plan_of(name)
    assert plan.decision("dispatch").choice == choice
    assert plan.stage("dispatch").backend == dispatch_backend
    assert plan.stage("combine").backend == combine_backend


# --- convert ------------------------------------------------------------------------------


def converters(plan):
    return [s for s in plan.order() if s.kind == "convert"]


def test_deep_gemm_scales_on_sm90_written_by_the_triton_quantizers():
    """Contiguous: the permute and activation kernels write MN-major, TMA-aligned fp32 scales,
    so there is no converter; masked (3-D): a converter transposes and pads."""
    plan = plan_of(
        "deepseek-v3-fp8.toml",
        "experts.layout=contiguous",
        'experts.gemm_backend="deep_gemm"',
        env=FULL,
    )
    assert converters(plan) == []
    wanted = ScaleType("1x128", DType.float32, "MN", True, False)
    assert plan.stage("dispatch").outputs["a"].scale == wanted
    assert plan.stage("dispatch").mn_major_scales and plan.stage("activation").mn_major_scales
    assert plan.decision("scales of a").choice == "written MN-major, TMA-aligned"
    masked = plan_of(
        "deepseek-v3-fp8.toml",
        "experts.layout=masked",
        'experts.gemm_backend="deep_gemm"',
        env=FULL,
    )
    found = converters(masked)
    assert [s.name for s in found] == ["convert_a_for_gemm_gate_up", "convert_hq_for_gemm_down"]
    for stage in found:
        assert stage.backend == "torch"
        assert stage.steps == (
            "transpose scales to MN-major",
            "pad scale columns to 16-byte TMA alignment",
        )
        (out,) = stage.outputs.values()
        assert out.scale == wanted
    assert DType.ue8m0x4 not in _scale_dtypes(masked)


def _scale_dtypes(plan):
    return {t.scale.dtype for s in plan.order() for t in s.outputs.values() if t.scale is not None}


@pytest.mark.parametrize(
    "overrides",
    [
        ['target.arch="sm100"', 'quant.scale_dtype="ue8m0"', 'experts.gemm_backend="deep_gemm"'],
        ['target.arch="sm100"', 'quant.scheme="mxfp8"', 'experts.gemm_backend="deep_gemm"'],
    ],
)
def test_deep_gemm_fp8_on_sm100_is_refused_by_the_support_table(overrides):
    """moec drives DeepGEMM's Hopper fp8 kernels (verified on the H200); the sm100 ones (UE8M0
    packed scales, see test_conversion_steps) are planned by the rules but not rendered."""
    from moec.errors import MoecError

    with pytest.raises(MoecError, match="moec drives DeepGEMM") as error:
        plan_of("deepseek-v3-fp8.toml", *overrides, env=FULL)
    assert error.value.problems[0].path == "experts.gemm_backend"
    auto = plan_of("mxfp8-sm100.toml", env=FULL)
    assert auto.backends.gemm == "triton"  # auto does not pick what moec does not drive


def test_every_supported_pair_has_one_renderer_and_no_other_renders():
    """moec/plan/support.py says what runs where; codegen renders exactly those pairs."""
    from moec.codegen import registry
    from moec.plan.support import RUNS

    assert registry.pairs() == sorted(RUNS)


def test_a_renderer_for_a_pair_the_plan_does_not_run_is_refused():
    from moec.codegen.registry import register
    from moec.plan.stages import Place
    from moec.vocab import Backend

    with pytest.raises(ValueError, match=r"\(place, triton\), which moec/plan/support.py lacks"):
        register(Place, Backend.triton, "stages/torch/place.py.j2")(lambda plan, stage: None)


def test_deep_gemm_runs_what_auto_may_choose():
    """One owner of what moec drives on DeepGEMM: the refusal of a GEMM stage and auto's choice
    read the same function (fp8_block on sm90; bf16 on sm90 and sm100)."""
    from moec.plan.backends import deep_gemm_gemm

    runs = {
        (scheme, arch)
        for scheme in ("bf16", "fp8_per_tensor", "fp8_block", "mxfp8", "mxfp4")
        for arch in ("sm80", "sm89", "sm90", "sm100", "sm120")
        if deep_gemm_gemm(scheme, arch) is None
    }
    assert runs == {("fp8_block", "sm90"), ("bf16", "sm90"), ("bf16", "sm100")}
    assert plan_of("deepseek-v3-bf16.toml", 'target.arch="sm100"', env=FULL).backends.gemm == (
        "deep_gemm"
    )
    assert plan_of("deepseek-v3-bf16.toml", 'target.arch="sm120"', env=FULL).backends.gemm == (
        "triton"
    )
    from moec.errors import MoecError

    with pytest.raises(MoecError, match="on sm90 and sm100, not sm120"):
        plan_of("deepseek-v3-bf16.toml", 'target.arch="sm120"', "experts.gemm_backend=deep_gemm")


def test_the_plan_imports_no_codegen():
    """The plan is made from the spec and its environment alone: planning every example
    imports nothing of moec.codegen (the renderers and their templates)."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from moec.plan import Environment, make_plan\n"
        "from moec.spec import load_spec\n"
        "env = Environment(frozenset({'triton', 'deep_gemm', 'deep_ep'}))\n"
        "planned = 0\n"
        "for path in sorted(Path('examples').glob('*.toml')):\n"
        "    make_plan(load_spec(path).spec, env)\n"
        "    planned += 1\n"
        "print(planned, sorted(m for m in sys.modules if m.startswith('moec.codegen')))\n"
    )
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True
    )
    planned, imported = done.stdout.split(" ", 1)
    assert int(planned) >= 10 and imported.strip() == "[]"


@pytest.mark.parametrize(
    ("name", "env"),
    [
        ("deepseek-v3-fp8.toml", PLAIN),  # triton reads K-major fp32 scales as written
        ("tiny-cpu.toml", FULL),  # torch
        ("deepseek-v3-bf16.toml", FULL),  # deep_gemm, but nothing is scaled
        ("deepseek-v2-lite.toml", FULL),
        ("mxfp8-sm100.toml", PLAIN),
    ],
)
def test_no_converters_where_types_agree(name, env):
    plan = plan_of(name, env=env)
    assert converters(plan) == []
    assert not [d for d in plan.decisions if d.what.startswith("convert ")]


def test_converter_is_inserted_only_on_the_edge_that_disagrees():
    plan = plan_of(
        "deepseek-v3-fp8.toml",
        "experts.layout=masked",
        'experts.gemm_backend="deep_gemm"',
        env=FULL,
    )
    # routing still goes straight from dispatch to the GEMM
    assert plan.graph.has_edge("dispatch", "gemm_gate_up")
    tensors = [e.tensor for e in plan.graph.edges["dispatch", "gemm_gate_up"]["tensors"]]
    assert tensors == ["routing"]
    assert plan.graph.has_edge("dispatch", "convert_a_for_gemm_gate_up")
    assert not plan.graph.has_edge("activation", "gemm_down")
    # the converter is counted: it is a stage with a cost row
    from moec.plan import cost, device_for

    rows = cost(plan, device_for("cuda", "sm90"), 64).stages
    assert "convert_a_for_gemm_gate_up" in [r.stage for r in rows]


def test_no_backend_hides_a_scale_conversion():
    """A GEMM's declared input type is what reaches it; its producer is a converter exactly
    when the producer's own output differs."""
    for env in (PLAIN, FULL):
        for path in sorted(EXAMPLES.glob("*.toml")):
            plan = make_plan(load_spec(path).spec, env)
            for stage in plan.order():
                if stage.kind != "gemm":
                    continue
                ((producer, edge),) = [(p, e) for p, e in plan.inputs(stage.name) if e.input == "a"]
                assert edge.type == stage.accepts["a"]
                if plan.stage(producer).kind == "convert":
                    ((_, original),) = plan.inputs(producer)
                    assert original.type != stage.accepts["a"]


def test_conversion_steps():
    have = TensorType(DType.e4m3, ("M", "H"), Layout.contiguous, ScaleType("1x128", DType.float32))
    want = have.with_scale(ScaleType("1x128", DType.ue8m0x4, "MN", True, True))
    assert conversion_steps(have, want) == [
        "round scales up to powers of two",
        "transpose scales to MN-major",
        "pad scale columns to 16-byte TMA alignment",
        "pack UE8M0 exponents four per int32",
    ]
    with pytest.raises(ValueError, match="planner bug"):
        conversion_steps(have, TensorType(DType.bfloat16, ("M", "H"), Layout.contiguous))
    with pytest.raises(ValueError, match="planner bug"):
        conversion_steps(have, have.with_scale(ScaleType("1x32", DType.float32)))


# --- fuse ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "fused"),
    [
        ([], True),  # fp8_block
        (['quant.scheme="fp8_per_tensor"'], True),
        (['quant.scheme="mxfp8"'], True),
        (['quant.scheme="mxfp4"', "target.max_num_tokens=64"], True),
        (['quant.scheme="bf16"'], False),
    ],
)
@pytest.mark.parametrize("env", [PLAIN, FULL], ids=["plain", "deep_gemm"])
def test_activation_and_quant_fused_for_fp8_schemes_only(overrides, fused, env):
    plan = plan_of("deepseek-v3-fp8.toml", *overrides, env=env)
    activation = plan.stage("activation")
    assert not plan.has("quantize_down")
    (out,) = activation.outputs.values()
    if fused:
        assert activation.fused == ("quantize",)
        assert out.dtype is DType.e4m3 and out.scale is not None
        assert plan.decision("fuse activation + quantize").choice == "yes"
    else:
        assert activation.fused == ()
        assert out.dtype is DType.bfloat16 and out.scale is None
        assert plan.decision("fuse activation + quantize") is None


@pytest.mark.parametrize(
    ("factor", "choice"), [(2.5, "x2.5 folded into the top-k weights"), (1.0, "none")]
)
def test_routed_scaling_folded_into_topk_weights(factor, choice):
    plan = plan_of("deepseek-v3-fp8.toml", f"router.routed_scaling_factor={factor}")
    assert plan.stage("select").routed_scaling_factor == factor
    assert not hasattr(plan.stage("combine"), "routed_scaling_factor")
    assert plan.decision("routed scaling").choice == choice


def test_finalize_fused_into_combine_with_shared_add():
    plan = plan_of("deepseek-v3-fp8.toml", "experts.shared_experts=separate")
    assert not plan.has("finalize")
    combine = plan.stage("combine")
    assert combine.fused == ("finalize",)
    assert combine.add_shared is True
    assert ("shared_expert", "shared") in [(p, e.tensor) for p, e in plan.inputs("combine")]
    assert list(combine.outputs) == ["out"]
    assert [p for p, _ in plan.inputs("output")] == ["combine"]
    assert plan.decision("fuse finalize into combine").choice == "yes"


def test_finalize_stays_a_stage_for_tensor_parallel_all_reduce():
    plan = plan_of("deepseek-v3-fp8.toml", "parallel.tp_size=2")
    finalize = plan.stage("finalize")
    assert finalize.backend == "torch.distributed"
    assert finalize.all_reduce is True
    assert finalize.add_shared is False
    assert plan.stage("combine").add_shared is True
    assert [p for p, _ in plan.inputs("finalize")] == ["combine"]
    assert "shared_expert" in [p for p, _ in plan.inputs("combine")]
    assert plan.decision("fuse finalize into combine").choice == "partly"
    assert plan.layer.intermediate == 1024


def test_fused_shared_experts_have_no_stage_and_keep_weight_one():
    plan = plan_of("deepseek-v3-fp8.toml", 'experts.shared_experts="fused"')
    assert not plan.has("shared_expert")
    assert plan.stage("select").fused_shared == 1
    assert plan.stage("combine").add_shared is False
    assert "fused shared experts keep weight 1" in plan.decision("routed scaling").reason


@pytest.mark.parametrize(
    ("name", "overrides", "env", "fused"),
    [
        ("deepseek-v3-fp8.toml", [], PLAIN, True),  # triton, local
        ("tiny-cpu-triton.toml", [], PLAIN, True),
        ("deepseek-v3-fp8.toml", [], FULL, True),  # deep_gemm: the Triton permute + quantize
        ("tiny-cpu.toml", [], PLAIN, False),  # torch
        ("deepseek-v3-ep2-all2all.toml", [], PLAIN, False),  # exchange between ranks
        ("deepseek-v3-bf16.toml", [], PLAIN, False),  # nothing to quantize
    ],
)
def test_quantize_fused_into_dispatch_for_triton_local(name, overrides, env, fused):
    plan = plan_of(name, *overrides, env=env)
    quantized = plan.layer.routed.quantized
    assert plan.has("quantize") == (quantized and not fused)
    assert (plan.stage("dispatch").fused == ("quantize",)) == fused
    assert (plan.decision("fuse quantize + dispatch") is not None) == fused


@pytest.mark.parametrize(
    ("name", "overrides", "env", "gather"),
    [
        ("deepseek-v3-fp8.toml", [], PLAIN, "yes"),  # Triton GEMMs, no TMA tiles
        ("tiny-cpu-triton.toml", ["experts.layout=contiguous"], PLAIN, "yes"),
        (
            "tiny-cpu-triton.toml",
            ["quant.scheme=bf16"] + ["experts.layout=contiguous"],
            PLAIN,
            "yes",
        ),
        ("deepseek-v3-bf16.toml", ["experts.layout=contiguous"], PLAIN, "no"),  # TMA tiles
        # ... only above 1024 tokens, which a layer of at most 1024 never reaches
        (
            "deepseek-v3-bf16.toml",
            ["experts.layout=contiguous", "target.max_num_tokens=1024"],
            PLAIN,
            "yes",
        ),  # fmt: skip
        ("tiny-cpu-triton.toml", [], PLAIN, None),  # masked: rows per expert, no gather
        ("deepseek-v3-fp8.toml", ["experts.gemm_backend=deep_gemm"], FULL, None),
        ("deepseek-v3-ep2-all2all.toml", [], PLAIN, None),  # rows exchanged between ranks
        ("tiny-cpu.toml", ["experts.layout=contiguous"], PLAIN, None),  # torch
    ],
)
def test_copy_free_dispatch(name, overrides, env, gather):
    """A local Triton dispatch before a Triton gate/up GEMM without TMA tiles hands it the
    tokens' rows [T, H] (quantized once each), which the GEMM gathers by token_of_row."""
    plan = plan_of(name, *overrides, env=env)
    decision = plan.decision("copy-free dispatch")
    assert (decision.choice.split(":")[0] if decision else None) == gather
    dispatch, gemm = plan.stage("dispatch"), plan.stage("gemm_gate_up")
    assert dispatch.gather == gemm.gather == (gather == "yes")
    (edge,) = [e for p, e in plan.inputs("gemm_gate_up") if e.input == "a"]
    rows = ("T", "H") if gather == "yes" else ("M", "H")
    if dispatch.layout == "masked":
        rows = ("E", "max_m", "H")
    assert edge.type.shape == dispatch.outputs["a"].shape == rows
    assert edge.type == gemm.accepts["a"] or gather != "yes"
    if gather == "yes":  # the decisions about the dispatch speak of no row copy
        for what in ("dispatch at decode", "fuse quantize + dispatch"):
            if plan.decision(what):
                assert "copy" not in plan.decision(what).reason
    ordered = plan.decision("dispatch row copy under PDL")
    if gather == "yes" and ordered and not dispatch.quantize:  # bf16: nothing after the route
        assert ordered.choice == "no pass to order" and dispatch.copy_pdl


# --- CUDA graph safety --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "env", "safe", "syncing"),
    [
        ("deepseek-v3-fp8.toml", PLAIN, "yes", []),
        ("deepseek-v3-fp8.toml", FULL, "yes", []),
        ("deepseek-v3-deepep-ll-ep8.toml", FULL, "yes", []),
        ("tiny-cpu.toml", PLAIN, "no", ["gemm_gate_up", "gemm_down"]),
        ("deepseek-v3-ep2-all2all.toml", PLAIN, "no", ["dispatch", "combine"]),
    ],
)
def test_cuda_graph_safety(name, env, safe, syncing):
    plan = plan_of(name, env=env)
    decision = plan.decision("CUDA graph")
    assert decision.choice == safe
    found = [s.name for s in plan.order() if s.syncs_host or not s.graph_safe]
    assert found == syncing
    for stage in syncing:
        assert stage in decision.reason


# --- the decisions of every example -------------------------------------------------------

COMMON = {
    "fuse finalize into combine": "yes",
}
TOP_K = {"triton": "Triton", "torch": "torch", "deep_gemm": "Triton"}
"""Top-k runs in Triton beside Triton or DeepGEMM GEMMs, in torch beside torch."""


def router_choice(plan) -> str:
    """The three-part bf16 router beside Triton kernels on a bf16 layer, else fp32 in torch."""
    beside_triton = plan.backends.gemm != "torch" and plan.layer.dtype.value == "bfloat16"
    return "bf16 x 3 parts in Triton" if beside_triton else "fp32 GEMM in torch"


EXPECTED = {
    # example: (environment, decisions, decisions that must be absent)
    "deepseek-v2-lite": (
        PLAIN,
        {
            "gemm_backend": "triton",
            "layout": "masked",
            "dispatch": "local (torch)",
            "routed scaling": "none",
            "CUDA graph": "yes",
        },
        ["fuse activation + quantize", "fuse quantize + dispatch", "contiguous row padding"],
    ),
    "deepseek-v3-bf16": (
        FULL,
        {
            "gemm_backend": "triton up to T=1024, deep_gemm above",
            "layout": "contiguous",
            "contiguous row padding": "block_m = the GEMM's BLOCK_M per token bucket",
            "routed scaling": "x2.5 folded into the top-k weights",
            "CUDA graph": "yes",
        },
        ["fuse activation + quantize", "convert a for gemm_gate_up"],
    ),
    "deepseek-v3-deepep-ll-ep8": (
        FULL,
        {
            "gemm_backend": "deep_gemm",
            "layout": "masked",
            "dispatch": "deepep_low_latency (deep_ep)",
            "fuse activation + quantize": "yes",
            "fuse quantize + dispatch": "yes (DeepEP)",
            "DeepEP buffer": "NVLink 0.0 MiB, RDMA 1820.0 MiB, low-latency, 128 tokens per rank, "
            "32 QPs per rank",
            "convert hq for gemm_down": "transpose scales to MN-major; "
            "pad scale columns to 16-byte TMA alignment",
            "CUDA graph": "yes",
        },
        ["convert a for gemm_gate_up"],
    ),
    "deepseek-v3-ep2-all2all": (
        PLAIN,
        {
            "gemm_backend": "triton",
            "layout": "masked",
            "dispatch": "all2all (torch.distributed)",
            "fuse activation + quantize": "yes",
            "CUDA graph": "no",
        },
        ["fuse quantize + dispatch"],
    ),
    "deepseek-v3-fp8": (
        PLAIN,
        {
            "gemm_backend": "triton",
            "layout": "contiguous",
            "dispatch": "local (torch)",
            "fuse activation + quantize": "yes",
            "fuse quantize + dispatch": "yes",
            "routed scaling": "x2.5 folded into the top-k weights",
            "CUDA graph": "yes",
        },
        ["convert a for gemm_gate_up"],
    ),
    "deepseek-v4-flash": (
        FULL,
        {
            "gemm_backend": "deep_gemm",
            "layout": "masked",
            "fuse router + select": "one launch at 1 token",
            "routed scaling": "x1.5 folded into the top-k weights",
            "CUDA graph": "yes",
        },
        [],
    ),
    "deepseek-v4-flash-hash": (
        FULL,
        {
            "gemm_backend": "deep_gemm",
            "top-k": "hash table, Triton",
            "fuse router + select": "no",
            "routed scaling": "x1.5 folded into the top-k weights",
            "CUDA graph": "yes",
        },
        [],
    ),
    "deepseek-v4-style": (
        FULL,
        {
            "gemm_backend": "triton",
            "layout": "contiguous",
            "fuse activation + quantize": "yes",
            "fuse quantize + dispatch": "yes",
            "routed scaling": "x1.5 folded into the top-k weights",
            "CUDA graph": "yes",
        },
        ["convert a for gemm_gate_up"],
    ),
    "glm-4.5": (
        PLAIN,
        {
            "gemm_backend": "triton",
            "layout": "masked",
            "shared experts": "fused as 1 extra expert(s)",
            "routed scaling": "x2.5 folded into the top-k weights",
            "CUDA graph": "yes",
        },
        [],
    ),
    "kimi-k2": (
        FULL,
        {
            "gemm_backend": "deep_gemm",
            "layout": "contiguous",
            "routed scaling": "x2.827 folded into the top-k weights",
            "fuse activation + quantize": "yes",
            "fuse quantize + dispatch": "yes",
            "scales of a": "written MN-major, TMA-aligned",
            "scales of hq": "written MN-major, TMA-aligned",
        },
        ["convert a for gemm_gate_up"],
    ),
    "mxfp8-sm100": (
        FULL,
        {
            "gemm_backend": "triton",
            "layout": "masked",
            "fuse activation + quantize": "yes",
            "fuse quantize + dispatch": "yes",
            "CUDA graph": "yes",
        },
        ["convert a for gemm_gate_up"],
    ),
    "tiny-cpu-bf16": (
        FULL,
        {
            "gemm_backend": "torch",
            "layout": "masked",
            "routed scaling": "none",
            "CUDA graph": "no",
        },
        ["fuse activation + quantize"],
    ),
    "tiny-cpu-triton": (
        PLAIN,
        {
            "gemm_backend": "triton",
            "layout": "masked",
            "fuse activation + quantize": "yes",
            "fuse quantize + dispatch": "yes",
            "CUDA graph": "yes",
        },
        [],
    ),
    "tiny-cpu": (
        FULL,
        {
            "gemm_backend": "torch",
            "layout": "masked",
            "fuse activation + quantize": "yes",
            "routed scaling": "x2.5 folded into the top-k weights",
            "CUDA graph": "no",
        },
        ["fuse quantize + dispatch"],
    ),
}


def test_every_example_has_expected_decisions():
    assert sorted(EXPECTED) == sorted(p.stem for p in EXAMPLES.glob("*.toml"))


@pytest.mark.parametrize("example", sorted(EXPECTED))
def test_decisions_of_examples(example):
    env, expected, absent = EXPECTED[example]
    plan = plan_of(f"{example}.toml", env=env)
    found = choices(plan)
    router = {"top-k": TOP_K[plan.backends.gemm], "router": router_choice(plan)}
    for what, choice in {**COMMON, **router, **expected}.items():
        assert found.get(what) == choice, what
    for what in absent:
        assert what not in found
    # every decision has a reason, and is made once
    whats = [d.what for d in plan.decisions]
    assert len(whats) == len(set(whats))
    assert all(d.reason for d in plan.decisions)
    # resolve's decisions come first, the graph-safety verdict last
    assert whats[:3] == ["gemm_backend", "layout", "dispatch"]
    assert whats[-1] == "CUDA graph"


@pytest.mark.parametrize(
    ("name", "layout", "call"),
    [
        ("deepseek-v3-fp8.toml", "contiguous", "m_grouped_fp8_gemm_nt_contiguous"),
        ("deepseek-v3-fp8.toml", "masked", "m_grouped_fp8_gemm_nt_masked"),
        ("deepseek-v3-bf16.toml", "masked", "m_grouped_bf16_gemm_nt_masked"),
    ],
)
def test_the_plan_records_deep_gemms_functions_and_version(name, layout, call):
    plan = plan_of(name, 'experts.gemm_backend="deep_gemm"', f"experts.layout={layout}", env=FULL)
    decision = plan.decision("deep_gemm calls")
    assert decision.choice == call
    assert "DeepGEMM 2.6.1" in decision.reason and "installed here: " in decision.reason
    assert plan_of(name, env=PLAIN).decision("deep_gemm calls") is None
