"""`moec init --from-hf`: specs from the published config.json of DeepSeek-V2, V2-Lite, V3/R1
and Kimi-K2 (written here, no network), and configs moec cannot run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from moec.cli import main
from moec.resources import shipped_schema_path
from moec.spec import load_spec
from moec.spec.presets import PRESETS

FP8 = {
    "activation_scheme": "dynamic",
    "fmt": "e4m3",
    "quant_method": "fp8",
    "weight_block_size": [128, 128],
}

# The MoE keys of each model's published config.json (and a few of the keys around them).
DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "hidden_act": "silu",
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "n_group": 8,
    "topk_group": 4,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.5,
    "first_k_dense_replace": 3,
    "moe_layer_freq": 1,
    "num_hidden_layers": 61,
    "torch_dtype": "bfloat16",
    "quantization_config": FP8,
}
DEEPSEEK_R1 = {**DEEPSEEK_V3, "_name_or_path": "deepseek-ai/DeepSeek-R1"}
DEEPSEEK_V2 = {
    "architectures": ["DeepseekV2ForCausalLM"],
    "model_type": "deepseek_v2",
    "hidden_act": "silu",
    "hidden_size": 5120,
    "intermediate_size": 12288,
    "moe_intermediate_size": 1536,
    "n_routed_experts": 160,
    "n_shared_experts": 2,
    "num_experts_per_tok": 6,
    "n_group": 8,
    "topk_group": 3,
    "topk_method": "group_limited_greedy",
    "scoring_func": "softmax",
    "norm_topk_prob": False,
    "routed_scaling_factor": 16.0,
    "torch_dtype": "bfloat16",
}
DEEPSEEK_V2_LITE = {
    **DEEPSEEK_V2,
    "hidden_size": 2048,
    "intermediate_size": 10944,
    "moe_intermediate_size": 1408,
    "n_routed_experts": 64,
    "n_group": 1,
    "topk_group": 1,
    "topk_method": "greedy",
    "routed_scaling_factor": 1.0,
}
KIMI_K2 = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "kimi_k2",
    "hidden_act": "silu",
    "hidden_size": 7168,
    "moe_intermediate_size": 2048,
    "n_routed_experts": 384,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "n_group": 1,
    "topk_group": 1,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.827,
    "torch_dtype": "bfloat16",
    "quantization_config": FP8,
}

# config, the preset with the same model/router values, the name init gives it, its quant scheme
MODELS = {
    "deepseek-v3": (DEEPSEEK_V3, "deepseek-v3", "deepseek_v3", "fp8_block"),
    "deepseek-r1": (DEEPSEEK_R1, "deepseek-r1", "deepseek_r1", "fp8_block"),
    "deepseek-v2": (DEEPSEEK_V2, "deepseek-v2", "deepseek_v2", "bf16"),
    "deepseek-v2-lite": (DEEPSEEK_V2_LITE, "deepseek-v2-lite", "deepseek_v2", "bf16"),
    "kimi-k2": (KIMI_K2, "kimi-k2", "kimi_k2", "fp8_block"),
}


def write_config(folder: Path, config: Any) -> Path:
    path = folder / "config.json"
    path.write_text(json.dumps(config, indent=2), encoding="utf-8")
    return path


def init(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["init", *args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("model", MODELS)
def test_init_writes_a_valid_spec_with_the_model_values(model, tmp_path, capsys):
    config, preset, name, scheme = MODELS[model]
    spec_path = tmp_path / "spec.toml"
    code, out, err = init(
        capsys, "--from-hf", str(write_config(tmp_path, config)), "-o", str(spec_path)
    )
    assert (code, err) == (0, "")
    assert out == f"wrote {spec_path}\n"

    spec = load_spec(spec_path).spec
    assert spec.name == name
    assert spec.model.model_dump(exclude={"preset", "vocab_size"}) == PRESETS[preset]["model"]
    assert spec.router.model_dump(exclude={"rounding"}) == PRESETS[preset]["router"]
    assert spec.router.rounding == "none"  # their transformers routers are fp32
    assert spec.quant.scheme == scheme
    if scheme == "fp8_block":
        assert spec.quant.weight_block == [128, 128]
        assert spec.quant.checkpoint == "quantized"
        assert spec.quant.activation_scheme == "dynamic"
        assert spec.quant.scale_dtype == "fp32"
    assert spec.activation.kind == "silu"
    assert (spec.target.device, spec.target.dtype) == ("cuda", "bfloat16")
    assert main(["validate", str(spec_path)]) == 0


def test_init_v3_values_spelled_out(tmp_path, capsys):
    """The V3 numbers themselves, not only through the preset table."""
    spec_path = tmp_path / "v3.toml"
    init(capsys, "--from-hf", str(write_config(tmp_path, DEEPSEEK_V3)), "-o", str(spec_path))
    spec = load_spec(spec_path).spec
    model, router = spec.model, spec.router
    assert (model.hidden_size, model.moe_intermediate_size) == (7168, 2048)
    assert (model.n_routed_experts, model.num_experts_per_tok, model.n_shared_experts) == (
        256,
        8,
        1,
    )
    assert (router.n_group, router.topk_group, router.routed_scaling_factor) == (8, 4, 2.5)
    assert (router.scoring_func, router.topk_method, router.norm_topk_prob) == (
        "sigmoid",
        "noaux_tc",
        True,
    )


def test_init_spec_starts_with_a_schema_directive_that_resolves(tmp_path, capsys):
    out_dir = tmp_path / "specs"
    out_dir.mkdir()
    spec_path = out_dir / "kimi.toml"
    init(capsys, "--from-hf", str(write_config(tmp_path, KIMI_K2)), "-o", str(spec_path))
    first = spec_path.read_text(encoding="utf-8").splitlines()[0]
    assert first.startswith("#:schema ")
    target = (spec_path.parent / first.removeprefix("#:schema ")).resolve()
    assert target == shipped_schema_path().resolve()


def test_init_to_stdout(tmp_path, capsys):
    code, out, err = init(capsys, "--from-hf", str(write_config(tmp_path, DEEPSEEK_V2_LITE)))
    assert (code, err) == (0, "")
    assert out.startswith("#:schema ")
    assert 'name = "deepseek_v2"' in out
    assert "[router]" in out and 'topk_method = "greedy"' in out


def test_init_name_and_set(tmp_path, capsys):
    spec_path = tmp_path / "spec.toml"
    code, _, err = init(
        capsys,
        "--from-hf",
        str(write_config(tmp_path, DEEPSEEK_V3)),
        "-o",
        str(spec_path),
        "--name",
        "v3_cpu",
        "--set",
        "target.device=cpu",
        "--set",
        "experts.gemm_backend=torch",
        "--set",
        "quant.checkpoint=bf16",
    )
    assert (code, err) == (0, "")
    spec = load_spec(spec_path).spec
    assert spec.name == "v3_cpu"
    assert (spec.target.device, spec.target.arch) == ("cpu", None)
    assert spec.experts.gemm_backend == "torch"
    assert spec.quant.checkpoint == "bf16"


def test_init_swiglu_limit_becomes_silu_clamped(tmp_path, capsys):
    """Where the model type's MoE block clamps (GLM-5-Next's; DeepSeek-V3's never does, see
    tests/test_hf_families4.py)."""
    config = {**DEEPSEEK_V3, "model_type": "glm5_next_text", "swiglu_limit": 7.0}
    spec_path = tmp_path / "spec.toml"
    init(capsys, "--from-hf", str(write_config(tmp_path, config)), "-o", str(spec_path))
    activation = load_spec(spec_path).spec.activation
    assert (activation.kind, activation.swiglu_limit) == ("silu_clamped", 7.0)


def test_init_per_tensor_fp8(tmp_path, capsys):
    """FineGrainedFP8Config's weight_block_size None is per-tensor scales."""
    config = {
        **DEEPSEEK_V2_LITE,
        "quantization_config": {
            "quant_method": "fp8",
            "activation_scheme": "static",
            "weight_block_size": None,
        },
    }
    spec_path = tmp_path / "spec.toml"
    assert (
        init(capsys, "--from-hf", str(write_config(tmp_path, config)), "-o", str(spec_path))[0] == 0
    )
    quant = load_spec(spec_path).spec.quant
    assert (quant.scheme, quant.activation_scheme, quant.checkpoint) == (
        "fp8_per_tensor",
        "static",
        "quantized",
    )


def test_init_fp8_without_weight_block_size_is_its_default_block(tmp_path, capsys):
    """Left out, weight_block_size is FineGrainedFP8Config's default (128, 128), as transformers
    loads the checkpoint, not per-tensor scales; with static activations (per-tensor input
    scales beside 128x128 weight blocks, which moec does not run) the spec is refused by key."""
    config = {**DEEPSEEK_V2_LITE, "quantization_config": {"quant_method": "fp8"}}
    spec_path = tmp_path / "spec.toml"
    assert (
        init(capsys, "--from-hf", str(write_config(tmp_path, config)), "-o", str(spec_path))[0] == 0
    )
    quant = load_spec(spec_path).spec.quant
    assert (quant.scheme, quant.weight_block, quant.checkpoint) == (
        "fp8_block",
        [128, 128],
        "quantized",
    )
    static = {"quant_method": "fp8", "activation_scheme": "static"}
    config = {**DEEPSEEK_V2_LITE, "quantization_config": static}
    refused = tmp_path / "x.toml"
    code, _, err = init(
        capsys, "--from-hf", str(write_config(tmp_path, config)), "-o", str(refused)
    )
    assert code == 2 and "activation_scheme" in err and "Traceback" not in err
    assert not refused.exists()


def test_init_notes_the_fp8_loading_keys_it_does_not_follow(tmp_path, capsys):
    """dequantize = true (transformers runs bf16 weights) and modules_to_not_convert naming
    the MoE block's modules (kept bf16 there) are not followed: the spec says so in a comment
    naming the key; modules outside the block (lm_head) and dequantize = false change nothing."""
    quantization = {
        "quant_method": "fp8",
        "weight_block_size": [128, 128],
        "dequantize": True,
        "modules_to_not_convert": ["lm_head", "model.layers.3.mlp.experts", "x\ny.mlp"],
    }
    config = {**DEEPSEEK_V3, "quantization_config": quantization}
    spec_path = tmp_path / "spec.toml"
    assert (
        init(capsys, "--from-hf", str(write_config(tmp_path, config)), "-o", str(spec_path))[0] == 0
    )
    text = spec_path.read_text(encoding="utf-8")
    comments = [line for line in text.splitlines() if line.startswith("# quantization_config.")]
    assert len(comments) == 2, text
    assert "dequantize = true is not followed" in comments[0]
    assert '"model.layers.3.mlp.experts", "x\\ny.mlp"' in comments[1]
    assert "lm_head" not in comments[1]
    assert load_spec(spec_path).spec.quant.scheme == "fp8_block"
    quantization.update(dequantize=False, modules_to_not_convert=["lm_head"])
    spec_path.unlink()
    assert (
        init(capsys, "--from-hf", str(write_config(tmp_path, config)), "-o", str(spec_path))[0] == 0
    )
    assert "# quantization_config." not in spec_path.read_text(encoding="utf-8")


# --- configs moec cannot run: exit 2, one message naming the key, no spec written -------------


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"hidden_act": "gelu"}, 'hidden_act = "gelu"'),
        ({"model_type": "llama"}, 'model_type = "llama"'),
        ({"model_type": None}, "model_type: is missing from config.json (null)"),
        ({"hidden_size": None}, "hidden_size: is missing"),
        ({"quantization_config": {"quant_method": "awq"}}, "quantization_config.quant_method"),
        (
            {"quantization_config": {"quant_method": "not_mxfp8"}},
            "quantization_config.quant_method",
        ),
        ({"scoring_func": ""}, 'router.scoring_func = ""'),
        ({"topk_method": ""}, 'router.topk_method = ""'),
        ({"quantization_config": "fp8"}, "quantization_config"),
        ({"n_group": 7}, "router.n_group = 7"),
        ({"num_experts_per_tok": 300}, "model.num_experts_per_tok = 300"),
        ({"hidden_size": "7168"}, 'hidden_size = "7168": is a string, not an integer'),
        ({"routed_scaling_factor": -1.0}, "router.routed_scaling_factor = -1.0"),
        ({"routed_scaling_factor": 10**400}, "routed_scaling_factor = 1000"),  # over a float
        ({"model_type": "glm5_next_text", "swiglu_limit": 10**400}, "swiglu_limit = 1000"),
        (
            {"quantization_config": {**FP8, "weight_block_size": [128, 128, 128]}},
            "quant.weight_block",
        ),
        ({"quantization_config": {**FP8, "weight_block_size": []}}, "quant.weight_block"),
    ],
    ids=lambda value: json.dumps(value)[:40] if isinstance(value, dict) else None,
)
def test_init_rejects_what_moec_cannot_run(change, key, tmp_path, capsys):
    config_path = write_config(tmp_path, {**DEEPSEEK_V3, **change})
    spec_path = tmp_path / "spec.toml"
    code, out, err = init(capsys, "--from-hf", str(config_path), "-o", str(spec_path))
    assert code == 2
    assert out == ""
    assert "Traceback" not in err
    assert err.startswith(f"{config_path}")
    assert key in err
    assert not spec_path.exists()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "is not a JSON object"),
    ],
)
def test_init_rejects_bad_files(content, message, tmp_path, capsys):
    config_path = tmp_path / "config.json"
    config_path.write_text(content, encoding="utf-8")
    code, _, err = init(capsys, "--from-hf", str(config_path))
    assert code == 2
    assert message in err
    assert "Traceback" not in err


def test_init_missing_config(tmp_path, capsys):
    code, _, err = init(capsys, "--from-hf", str(tmp_path / "nope.json"))
    assert code == 2
    assert "cannot read" in err


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        (["--name", "class"], 'name = "class"'),
        (["--name", "x; import os"], 'name = "x; import os"'),
        (["--set", "name.x=1"], "name.x = 1: name is not a table"),
        (["--set", "quant.schme=bf16"], "did you mean scheme?"),
        (["--set", "nothing"], '--set = "nothing"'),
        (["--set", "parallel.ep_size=3"], "(--set): parallel.ep_size = 3"),
    ],
)
def test_init_rejects_bad_name_and_set(extra, key, tmp_path, capsys):
    config_path = write_config(tmp_path, DEEPSEEK_V3)
    code, out, err = init(capsys, "--from-hf", str(config_path), *extra)
    assert code == 2
    assert out == ""
    assert "Traceback" not in err
    assert err.startswith(str(config_path))
    assert key in err


def test_init_keeps_top_level_set_values(tmp_path, capsys):
    """A --set description reaches the written spec, non-ASCII and control characters included,
    as valid TOML."""
    text = "DeepSeek-V3 😀 «MoE»\tlayer\x7f"
    code, out, err = init(
        capsys,
        "--from-hf",
        str(write_config(tmp_path, DEEPSEEK_V3)),
        "--set",
        'description="DeepSeek-V3 😀 «MoE»\\tlayer\\u007f"',
    )
    assert (code, err) == (0, "")
    spec_path = tmp_path / "spec.toml"
    spec_path.write_text(out, encoding="utf-8")
    assert load_spec(spec_path).spec.description == text


def test_init_not_utf8(tmp_path, capsys):
    config_path = tmp_path / "config.json"
    config_path.write_bytes(b'{"model_type": "deepseek_v3\xff"}')
    code, _, err = init(capsys, "--from-hf", str(config_path))
    assert code == 2
    assert err.startswith(f"{config_path}: --from-hf: not UTF-8 text")


def test_init_replaces_its_own_spec_but_not_one_edited_since(tmp_path, capsys):
    """The README's way is init, then edit: running init again must not throw the edits away.
    An unedited spec init wrote is replaced; an edited one is the user's."""
    config_path = write_config(tmp_path, DEEPSEEK_V3)
    spec_path = tmp_path / "spec.toml"
    assert init(capsys, "--from-hf", str(config_path), "-o", str(spec_path))[0] == 0
    assert init(capsys, "--from-hf", str(config_path), "-o", str(spec_path))[0] == 0
    edited = spec_path.read_text() + 'description = "tuned by hand"\n'
    spec_path.write_text(edited)
    code, _, err = init(capsys, "--from-hf", str(config_path), "-o", str(spec_path))
    assert code == 2 and "was not written by moec" in err and "Traceback" not in err
    assert spec_path.read_text() == edited


@pytest.mark.parametrize(
    "change, note, spec_line",
    [
        (
            {"scoring_func": "softmax"},
            'scoring_func = "softmax" is not followed: transformers\' DeepseekV3TopkRouter always'
            ' scores with a sigmoid, so this layer\'s router.scoring_func = "sigmoid" (--set'
            " 'router.scoring_func=\"softmax\"' follows the config instead).",
            'scoring_func = "sigmoid"',
        ),
        (
            {"topk_method": "group_limited_greedy"},
            'topk_method = "group_limited_greedy" is not followed: transformers\'',
            'topk_method = "noaux_tc"',
        ),
    ],
    ids=["softmax", "group_limited_greedy"],
)
def test_init_follows_what_the_transformers_block_computes(
    change, note, spec_line, tmp_path, capsys
):
    """A routing key DeepseekV3's router never reads is written as the block computes it (the
    HF module is the oracle, and patch_model follows it the same way), with a comment naming
    the config's value and the --set that follows it instead."""
    config_path = write_config(tmp_path, {**DEEPSEEK_V3, **change})
    spec_path = tmp_path / "spec.toml"
    code, out, err = init(capsys, "--from-hf", str(config_path), "-o", str(spec_path))
    assert (code, err) == (0, "")
    text = spec_path.read_text()
    assert f"# {note}" in text
    assert f"\n{spec_line}\n" in text
    load_spec(spec_path)  # a valid spec


def test_init_refuses_a_malformed_value_the_block_ignores(tmp_path, capsys):
    """A value no spec takes is refused as written, even where the block never reads it."""
    config_path = write_config(tmp_path, {**DEEPSEEK_V3, "scoring_func": "softmaxx"})
    code, out, err = init(capsys, "--from-hf", str(config_path), "-o", str(tmp_path / "s.toml"))
    assert code == 2 and 'router.scoring_func = "softmaxx"' in err
    assert not (tmp_path / "s.toml").exists()


def test_a_set_key_is_not_followed_to_the_block(tmp_path, capsys):
    """--set names the value: no comment says the block's."""
    config_path = write_config(tmp_path, {**DEEPSEEK_V3, "topk_method": "greedy"})
    spec_path = tmp_path / "spec.toml"
    argv = ("--from-hf", str(config_path), "-o", str(spec_path), "--set", "router.n_group=1")
    argv += ("--set", "router.topk_group=1", "--set", 'router.topk_method="greedy"')
    code, out, err = init(capsys, *argv)
    assert (code, err) == (0, "")
    text = spec_path.read_text()
    assert 'topk_method = "greedy"\n' in text and "is not followed" not in text
