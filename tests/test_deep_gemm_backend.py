"""The deep_gemm backend's rendering and glue, on the CPU with a stand-in DeepGEMM
(tests/stand_ins/deep_gemm: DeepGEMM's calls in plain torch) and the Triton stages around it
interpreted: the same layer as the torch backend on the same weights, within 2**-7 norm-wise
(the bound tests/test_triton_layer.py derives). The real DeepGEMM runs in tests/gpu."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from moec.plan import make_plan
from moec.spec.loader import load_spec

STAND_INS = Path(__file__).resolve().parent / "stand_ins"
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SPEC = """
name = "dg"
[model]
hidden_size = 256
moe_intermediate_size = 256
n_routed_experts = 4
num_experts_per_tok = 2
n_shared_experts = 1
[router]
scoring_func = "sigmoid"
topk_method = "noaux_tc"
n_group = 2
topk_group = 1
norm_topk_prob = true
routed_scaling_factor = 2.5
[target]
{target}
max_num_tokens = 64
"""
CUDA = 'device = "cuda"\narch = "sm90"'
CPU = 'device = "cpu"'
SCHEMES = {"fp8_block": ["quant.scheme=fp8_block", "quant.checkpoint=bf16"], "bf16": []}


@pytest.fixture(scope="module")
def stand_in():
    sys.path.insert(0, str(STAND_INS))
    sys.modules.pop("deep_gemm", None)
    import deep_gemm

    yield deep_gemm
    sys.path.remove(str(STAND_INS))
    sys.modules.pop("deep_gemm", None)


@pytest.mark.parametrize("layout", ["contiguous", "masked"])
@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_deep_gemm_layer_equals_torch_backend(stand_in, load_layer, scheme, layout):
    overrides = [*SCHEMES[scheme], f"experts.layout={layout}"]
    package = load_layer(SPEC.format(target=CUDA), "experts.gemm_backend=deep_gemm", *overrides)
    reference = load_layer(SPEC.format(target=CPU), "experts.gemm_backend=torch", *overrides)
    gemms = [s for s in package.PLAN["stages"] if s["kind"] == "gemm"]
    assert [s["backend"] for s in gemms] == ["deep_gemm", "deep_gemm"]
    layer, expected_layer = (
        package.MoELayer(device="cpu").random_(0),
        reference.MoELayer().random_(0),
    )
    kind = "fp8" if scheme == "fp8_block" else "bf16"
    for tokens in (12, 20):  # contiguous: m_indices below 16 tokens, end rows (psum) from 16
        x = torch.randn(tokens, 256, generator=torch.Generator().manual_seed(3)).bfloat16()
        stand_in.CALLS.clear()
        out = layer(x).double()
        expected = expected_layer(x).double()
        told = "(psum)" if layout == "contiguous" and tokens >= 16 else ""
        assert stand_in.CALLS == [f"m_grouped_{kind}_gemm_nt_{layout}{told}"] * 2
        assert ((out - expected).norm() / expected.norm()).item() <= 2**-7


def test_contiguous_layout_is_told_by_expert_ends(stand_in, load_layer):
    """DeepGEMM's contiguous GEMMs take the layout as each expert's end row (routing.ends,
    [E] int32) from 16 tokens, as m_indices below (faster at T=1): a plan decision with its
    reason, and the rendered calls pass routing.ends with use_psum_layout (the stand-in asserts
    the [E] shape and each end within its rows). Past a split above 16 tokens: end rows only."""
    package = load_layer(
        SPEC.format(target=CUDA),
        "experts.gemm_backend=deep_gemm",
        "experts.layout=contiguous",
        *SCHEMES["fp8_block"],
    )
    decisions = {d["what"]: d for d in package.PLAN["decisions"]}
    decision = decisions["DeepGEMM grouped layout"]
    assert decision["choice"] == "m_indices below T=16, psum (each expert's end row) from it"
    assert "worst-case M" in decision["reason"] and "T=1" in decision["reason"]
    gemms = [s for s in package.PLAN["stages"] if s["kind"] == "gemm"]
    assert [s["choices"]["psum_from"] for s in gemms] == [16, 16]
    assert [s["choices"]["psum_branch"] for s in gemms] == [True, True]
    stages = (Path(package.__file__).parent / "stages.py").read_text()
    assert stages.count("deep_gemm_grouped.fp8_contiguous_psum(") == 2
    assert stages.count("if routing.row_of.shape[0] < 16:") == 2
    assert stages.count("deep_gemm_grouped.fp8_contiguous(") == 2
    # DeepGEMM only past auto's split (DeepSeek-V3 on the H200: T > 1024): the psum form alone
    spec = load_spec(
        str(EXAMPLES / "deepseek-v3-fp8.toml"),
        overrides=["experts.gemm_backend=auto", "experts.layout=contiguous"],
    ).spec
    deep = [
        s for s in make_plan(spec).at(4096).order() if s.kind == "gemm" and s.backend == "deep_gemm"
    ]
    assert [(s.psum_from, s.psum_branch) for s in deep] == [(1025, False), (1025, False)]
    masked = load_layer(
        SPEC.format(target=CUDA),
        "experts.gemm_backend=deep_gemm",
        "experts.layout=masked",
        *SCHEMES["fp8_block"],
    )
    assert "DeepGEMM grouped layout" not in {d["what"] for d in masked.PLAN["decisions"]}


def test_contiguous_fp8_scales_are_written_in_deep_gemms_layout(stand_in, load_layer):
    """No converter stage: the Triton quantizers write MN-major, TMA-aligned scales."""
    package = load_layer(
        SPEC.format(target=CUDA),
        "experts.gemm_backend=deep_gemm",
        "experts.layout=contiguous",
        *SCHEMES["fp8_block"],
    )
    kinds = [s["kind"] for s in package.PLAN["stages"]]
    assert "convert" not in kinds
    decisions = {d["what"]: d["choice"] for d in package.PLAN["decisions"]}
    assert decisions["scales of a"] == decisions["scales of hq"] == "written MN-major, TMA-aligned"
    masked = load_layer(
        SPEC.format(target=CUDA),
        "experts.gemm_backend=deep_gemm",
        "experts.layout=masked",
        *SCHEMES["fp8_block"],
    )
    assert [s["kind"] for s in masked.PLAN["stages"]].count("convert") == 2  # 3-D: a converter


def test_auto_splits_the_gemms_by_measured_times(stand_in, load_layer, tmp_path, monkeypatch):
    """gemm_backend auto with times per T on the target GPU: Triton GEMMs up to the largest T
    where they were faster, DeepGEMM above, in one package on one set of weights; each side
    equals the torch backend, and each runs only its own GEMMs."""
    times = {
        "triton": {"1": 1.0, "16": 2.0, "64": 9.0},
        "deep_gemm": {"1": 2.0, "16": 3.0, "64": 4.0},
    }
    table = {"backends/fp8_block/H256/I256/E4/K2": {"source": "a test", "ms": times}}
    (tmp_path / "nvidia-h200.json").write_text(json.dumps(table))
    monkeypatch.setenv("MOEC_TUNING_DIR", str(tmp_path))
    spec = SPEC.format(target=CUDA).replace('name = "dg"', 'name = "dg_split"')
    package = load_layer(spec, *SCHEMES["fp8_block"])
    reference = load_layer(
        SPEC.format(target=CPU), "experts.gemm_backend=torch", *SCHEMES["fp8_block"]
    )
    decisions = {d["what"]: d["choice"] for d in package.PLAN["decisions"]}
    assert decisions["gemm_backend"] == "triton up to T=16, deep_gemm above"
    above = package.PLAN["above"]
    assert above["up_to"] == 16 and above["gemm_backend"] == "deep_gemm"
    differ = {s["name"]: s["backend"] for s in above["stages"]}
    assert differ["gemm_gate_up"] == differ["gemm_down"] == "deep_gemm"
    assert "router" not in differ and "select" not in differ and "combine" not in differ
    layout = package.PLAN["choices"]["layout"]
    if layout == "contiguous":  # the DeepGEMM side starts at 17 tokens: end rows only
        stages = (Path(package.__file__).parent / "stages.py").read_text()
        assert "row_of.shape[0] < 16" not in stages
        assert stages.count("deep_gemm_grouped.fp8_contiguous_psum(") == 2
    layer = package.MoELayer(device="cpu").random_(0)
    expected_layer = reference.MoELayer().random_(0)
    for tokens in (16, 17):
        x = torch.randn(tokens, 256, generator=torch.Generator().manual_seed(tokens)).bfloat16()
        stand_in.CALLS.clear()
        out = layer(x).double()
        expected = expected_layer(x).double()
        told = "(psum)" if layout == "contiguous" else ""
        deep = [f"m_grouped_fp8_gemm_nt_{layout}{told}"] * 2 if tokens > 16 else []
        assert stand_in.CALLS == deep
        assert ((out - expected).norm() / expected.norm()).item() <= 2**-7


def test_auto_without_times_runs_deep_gemm_alone(stand_in, load_layer, tmp_path, monkeypatch):
    """No times for the layer on its GPU: auto takes DeepGEMM for every T, and says why."""
    monkeypatch.setenv("MOEC_TUNING_DIR", str(tmp_path))
    spec = SPEC.format(target=CUDA).replace('name = "dg"', 'name = "dg_untimed"')
    package = load_layer(spec, *SCHEMES["fp8_block"])
    decision = next(d for d in package.PLAN["decisions"] if d["what"] == "gemm_backend")
    assert decision["choice"] == "deep_gemm"
    assert "no times per T" in decision["reason"]
    assert package.PLAN["above"] is None


MXFP4 = ["quant.scheme=mxfp4", "quant.checkpoint=quantized", "model.n_shared_experts=0"]
MXFP4_SPEC = SPEC.format(target=CUDA).replace('name = "dg"', 'name = "dg_mxfp4"')


def test_mxfp4_experts_run_as_exact_e4m3_blocks(stand_in, load_layer):
    """mxfp4 experts on deep_gemm (sm90): stored as e4m3 in 128 x 128 blocks, converted at load
    without changing a value (the torch backend's mxfp4 weights, dequantized, equal them), then
    the fp8_block GEMMs: the same layer as the torch backend within the fp8 bound of
    tests/test_quantized.py (both quantize activations to e4m3, in 1 x 32 and 1 x 128 groups:
    2 * 2**-3 against one another)."""
    from moec.runtime import quant

    package = load_layer(MXFP4_SPEC, "experts.gemm_backend=deep_gemm", *MXFP4)
    reference = load_layer(SPEC.format(target=CPU), "experts.gemm_backend=torch", *MXFP4)
    decisions = {d["what"]: d["choice"] for d in package.PLAN["decisions"]}
    assert decisions["mxfp4 weights"] == "e4m3 in 128 x 128 blocks, converted at load"
    layer = package.MoELayer(device="cpu").random_(0)
    expected_layer = reference.MoELayer().random_(0)
    assert layer.w13.dtype == torch.float8_e4m3fn and layer.w13_scale.shape == (4, 4, 2)
    for name in ("w13", "w2"):
        ours, theirs = getattr(layer, name), getattr(expected_layer, name)
        ours_scale, theirs_scale = (
            getattr(layer, f"{name}_scale"),
            getattr(expected_layer, f"{name}_scale"),
        )
        for e in range(4):
            converted = quant.dequantize_blocks(ours[e], ours_scale[e], 128, 128)
            fp4 = quant.unpack_e2m1(theirs[e]) * theirs_scale[e].repeat_interleave(32, 1)
            assert torch.equal(converted, fp4)
    x = torch.randn(12, 256, generator=torch.Generator().manual_seed(3)).bfloat16()
    stand_in.CALLS.clear()
    out = layer(x).double()
    expected = expected_layer(x).double()
    assert (
        stand_in.CALLS == ["m_grouped_fp8_gemm_nt_masked"] * 2
        or stand_in.CALLS == ["m_grouped_fp8_gemm_nt_contiguous(psum)"] * 2
    )
    assert ((out - expected).norm() / expected.norm()).item() <= 2 * 2**-3


def test_mxfp4_checkpoint_outside_e4m3_is_refused(stand_in, load_layer):
    """A block whose group scales span more than 2**14 cannot be exact in e4m3: load_weights
    refuses it, naming the tensor."""
    from moec.runtime import quant

    package = load_layer(MXFP4_SPEC, "experts.gemm_backend=deep_gemm", *MXFP4)
    state = {}
    gen = torch.Generator().manual_seed(1)
    for e in range(4):
        for proj, shape in (("gate", (256, 256)), ("up", (256, 256)), ("down", (256, 256))):
            packed, scale = quant.quantize_e2m1(torch.randn(*shape, generator=gen))
            if (e, proj) == (2, "up"):
                scale[0, 1] = scale[0, 0] * 2**-20  # one tiny group beside a large one
            state[f"experts.{e}.{proj}_proj.weight"] = packed
            state[f"experts.{e}.{proj}_proj.weight_scale_inv"] = scale
    state["gate.weight"] = torch.randn(4, 256, generator=gen)
    state["gate.e_score_correction_bias"] = torch.zeros(4)
    with pytest.raises(Exception, match=r"experts\.2\.up_proj\.weight: mxfp4 to e4m3"):
        package.MoELayer(device="cpu").load_weights(state)
