"""Hostile checkpoints given to a generated layer's load_weights: scales that are zero, negative,
not finite or overflow bf16 when applied; fp8 values in another one-byte format; loads that
fail half-way (the layer must be exactly as before); and messages that stay a screenful."""

from __future__ import annotations

import json

import pytest
import torch

from moec.runtime.checkpoint import WeightError

E4M3 = torch.float8_e4m3fn
E5M2 = torch.float8_e5m2
FNUZ = torch.float8_e4m3fnuz
BF16_MAX = torch.finfo(torch.bfloat16).max

SPEC = """
name = "hostile"
[model]
hidden_size = 256
moe_intermediate_size = 128
n_routed_experts = 4
num_experts_per_tok = 2
n_shared_experts = 1
[router]
scoring_func = "sigmoid"
topk_method = "noaux_tc"
n_group = 1
topk_group = 1
norm_topk_prob = true
[quant]
scheme = "fp8_block"
checkpoint = "quantized"
[experts]
gemm_backend = "torch"
[target]
device = "cpu"
dtype = "bfloat16"
max_num_tokens = 16
"""
SHAPES = {"gate": (128, 256), "up": (128, 256), "down": (256, 128)}


def _quantize(w: torch.Tensor, block: int = 128):
    """An independent 128 x 128 block quantizer (DeepSeek-V3's checkpoint format)."""
    n, k = w.shape
    blocks = w.view(n // block, block, k // block, block)
    scale = blocks.abs().amax(dim=(1, 3)) / 448.0
    return (blocks / scale[:, None, :, None]).view(n, k).to(E4M3), scale


def _checkpoint(seed: int = 0, names: str = "hf") -> dict[str, torch.Tensor]:
    """A valid fp8_block checkpoint of the layer (HF names, or DeepSeek's w1 / w3 / w2 with
    `.scale`)."""
    generator = torch.Generator().manual_seed(seed)
    out = {
        "gate.weight": torch.randn(4, 256, generator=generator).bfloat16(),
        "gate.e_score_correction_bias": 0.02 * torch.randn(4, generator=generator),
    }
    deepseek = {"gate": "w1", "up": "w3", "down": "w2"}
    for owner in [f"experts.{e}" for e in range(4)] + ["shared_experts"]:
        for proj, shape in SHAPES.items():
            q, scale = _quantize(torch.randn(*shape, generator=generator) / 16)
            if names == "hf":
                out[f"{owner}.{proj}_proj.weight"] = q
                out[f"{owner}.{proj}_proj.weight_scale_inv"] = scale
            else:
                out[f"{owner}.{deepseek[proj]}.weight"] = q
                out[f"{owner}.{deepseek[proj]}.scale"] = scale
    return out


@pytest.fixture(scope="module")
def package(cache_dir):
    import moec
    from moec.spec import parse_spec

    return moec.load(parse_spec(SPEC, "<hostile spec>", []), cache_dir=cache_dir)


def _snapshot(layer) -> dict[str, bytes]:
    return {
        k: v.detach().reshape(-1).view(torch.uint8).clone() for k, v in layer.state_dict().items()
    }


def _refused(layer, checkpoint, prefix: str = ""):
    """Load a bad checkpoint into a randomized layer: it must raise and change nothing."""
    before = _snapshot(layer)
    with pytest.raises(ValueError) as caught:  # the package's own WeightError
        layer.load_weights(checkpoint, prefix)
    assert type(caught.value).__name__ == "WeightError"
    after = _snapshot(layer)
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before), "the layer was changed"
    assert "the layer is unchanged" in str(caught.value)
    return caught.value


def _dequantized(value: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    full = scale.repeat_interleave(128, 0).repeat_interleave(128, 1)
    return value.float() * full


# --- scales -------------------------------------------------------------------------------


def test_a_valid_checkpoint_loads_its_bytes(package):
    checkpoint = _checkpoint()
    layer = package.MoELayer().load_weights(checkpoint)
    gate, up = checkpoint["experts.2.gate_proj.weight"], checkpoint["experts.2.up_proj.weight"]
    assert torch.equal(layer.w13[2].view(torch.uint8), torch.cat([gate, up]).view(torch.uint8))


@pytest.mark.parametrize("value", [0.0, -1e-3])
def test_a_zero_or_negative_scale_is_refused_naming_tensor_and_block(package, value):
    checkpoint = _checkpoint()
    checkpoint["experts.1.down_proj.weight_scale_inv"][1, 0] = value
    error = _refused(package.MoELayer().random_(0), checkpoint)
    assert error.problems == [
        "experts.1.down_proj.weight_scale_inv: 1 of its 2 scales are zero or negative "
        "(the first: block (1, 0)); a scale is > 0"
    ]


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_a_non_finite_scale_is_refused_once(package, value):
    checkpoint = _checkpoint()
    checkpoint["experts.3.up_proj.weight_scale_inv"][0, 1] = value
    error = _refused(package.MoELayer().random_(0), checkpoint)
    assert len(error.problems) == 1
    assert error.problems[0].startswith("experts.3.up_proj.weight_scale_inv: 1 of its 2 values")


def test_a_scale_that_overflows_bf16_is_refused_naming_the_block(package):
    """1e38 is a finite fp32, but 1e38 times an e4m3 value of 448 is no bf16 number."""
    checkpoint = _checkpoint()
    checkpoint["shared_experts.gate_proj.weight_scale_inv"][0, 1] = 1e38
    error = _refused(package.MoELayer().random_(0), checkpoint)
    [problem] = error.problems
    assert problem.startswith("shared_experts.gate_proj.weight_scale_inv: block (0, 1):")
    assert "exceeds what bf16 holds" in problem and "shared_experts.gate_proj.weight)" in problem


def test_a_large_scale_of_small_values_is_taken(package):
    """The bound is the product: a scale of 1e36 over values of at most 2**-4 is a weight of
    at most 6.25e34, within bf16."""
    checkpoint = _checkpoint()
    name = "experts.0.down_proj.weight"
    checkpoint[name] = torch.full((256, 128), 2.0**-4).to(E4M3)
    checkpoint[name + "_scale_inv"] = torch.full((2, 1), 1e36)
    layer = package.MoELayer().load_weights(checkpoint)
    assert torch.equal(layer.w2_scale[0], checkpoint[name + "_scale_inv"])


def test_per_tensor_scales_are_checked(cache_dir):
    import moec
    from moec.spec import parse_spec

    spec = parse_spec(SPEC, "<hostile spec>", ["quant.scheme=fp8_per_tensor", "name=hostile_pt"])
    package = moec.load(spec, cache_dir=cache_dir)
    checkpoint = _checkpoint()
    for name in list(checkpoint):
        if name.endswith("_scale_inv"):
            checkpoint[name] = checkpoint[name].amax().reshape(1)
    package.MoELayer().load_weights(checkpoint)  # valid
    checkpoint["experts.0.gate_proj.weight_scale_inv"] = torch.tensor([-2.0])
    checkpoint["experts.1.up_proj.weight_scale_inv"] = torch.tensor(1e37)
    error = _refused(package.MoELayer().random_(0), checkpoint)
    text = "\n".join(error.problems)
    assert "experts.0.gate_proj.weight_scale_inv: 1 of its 1 scales are zero or negative" in text
    assert "experts.1.up_proj.weight_scale_inv: block 0: its largest weight" in text


def test_deepseek_names_are_named_in_problems(package):
    """A DeepSeek checkpoint's `.scale` is named as it is spelled there, not as HF spells it."""
    checkpoint = _checkpoint(names="deepseek")
    package.MoELayer().load_weights(checkpoint)  # valid
    checkpoint["experts.2.w3.scale"][0, 0] = -1.0
    error = _refused(package.MoELayer().random_(0), checkpoint)
    [problem] = error.problems
    assert problem.startswith("experts.2.w3.scale: 1 of its 2 scales")


def _sparse(tensor):
    return tensor.float().to_sparse()


@pytest.mark.parametrize(
    ("name", "make", "problem"),
    [
        ("gate.weight", _sparse, "gate.weight: a torch.sparse_coo tensor: pass it dense"),
        (
            "experts.0.gate_proj.weight_scale_inv",
            _sparse,
            "experts.0.gate_proj.weight_scale_inv: a torch.sparse_coo tensor",
        ),
        (
            "gate.weight",
            lambda t: torch.full(t.shape, 1e300, dtype=torch.float64),
            "gate.weight: values beyond fp32",
        ),
        (
            "experts.1.up_proj.weight_scale_inv",
            lambda t: t.double() * 1e300,
            "experts.1.up_proj.weight_scale_inv: scales beyond fp32",
        ),
        (
            "shared_experts.down_proj.weight",
            lambda t: torch.full(t.shape, 1e39, dtype=torch.float64),
            "shared_experts.down_proj.weight: 32768 of its 32768 values are beyond what bf16",
        ),
    ],
)
def test_values_no_layer_can_hold_are_refused(package, name, make, problem):
    """Sparse tensors, and finite values in a wide dtype that are beyond fp32 (router, scales)
    or bf16 (weights quantized on load) once converted."""
    checkpoint = _checkpoint()
    checkpoint[name] = make(checkpoint[name])
    if name.endswith("proj.weight"):  # a float weight, quantized on load, comes without a scale
        del checkpoint[name + "_scale_inv"]
    error = _refused(package.MoELayer().random_(0), checkpoint)
    assert len(error.problems) == 1 and error.problems[0].startswith(problem)


# --- fp8 formats --------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [E5M2, FNUZ])
def test_other_fp8_formats_convert_exactly(package, dtype):
    """e5m2 / e4m3fnuz values whose blocks fit e4m3's range become e4m3 with the scale
    absorbing a power of two: the dequantized weights are the checkpoint's, bit for bit."""
    checkpoint = _checkpoint()
    generator = torch.Generator().manual_seed(3)
    for e in range(4):
        for proj, shape in SHAPES.items():
            name = f"experts.{e}.{proj}_proj.weight"
            # 2**-4 .. 2**4 and zeros: within e4m3's range after the shift, e5m2's 2
            # mantissa bits within e4m3's 3; the largest value of e4m3fnuz (240) is no e4m3
            # value of the same exponent (448 is its largest), so the shift must pick 2**-1
            exponent = torch.rand(*shape, generator=generator) * 8 - 4 + e
            sign = torch.randint(0, 2, shape, generator=generator) * 2 - 1
            values = sign * torch.exp2(exponent)
            values[::7] = 0.0
            values[1, 1] = 240.0 if dtype == FNUZ else values[1, 1]
            checkpoint[name] = values.to(dtype)
    layer = package.MoELayer().load_weights(checkpoint)
    for e in range(4):
        gate, up = (checkpoint[f"experts.{e}.{p}_proj.weight"] for p in ("gate", "up"))
        scales = [checkpoint[f"experts.{e}.{p}_proj.weight_scale_inv"] for p in ("gate", "up")]
        want = torch.cat([_dequantized(gate, scales[0]), _dequantized(up, scales[1])])
        assert layer.w13.dtype == E4M3
        assert torch.equal(_dequantized(layer.w13[e], layer.w13_scale[e]), want)
        down = checkpoint[f"experts.{e}.down_proj.weight"]
        want = _dequantized(down, checkpoint[f"experts.{e}.down_proj.weight_scale_inv"])
        assert torch.equal(_dequantized(layer.w2[e], layer.w2_scale[e]), want)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_float_weight_beside_its_scale_is_refused(package, dtype):
    """Float weights in a quantized checkpoint are quantized on load, but a float weight with a
    scale beside it may be e4m3 values widened without their scale: taking it would be wrong by
    the scale, dropping the scale silently too. Refused, naming both; without the scale the
    same float weight loads."""
    checkpoint = _checkpoint()
    name = "experts.1.up_proj.weight"
    checkpoint[name] = checkpoint[name].to(dtype)
    error = _refused(package.MoELayer().random_(0), checkpoint)
    assert len(error.problems) == 1
    assert error.problems[0].startswith(f"{name}_scale_inv: beside a {dtype} weight {name}")
    del checkpoint[name + "_scale_inv"]
    package.MoELayer().load_weights(checkpoint)


def test_e5m2_too_wide_for_e4m3_is_refused_naming_tensor_and_dtype(package):
    """The issue's case: router tensors good, experts in e5m2 whose block spans 2**-16 .. 2**15:
    no e4m3 block holds both; refused, the router not copied in, the checkpoint name given."""
    checkpoint = _checkpoint()
    name = "experts.2.gate_proj.weight"
    values = torch.full(SHAPES["gate"], 1.0)
    values[0, 0], values[5, 7] = 2.0**15, 2.0**-16
    checkpoint[name] = values.to(E5M2)
    checkpoint["gate.weight"] = torch.ones(4, 256).bfloat16()  # good and different
    error = _refused(package.MoELayer().random_(0), checkpoint)
    [problem] = error.problems
    assert problem.startswith(f"{name}: torch.float8_e5m2 values that float8_e4m3fn cannot hold")
    assert "expected float8_e4m3fn, or bf16 / fp16 / fp32 weights" in problem
    assert "w13" not in str(error)


@pytest.mark.skipif(not hasattr(torch, "float8_e8m0fnu"), reason="torch without e8m0")
def test_exponent_bytes_as_values_are_refused(package):
    checkpoint = _checkpoint()
    name = "experts.0.up_proj.weight"
    checkpoint[name] = torch.ones(SHAPES["up"]).to(torch.float8_e8m0fnu)
    error = _refused(package.MoELayer().random_(0), checkpoint)
    assert f"{name}: torch.float8_e8m0fnu values: expected float8_e4m3fn" in error.problems[0]


def _mx_checkpoint(scheme: str):
    """A checkpoint of the SPEC layer with {scheme} experts as released ones hold them: mxfp4's
    packed e2m1 pairs (all 0x77: 6.0) or mxfp8's e4m3, under UE8M0 exponent bytes (2**-7)."""
    checkpoint = {k: v for k, v in _checkpoint().items() if not k.startswith("experts.")}
    for name in [k for k in checkpoint if k.startswith("shared_experts.")]:
        if name.endswith("_scale_inv"):
            del checkpoint[name]
        else:
            checkpoint[name] = torch.randn(checkpoint[name].shape).bfloat16()
    for e in range(4):
        for proj, (n, k) in SHAPES.items():
            value = (
                torch.full((n, k // 2), 0x77, dtype=torch.uint8)
                if scheme == "mxfp4"
                else torch.full((n, k), 448.0).to(torch.float8_e4m3fn)
            )
            checkpoint[f"experts.{e}.{proj}_proj.weight"] = value
            scale = torch.full((n, k // 32), 120, dtype=torch.uint8)
            checkpoint[f"experts.{e}.{proj}_proj.weight_scale_inv"] = scale
    return checkpoint


def _mx_package(cache_dir, scheme: str):
    import moec
    from moec.spec import parse_spec

    overrides = [f"quant.scheme={scheme}", "quant.shared_scheme=mxfp8", f"name=hostile_{scheme}"]
    return moec.load(parse_spec(SPEC, "<hostile spec>", overrides), cache_dir=cache_dir)


def test_mxfp4_exponents_are_checked(cache_dir):
    """UE8M0 exponent 255 is nan; 254 (2**127) times an e2m1 6.0 is beyond bf16."""
    package = _mx_package(cache_dir, "mxfp4")
    checkpoint = _mx_checkpoint("mxfp4")
    package.MoELayer().load_weights(checkpoint)  # valid: 6.0 * 2**-7
    checkpoint["experts.1.down_proj.weight_scale_inv"][3, 2] = 255
    checkpoint["experts.2.gate_proj.weight_scale_inv"][4, 1] = 254
    error = _refused(package.MoELayer().random_(0), checkpoint)
    text = "\n".join(error.problems)
    assert "experts.1.down_proj.weight_scale_inv: UE8M0 exponent 255 (nan)" in text
    assert "experts.2.gate_proj.weight_scale_inv: block (4, 1): its largest weight" in text
    assert len(error.problems) == 2


def test_mxfp4_scales_that_are_no_power_of_two_are_refused(cache_dir):
    """fp32 scales of an mxfp4 checkpoint that are no UE8M0 value (0.75 * 2**-7): refused by
    name, as its own state_dict would be, not kept (e2m1 values do not requantize exactly)."""
    package = _mx_package(cache_dir, "mxfp4")
    checkpoint = _mx_checkpoint("mxfp4")
    name = "experts.2.up_proj.weight_scale_inv"
    checkpoint[name] = torch.full(checkpoint[name].shape, 0.75 * 2.0**-7)
    error = _refused(package.MoELayer().random_(0), checkpoint)
    assert len(error.problems) == 1
    count = checkpoint[name].numel()
    assert error.problems[0].startswith(
        f"{name}: {count} of its {count} scales are no power of two"
    )
    checkpoint[name] = torch.full(checkpoint[name].shape, 2.0**-7)  # fp32 powers of two: taken
    layer = package.MoELayer().load_weights(checkpoint)
    layer.load_state_dict(layer.state_dict())


def test_ue8m0_exponent_zero_is_a_power_of_two(cache_dir):
    """UE8M0 exponent 0 is 2**-127 (an fp32 denormal): an mxfp8 block under it is kept as
    written (448 * 2**-127, which bf16 holds), not requantized to zeros."""
    package = _mx_package(cache_dir, "mxfp8")
    checkpoint = _mx_checkpoint("mxfp8")
    checkpoint["experts.0.down_proj.weight_scale_inv"][0, 0] = 0
    layer = package.MoELayer().load_weights(checkpoint)
    assert layer.w2_scale[0, 0, 0].item() == 2.0**-127
    assert (layer.w2[0, 0, :32].float() == 448.0).all()


# --- all or nothing -----------------------------------------------------------------------


def test_a_failed_load_leaves_a_loaded_layer_as_it_was(package):
    """A layer loaded from one checkpoint, then a bad second one (good router, bad experts):
    it still holds the first checkpoint, bit for bit, and its forward is the first's."""
    layer = package.MoELayer().load_weights(_checkpoint(1))
    x = torch.randn(5, 256, generator=torch.Generator().manual_seed(2)).bfloat16()
    first = layer(x)
    bad = _checkpoint(2)
    bad["experts.3.down_proj.weight_scale_inv"][0, 0] = 0.0
    _refused(layer, bad)
    assert torch.equal(layer(x), first)


def test_an_unreadable_source_says_the_layer_is_unchanged(package, tmp_path):
    error = _refused(package.MoELayer().random_(0), tmp_path / "absent.safetensors")
    assert "no such file or folder" in error.problems[0]


def test_a_fused_in_memory_tensor_is_named_with_its_expert(package):
    """transformers' fused experts.gate_up_proj has no per-expert name: a problem names the
    fused tensor and the expert."""
    from moec.runtime.weight_formats import WeightFormat

    fmt = WeightFormat("fp8_block", (128, 128), False, True, False, torch.bfloat16)
    problems: list[str] = []
    value = torch.ones(128, 256).to(E4M3)
    scale = torch.tensor([[1.0, -1.0]])
    names = ("mlp.experts.gate_up_proj[3]", "mlp.experts.gate_up_proj_scale[3]")
    assert fmt.from_checkpoint(value, scale, (128, 256), "x", problems, names) is None
    assert problems[0].startswith("mlp.experts.gate_up_proj_scale[3]: 1 of its 2 scales")


# --- bounded messages ---------------------------------------------------------------------


def test_a_hundred_thousand_bogus_names_give_a_screenful(package):
    checkpoint = _checkpoint()
    bogus = torch.zeros(1)
    checkpoint.update({f"experts.0.bogus_{i}.weight": bogus for i in range(100_000)})
    error = _refused(package.MoELayer().random_(0), checkpoint)
    lines = str(error).splitlines()
    assert len(lines) <= 25 and len(str(error)) < 8_000
    assert "and 99980 more problems" in str(error)
    assert len(error.problems) == 100_000  # all still there for a program to read


def test_long_names_are_shortened_with_an_ellipsis(package):
    checkpoint = _checkpoint()
    long = "experts.0." + "x" * 20_000 + ".weight"
    checkpoint[long] = torch.zeros(1)
    error = _refused(package.MoELayer().random_(0), checkpoint)
    line = str(error).splitlines()[1]
    assert len(line) <= 410 and "..." in line and line.strip().startswith("experts.0.xxx")
    assert line.rstrip().endswith(": unexpected")


def test_many_missing_shards_are_one_bounded_problem(package, tmp_path):
    weight_map = {f"gate.weight_{i}": f"model-{i:05d}.safetensors" for i in range(20_000)}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    error = _refused(package.MoELayer().random_(0), tmp_path)
    assert len(str(error).splitlines()) <= 25 and len(str(error)) < 4_000
    [problem] = [p for p in error.problems if "names the shards" in p]
    assert "names the shards model-00000.safetensors, model-00001.safetensors" in problem
    assert "and 19990 more, which are not a file in" in problem


def test_an_index_naming_a_tensor_twice_is_a_problem(package, tmp_path):
    """JSON keeps the last of two equal keys: which shard holds the tensor is unknown."""
    from safetensors.torch import save_file

    checkpoint = _checkpoint()
    save_file({k: v.contiguous() for k, v in checkpoint.items()}, tmp_path / "a.safetensors")
    entries = ",".join(f'"{name}": "a.safetensors"' for name in checkpoint)
    text = '{"metadata": {}, "weight_map": {' + entries + ', "gate.weight": "b.safetensors"}}'
    (tmp_path / "model.safetensors.index.json").write_text(text)
    error = _refused(package.MoELayer().random_(0), tmp_path)
    assert any("names gate.weight more than once" in p for p in error.problems)


def test_static_activation_scales_are_checked(cache_dir):
    import moec
    from moec.spec import parse_spec

    overrides = ["quant.activation_scheme=static", "quant.scheme=fp8_per_tensor", "name=hostile_st"]
    package = moec.load(parse_spec(SPEC, "<hostile spec>", overrides), cache_dir=cache_dir)
    checkpoint = _checkpoint()
    for name in list(checkpoint):
        if name.endswith("_scale_inv"):
            checkpoint[name] = checkpoint[name].amax().reshape(1)
            checkpoint[name.replace("weight_scale_inv", "input_scale")] = torch.tensor(0.01)
    package.MoELayer().load_weights(checkpoint)  # valid
    checkpoint["experts.2.up_proj.input_scale"] = torch.tensor(-0.01)
    checkpoint["shared_experts.down_proj.input_scale"] = torch.tensor(0.0)
    error = _refused(package.MoELayer().random_(0), checkpoint)
    assert sorted(error.problems) == [
        "experts.2.up_proj.input_scale: -0.009999999776482582: an activation scale is > 0",
        "shared_experts.down_proj.input_scale: 0.0: an activation scale is > 0",
    ]


def test_weight_error_message_is_bounded_but_keeps_every_problem():
    problems = [f"t{i}: missing" for i in range(30)] + ["y" * 1000]
    error = WeightError(problems)
    text = str(error)
    assert error.problems == problems
    assert text.count("\n") == 21 and "t19: missing" in text and "t20" not in text
    assert text.endswith("and 11 more problems")
    assert "the layer is unchanged" not in text
    assert "y" * 1000 not in str(WeightError(["y" * 1000]))


def test_the_layers_own_tensors_reordered_load_as_given(package):
    """A checkpoint of views of the layer's own parameters (its experts swapped): each row is
    read before any row is written."""
    layer = package.MoELayer().load_weights(_checkpoint())
    swapped = _checkpoint()
    for proj in SHAPES:
        for field in ("weight", "weight_scale_inv"):
            a, b = f"experts.0.{proj}_proj.{field}", f"experts.1.{proj}_proj.{field}"
            swapped[a], swapped[b] = swapped[b], swapped[a]
    expected = package.MoELayer().load_weights(swapped)
    own = {k: v for k, v in layer.state_dict().items()}
    views = _checkpoint()
    for proj, rows in (("gate", slice(0, 128)), ("up", slice(128, 256))):
        for e, source in ((0, 1), (1, 0), (2, 2), (3, 3)):
            views[f"experts.{e}.{proj}_proj.weight"] = own["w13"][source, rows]
    for e, source in ((0, 1), (1, 0), (2, 2), (3, 3)):
        views[f"experts.{e}.down_proj.weight"] = own["w2"][source]
    for e in range(4):
        for proj in SHAPES:
            views[f"experts.{e}.{proj}_proj.weight_scale_inv"] = swapped[
                f"experts.{e}.{proj}_proj.weight_scale_inv"
            ]
    layer.load_weights(views)
    assert torch.equal(layer.w13, expected.w13) and torch.equal(layer.w2, expected.w2)


def test_scales_for_a_float_checkpoint_name_the_key(cache_dir):
    """A quantized checkpoint given to a layer that reads float weights (quant.checkpoint =
    "bf16") is refused at its scales, naming the key that reads it as quantized."""
    import moec
    from moec.spec import parse_spec

    overrides = ["quant.checkpoint=bf16", "name=hostile_float_checkpoint"]
    package = moec.load(parse_spec(SPEC, "<hostile spec>", overrides), cache_dir=cache_dir)
    checkpoint = _checkpoint()
    for name in list(checkpoint):  # the float weights the layer reads, the scales left
        if name.endswith("_proj.weight"):
            checkpoint[name] = torch.randn(checkpoint[name].shape).bfloat16()
    error = _refused(package.MoELayer().random_(0), checkpoint)
    assert 'quant.checkpoint = "quantized")' in error.problems[0]
    assert error.problems[0].startswith("experts.0.gate_proj.weight_scale_inv: unexpected")
