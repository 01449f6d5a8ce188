"""router.rounding end to end: `moec init --from-hf` routes in fp32 and names, in a comment, the
rounding of the model type's transformers router; `patch_model` without a spec takes that
rounding, so that a bfloat16 model routes every token as before patching (DeepSeek-V4: logits,
scores and weights in bf16; Qwen3-MoE: bf16 logits); a spec given keeps its own.

Bound, bfloat16 (one rounding: 2**-8 of the largest output): transformers rounds the gate/up
and down outputs, the activation, each weighted expert row, the K - 1 additions of their sum
and the shared expert's add; moec rounds once. A token routed to another expert is off by
10-35% of the largest output (the fp32 router below), far outside (K + 6) * 2**-8.
"""

from __future__ import annotations

import hf_oracle
import pytest
import torch

import moec
from moec.integrations.transformers import patch_model
from moec.spec import load_spec

TOKENS = 2048


def _qwen3_moe():
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=96,
        moe_intermediate_size=32,
        num_experts=16,
        num_experts_per_tok=4,
        norm_topk_prob=True,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=64,
    )


MODELS = {
    "deepseek_v4": (lambda: hf_oracle.deepseek_v4(layers=1), "all"),
    "qwen3_moe": (_qwen3_moe, "logits"),
    "deepseek_v3": (lambda: hf_oracle.deepseek_v3(layers=2), "none"),
}


@pytest.fixture(scope="module", params=sorted(MODELS))
def saved(request, tmp_path_factory):
    config, rounding = MODELS[request.param]
    return (
        request.param,
        rounding,
        hf_oracle.saved_folder(tmp_path_factory, request.param, config()),
    )


def _bf16_model(folder):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(folder)
    return hf_oracle.causal_lm_class(config).from_pretrained(folder, dtype=torch.bfloat16).eval()


def _row_errors(got: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    """Each token's largest error over the largest output."""
    return (got.float() - expected.float()).abs().amax(dim=-1) / expected.float().abs().max()


def test_init_routes_in_fp32_and_names_the_rounding(saved):
    model_type, rounding, folder = saved
    path = hf_oracle.init_spec(folder)
    assert load_spec(path).spec.router.rounding == "none"
    text = open(path).read()
    if rounding == "none":
        assert "router.rounding" not in text
    else:
        assert f"--set router.rounding={rounding} rounds as transformers does" in text
        rounded = load_spec(hf_oracle.init_spec(folder, "--set", f"router.rounding={rounding}"))
        assert rounded.spec.router.rounding == rounding
        assert "router.rounding" not in open(path).read()  # set: no comment


def test_a_patched_bf16_model_routes_as_transformers(saved, cache_dir):
    model_type, rounding, folder = saved
    reference = _bf16_model(folder)
    name = hf_oracle.moe_names(reference)[-1]
    block = reference.get_submodule(name)
    x = torch.randn(TOKENS, 64, generator=torch.Generator().manual_seed(2)).bfloat16()
    expected = hf_oracle.oracle(block, x)
    model = patch_model(_bf16_model(folder), cache_dir=cache_dir)
    with torch.no_grad():
        got = model.get_submodule(name)(x.unsqueeze(0)).squeeze(0)
    top_k = 4
    assert _row_errors(got, expected).max() <= (top_k + 6) * 2**-8


def test_the_fp32_router_routes_a_bf16_v4_otherwise(tmp_path, cache_dir):
    """The same bf16 DeepSeek-V4 block with init's spec (rounding = "none", fp32 routing): some
    tokens get other experts, beyond the bound above. patch_model takes that spec as given."""
    hf_oracle.save_model(hf_oracle.deepseek_v4(layers=1), tmp_path)
    reference = _bf16_model(tmp_path)
    name = hf_oracle.moe_names(reference)[0]
    block = reference.get_submodule(name)
    spec = hf_oracle.init_spec(tmp_path, "--set", "target.dtype=bfloat16")
    layer = moec.load(spec, cache_dir=cache_dir).MoELayer(device="cpu")
    layer.load_weights(tmp_path / "model.safetensors", "model.layers.0.ffn.")  # DeepSeek's names
    x = torch.randn(TOKENS, 64, generator=torch.Generator().manual_seed(2)).bfloat16()
    expected = hf_oracle.oracle(block, x)
    with torch.no_grad():
        errors = _row_errors(layer(x), expected)
    assert errors.max() > 0.05
    model = patch_model(_bf16_model(tmp_path), spec={"moe": spec}, cache_dir=cache_dir)
    with torch.no_grad():
        patched = model.get_submodule(name)(x.unsqueeze(0)).squeeze(0)
    assert _row_errors(patched, expected).max() > 0.05  # the spec's fp32 routing, as given


def test_the_plan_rounds_nothing_in_a_float32_layer(tmp_path):
    from moec.cli import main

    assert main(["explain", "examples/tiny-cpu.toml", "--set", "router.rounding=all",
                 "--set", "target.dtype=float32", "--format", "json",
                 "-o", str(tmp_path / "plan.json")]) == 0  # fmt: skip
    import json

    plan = json.loads((tmp_path / "plan.json").read_text())
    (select,) = [stage for stage in plan["stages"] if stage["kind"] == "select"]
    assert select["choices"]["rounding"] == "none"
    (decision,) = [d for d in plan["decisions"] if d["what"] == "router rounding"]
    assert decision["choice"] == "none" and "float32" in decision["reason"]
