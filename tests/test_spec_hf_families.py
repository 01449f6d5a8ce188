"""`moec init --from-hf` on the newer DeepSeek-style configs: DeepSeek-V3.2, GLM-4.5, Kimi-K2.5
(its DeepSeek-V3 in text_config) and DeepSeek-V4 (two MoE layer types; hash-routed layers
refused by key). The MoE keys of each published config.json, written here (no network)."""

from __future__ import annotations

import pytest
from test_spec_hf import DEEPSEEK_V3, FP8, KIMI_K2, init, write_config

from moec.spec import load_spec

DEEPSEEK_V32 = {
    **DEEPSEEK_V3,
    "architectures": ["DeepseekV32ForCausalLM"],
    "model_type": "deepseek_v32",
    "index_topk": 2048,
    "index_head_dim": 128,
    "index_n_heads": 64,
}
GLM_45 = {  # zai-org/GLM-4.5: no scoring_func / topk_method keys (sigmoid, noaux_tc)
    "architectures": ["Glm4MoeForCausalLM"],
    "model_type": "glm4_moe",
    "hidden_act": "silu",
    "hidden_size": 5120,
    "intermediate_size": 12288,
    "moe_intermediate_size": 1536,
    "n_routed_experts": 160,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "n_group": 1,
    "topk_group": 1,
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.5,
    "first_k_dense_replace": 3,
    "partial_rotary_factor": 0.5,
    "torch_dtype": "bfloat16",
}
KIMI_K25 = {
    "architectures": ["KimiK25ForConditionalGeneration"],
    "model_type": "kimi_k25",
    "text_config": {key: value for key, value in KIMI_K2.items() if key != "torch_dtype"},
    "vision_config": {"hidden_size": 1152, "num_hidden_layers": 27},
    "torch_dtype": "bfloat16",
}
DEEPSEEK_V4_FLASH = {
    "architectures": ["DeepseekV4ForCausalLM"],
    "model_type": "deepseek_v4",
    "hidden_act": "silu",
    "hidden_size": 4096,
    "moe_intermediate_size": 2048,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "num_experts_per_tok": 6,
    "num_hidden_layers": 43,
    "num_hash_layers": 3,
    "vocab_size": 129280,
    "norm_topk_prob": True,
    "routed_scaling_factor": 1.5,
    "scoring_func": "sqrtsoftplus",
    "swiglu_limit": 10.0,
    "expert_dtype": "fp4",
    "torch_dtype": "bfloat16",
    "quantization_config": {**FP8, "scale_fmt": "ue8m0"},
}


def _spec(tmp_path, capsys, config, *extra):
    spec_path = tmp_path / "spec.toml"
    code, _, err = init(
        capsys, "--from-hf", str(write_config(tmp_path, config)), "-o", str(spec_path), *extra
    )
    assert (code, err) == (0, "")
    return load_spec(spec_path).spec


def _refused(tmp_path, capsys, config, *extra) -> str:
    config_path = write_config(tmp_path, config)
    code, out, err = init(capsys, "--from-hf", str(config_path), *extra)
    assert (code, out) == (2, "")
    assert err.startswith(str(config_path)) and "Traceback" not in err
    return err


@pytest.mark.parametrize("config", [DEEPSEEK_V32, KIMI_K25], ids=["v32", "kimi_k25"])
def test_v3_style_models(config, tmp_path, capsys):
    spec = _spec(tmp_path, capsys, config)
    source = config.get("text_config", config)
    assert spec.model.n_routed_experts == source["n_routed_experts"]
    assert (spec.router.scoring_func, spec.router.topk_method) == ("sigmoid", "noaux_tc")
    assert (spec.router.n_group, spec.router.topk_group) == (
        source["n_group"],
        source["topk_group"],
    )
    assert spec.router.routed_scaling_factor == source["routed_scaling_factor"]
    assert spec.quant.scheme == "fp8_block" and spec.target.dtype == "bfloat16"


def test_glm_45(tmp_path, capsys):
    spec = _spec(tmp_path, capsys, GLM_45)
    assert spec.model.model_dump(exclude={"preset", "vocab_size"}) == {
        "hidden_size": 5120,
        "moe_intermediate_size": 1536,
        "n_routed_experts": 160,
        "num_experts_per_tok": 8,
        "n_shared_experts": 1,
    }
    router = spec.router
    assert (router.scoring_func, router.topk_method, router.norm_topk_prob) == (
        "sigmoid",
        "noaux_tc",
        True,
    )
    assert (router.n_group, router.routed_scaling_factor) == (1, 2.5)
    assert spec.quant.scheme == "bf16"


def test_kimi_k25_problems_name_text_config_keys(tmp_path, capsys):
    text = {**KIMI_K25["text_config"], "hidden_size": "7168"}
    err = _refused(tmp_path, capsys, {**KIMI_K25, "text_config": text})
    assert 'text_config.hidden_size = "7168": is a string, not an integer' in err
    err = _refused(tmp_path, capsys, {**KIMI_K25, "text_config": {**text, "model_type": "llama"}})
    assert 'text_config.model_type = "llama": is not a text model kimi_k25 holds' in err
    err = _refused(tmp_path, capsys, {"model_type": "kimi_k25"})
    assert "text_config: is missing from config.json" in err
    int4 = {"quant_method": "compressed-tensors", "config_groups": {}}  # Kimi-K2.5's INT4 experts
    text = {
        key: value for key, value in KIMI_K25["text_config"].items() if key != "quantization_config"
    }
    err = _refused(tmp_path, capsys, {**KIMI_K25, "text_config": text, "quantization_config": int4})
    assert (
        'quantization_config.quant_method = "compressed-tensors": is not a scheme moec runs' in err
    )


def test_v4_routed_layers(tmp_path, capsys):
    spec = _spec(tmp_path, capsys, DEEPSEEK_V4_FLASH, "--layer-type", "moe")
    assert (
        spec.model.hidden_size,
        spec.model.n_routed_experts,
        spec.model.num_experts_per_tok,
    ) == (4096, 256, 6)
    router = spec.router
    assert (router.scoring_func, router.topk_method, router.n_group) == (
        "sqrtsoftplus",
        "noaux_tc",
        1,
    )
    assert (router.norm_topk_prob, router.routed_scaling_factor) == (True, 1.5)
    assert (spec.quant.scheme, spec.quant.shared_scheme, spec.quant.checkpoint) == (
        "mxfp4",
        "fp8_block",
        "quantized",
    )
    assert (spec.activation.kind, spec.activation.swiglu_limit) == ("silu_clamped", 10.0)
    hashed = _spec(tmp_path, capsys, DEEPSEEK_V4_FLASH, "--layer-type", "hash_moe")
    assert (hashed.router.topk_method, hashed.model.vocab_size) == ("hash", 129280)
    assert hashed.model.model_dump(exclude={"vocab_size"}) == spec.model.model_dump(
        exclude={"vocab_size"}
    )
    fp8_experts = {**DEEPSEEK_V4_FLASH, "mlp_layer_types": ["moe"] * 43, "expert_dtype": "fp8"}
    assert _spec(tmp_path, capsys, fp8_experts).quant.scheme == "fp8_block"  # one type: no flag


@pytest.mark.parametrize(
    ("change", "extra", "message"),
    [
        ({}, (), "num_hash_layers = 3: holds 3 hash_moe and 40 moe layers, and a spec describes"),
        ({"vocab_size": None}, ("--layer-type", "hash_moe"), "vocab_size: is missing"),
        ({"num_hash_layers": None}, (), "mlp_layer_types: absent, so the first 3 layers are hash"),
        ({"mlp_layer_types": ["moe"] * 43}, ("--layer-type", "hash_moe"), "has no hash_moe layer"),
        ({"mlp_layer_types": ["moe", "dense"]}, (), "is not a list of DeepSeek-V4 MoE layer types"),
        (
            {"expert_dtype": "fp6"},
            ("--layer-type", "moe"),
            'expert_dtype = "fp6": is not an expert',
        ),
    ],
)
def test_v4_refusals_name_the_key(change, extra, message, tmp_path, capsys):
    config = {
        key: value for key, value in {**DEEPSEEK_V4_FLASH, **change}.items() if value is not None
    }
    assert message in _refused(tmp_path, capsys, config, *extra)


def test_hash_layers_on_other_model_types_are_not_dropped(tmp_path, capsys):
    err = _refused(tmp_path, capsys, {**DEEPSEEK_V3, "num_hash_layers": 3})
    assert (
        "num_hash_layers = 3: asks for hash-routed layers, which deepseek_v3 models do not" in err
    )
    assert "(hash-routed layers (tid2eid[input_ids] chooses the experts) are DeepSeek-V4's)" in err
    err = _refused(tmp_path, capsys, DEEPSEEK_V3, "--layer-type", "moe")
    assert "--layer-type moe is for deepseek_v4 configs" in err


@pytest.mark.parametrize(
    ("example", "config", "extra"),
    [
        ("deepseek-v4-flash.toml", DEEPSEEK_V4_FLASH, ("--layer-type", "moe")),
        ("deepseek-v4-flash-hash.toml", DEEPSEEK_V4_FLASH, ("--layer-type", "hash_moe")),
        ("glm-4.5.toml", GLM_45, ()),
    ],
)
def test_examples_are_what_init_writes(example, config, extra, tmp_path, capsys):
    """The shipped V4-Flash and GLM-4.5 examples describe the layers their configs do."""
    from conftest import EXAMPLES

    written = _spec(tmp_path, capsys, config, *extra)
    shipped = load_spec(EXAMPLES / example).spec
    for table in ("model", "router", "quant", "activation"):
        assert getattr(shipped, table) == getattr(written, table), table


def test_fp8_formats_and_mxfp4_quant_method(tmp_path, capsys):
    """`fmt` is read: e4m3 and e5m2 checkpoints give the same fp8_block spec (e5m2 values load
    converted to e4m3 exactly, block by block, or are refused naming the tensor); any other
    format is refused by key. HF's mxfp4 format is not called "not a scheme": moec has mxfp4,
    for DeepSeek-V4's fp4 experts, and the message says so."""
    specs = []
    for fmt in ("e4m3", "e5m2"):
        config_path = write_config(
            tmp_path, {**DEEPSEEK_V3, "quantization_config": {**FP8, "fmt": fmt}}
        )
        out_path = tmp_path / f"{fmt}.toml"
        code, _, err = init(capsys, "--from-hf", str(config_path), "-o", str(out_path))
        assert code == 0, err
        specs.append(load_spec(out_path).spec.quant)
    assert specs[0] == specs[1] and specs[0].scheme == "fp8_block"
    err = _refused(tmp_path, capsys, {**DEEPSEEK_V3, "quantization_config": {**FP8, "fmt": "e3m4"}})
    assert 'quantization_config.fmt = "e3m4": is not an fp8 format moec reads' in err
    assert '"e4m3" or "e5m2"' in err
    mxfp4 = {"quant_method": "mxfp4"}
    err = _refused(tmp_path, capsys, {**DEEPSEEK_V3, "quantization_config": mxfp4})
    assert "not a scheme moec runs" not in err
    assert 'quant_method = "mxfp4": is a checkpoint format moec does not read' in err
    assert 'expert_dtype "fp4"' in err


ROUTING_KEYS = (
    "n_shared_experts",
    "routed_scaling_factor",
    "n_group",
    "topk_group",
    "norm_topk_prob",
    "swiglu_limit",
)
DIMS = {
    "hidden_size": 256,
    "moe_intermediate_size": 128,
    "n_routed_experts": 16,
    "num_experts_per_tok": 4,
    "hidden_act": "silu",
}


@pytest.mark.parametrize(
    "model_type", ["deepseek_v2", "deepseek_v3", "deepseek_v32", "deepseek_v4", "glm4_moe"]
)
def test_a_key_left_out_takes_transformers_default(model_type, tmp_path, capsys):
    """A config.json without its routing keys means what transformers makes of it: each value
    moec writes is the one the model type's config class fills in."""
    transformers = pytest.importorskip("transformers")
    filled = transformers.AutoConfig.for_model(model_type, **DIMS)
    groups = {"n_group": 1, "topk_group": 1} if model_type == "deepseek_v2" else {}
    config = {"model_type": model_type, **DIMS, "num_experts_per_tok": 4, **groups}
    spec_path = tmp_path / "spec.toml"
    layer_type = ["--layer-type", "moe"] if model_type == "deepseek_v4" else []
    code, _, err = init(
        capsys,
        "--from-hf",
        str(write_config(tmp_path, config)),
        "-o",
        str(spec_path),
        *layer_type,
    )
    assert code == 0, err
    spec = load_spec(spec_path).spec
    written = {
        "n_shared_experts": spec.model.n_shared_experts,
        "routed_scaling_factor": spec.router.routed_scaling_factor,
        "n_group": spec.router.n_group,
        "topk_group": spec.router.topk_group,
        "norm_topk_prob": spec.router.norm_topk_prob,
        "swiglu_limit": getattr(spec.activation, "swiglu_limit", None),
    }
    for key in ROUTING_KEYS:
        default = getattr(filled, key, None)
        if key in groups or default is None:
            continue
        assert written[key] == default, (model_type, key)
