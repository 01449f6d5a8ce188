"""moec's layer inside transformers DeepSeek models (`moec.integrations.transformers`).

Tiny random DeepseekV3 / DeepseekV2 causal LMs (tests/hf_oracle.py, three layers: one dense, two
MoE) are saved with `save_pretrained` and loaded back with `from_pretrained`, as users do; one
copy is patched, the other is the reference.

Tolerances, float32 (u = 2**-24): a sum of n products computed in any order is within n*u of
the exact sum, relative to the sum of the magnitudes of its terms (Higham's gamma_n, first
order); two such evaluations differ by twice that.
- one MoE block on the same input: the patched and the transformers block sum the gate/up
  GEMM (H terms), the down GEMM (I) and the combine (K + shared) in other orders:
  2u (H + I + K + S) of the largest output.
- logits: every sum from the first MoE block to a logit can carry that difference on (layers
  of gain about one at these weight scales): 2u N of the largest logit, N the terms of all
  those sums (`summed_terms`). This holds while no top-k choice lies within rounding of a tie;
  if one did, the test would fail, not pass.
fp8 (u = 2**-4, e4m3's 3 mantissa bits): each rounding moves an element by at most u of
itself; the patched block rounds four operands the transformers block multiplies unrounded (x,
W13, the intermediate, W2): norm-wise relative error <= 4u = 2**-2 (observed about u). The
logits of a whole fp8 model have no such bound: a later block's top-k is not continuous in its
input, so a perturbed input may choose other experts; the model is checked to run.
"""

from __future__ import annotations

import gc
import weakref

import hf_oracle
import pytest
import torch

from moec import load_spec
from moec.errors import MoecError
from moec.integrations.transformers import MoecMoE, check_version, patch_model, spec_for_model

U32 = 2.0**-24
U_E4M3 = 2.0**-4
MODELS = {
    "v3": lambda: hf_oracle.deepseek_v3(layers=3),
    "v2": lambda: hf_oracle.deepseek_v2("group_limited_greedy", layers=3),
}


@pytest.fixture(scope="module", params=sorted(MODELS))
def saved(request, tmp_path_factory):
    return hf_oracle.saved_folder(tmp_path_factory, request.param, MODELS[request.param]())


@pytest.fixture(scope="module")
def saved_fp8(tmp_path_factory):
    """A V3 model whose dims hold whole 128-wide fp8 blocks."""
    config = hf_oracle.deepseek_v3(hidden=128, intermediate=128, layers=3)
    return hf_oracle.saved_folder(tmp_path_factory, "v3_128", config)


def _load(folder):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def _spec_from_hf(folder, *sets: str) -> str:
    """The README's flow: `moec init --from-hf config.json -o spec.toml`, then edits."""
    return hf_oracle.init_spec(folder, *(arg for item in sets for arg in ("--set", item)))


def _moe_names(model) -> list[str]:
    return [f"model.layers.{i}.mlp" for i in range(1, model.config.num_hidden_layers)]


def _block_io(model, tokens) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """{block name: (its input, its output)} of the model's MoE blocks on `tokens`."""
    seen = {}
    hooks = [
        model.get_submodule(name).register_forward_hook(
            lambda _, args, out, name=name: seen.__setitem__(name, (args[0], out))
        )
        for name in _moe_names(model)
    ]
    with torch.no_grad():
        model(tokens)
    for hook in hooks:
        hook.remove()
    return seen


def summed_terms(config, seq_len: int) -> int:
    """Terms of all the sums from the first MoE block's input to a logit."""
    hidden = config.hidden_size
    moe = hidden + config.moe_intermediate_size
    moe += config.num_experts_per_tok + config.n_shared_experts  # combine
    attention = (
        3 * hidden  # input norm, q_a_proj, kv_a_proj
        + 2 * config.q_lora_rank  # q_a norm, q_b_proj
        + 2 * config.kv_lora_rank  # kv_a norm, kv_b_proj
        + config.qk_nope_head_dim
        + config.qk_rope_head_dim  # scores
        + 2 * seq_len  # softmax, weighted values
        + config.num_attention_heads * config.v_head_dim  # o_proj
        + hidden  # post-attention norm
    )
    later_layers = config.num_hidden_layers - config.first_k_dense_replace - 1
    return moe + later_layers * (attention + moe) + 2 * hidden  # final norm, lm_head


def test_every_block_replaced_and_released(saved, cache_dir):
    model = _load(saved)
    blocks = [weakref.ref(model.get_submodule(name)) for name in _moe_names(model)]
    patch_model(model, _spec_from_hf(saved), cache_dir=cache_dir)
    gc.collect()
    assert all(block() is None for block in blocks), "a transformers block is still held"
    patched = [model.get_submodule(name) for name in _moe_names(model)]
    assert all(isinstance(block, MoecMoE) for block in patched)
    assert len({id(block.layer) for block in patched}) == len(patched)
    assert not [name for name in model.state_dict() if "gate_up_proj" in name]


def test_blocks_equal_transformers_within_float32_bound(saved, cache_dir):
    reference, model = _load(saved), _load(saved)
    patch_model(model, _spec_from_hf(saved), cache_dir=cache_dir)
    config = model.config
    terms = config.hidden_size + config.moe_intermediate_size
    terms += config.num_experts_per_tok + config.n_shared_experts
    for name, (x, expected) in _block_io(reference, hf_oracle.tokens()).items():
        with torch.no_grad():
            out = model.get_submodule(name)(x)
        assert out.shape == expected.shape == x.shape
        error = (out - expected).abs().max().item()
        assert error <= 2 * U32 * terms * expected.abs().max().item(), name


def test_logits_equal_transformers_within_float32_bound(saved, cache_dir):
    reference, model = _load(saved), _load(saved)
    patch_model(model, _spec_from_hf(saved), cache_dir=cache_dir)
    tokens = hf_oracle.tokens(1)
    with torch.no_grad():
        expected, logits = reference(tokens).logits, model(tokens).logits
    bound = 2 * U32 * summed_terms(model.config, tokens.shape[1])
    assert (logits - expected).abs().max().item() <= bound * expected.abs().max().item()


def test_greedy_generate_gives_the_same_tokens(saved, cache_dir):
    reference, model = _load(saved), _load(saved)
    patch_model(model, _spec_from_hf(saved), cache_dir=cache_dir)
    tokens = hf_oracle.tokens(2)
    kwargs = dict(attention_mask=torch.ones_like(tokens), max_new_tokens=8, do_sample=False)
    expected = reference.generate(tokens, **kwargs)
    assert torch.equal(model.generate(tokens, **kwargs), expected)


@pytest.mark.parametrize("scheme", ["fp8_block", "fp8_per_tensor", "mxfp8"])
def test_fp8_blocks_within_e4m3_bound(saved_fp8, cache_dir, scheme):
    reference, model = _load(saved_fp8), _load(saved_fp8)
    patch_model(model, overrides=[f"quant.scheme={scheme}"], cache_dir=cache_dir)
    for name, (x, expected) in _block_io(reference, hf_oracle.tokens(3)).items():
        with torch.no_grad():
            out = model.get_submodule(name)(x)
        error = ((out - expected).norm() / expected.norm()).item()
        assert error <= 4 * U_E4M3, name
    with torch.no_grad():
        assert torch.isfinite(model(hf_oracle.tokens(4)).logits).all()


def test_spec_that_does_not_describe_the_model_is_refused(saved, cache_dir):
    with pytest.raises(MoecError) as error:
        patch_model(_load(saved), "examples/tiny-cpu.toml", cache_dir=cache_dir)
    report = error.value.report()
    assert (
        "tiny-cpu.toml:7: model.hidden_size = 256: does not match the model (its config has "
        "hidden_size = 64)" in report
    )
    assert (
        'tiny-cpu.toml:30: target.dtype = "bfloat16": the model\'s MoE weights are float32'
        in report
    )
    with pytest.raises(MoecError, match='quant.checkpoint = "quantized": the model holds float32'):
        spec = _spec_from_hf(saved, "quant.scheme=fp8_per_tensor", "quant.checkpoint=quantized")
        patch_model(_load(saved), spec, cache_dir=cache_dir)


def test_overrides_of_a_loaded_spec_are_refused(saved, cache_dir):
    with pytest.raises(MoecError, match="apply to a spec path or to the model's config"):
        loaded = load_spec(_spec_from_hf(saved))
        patch_model(_load(saved), loaded, ["quant.scheme=bf16"], cache_dir=cache_dir)


def test_weights_that_do_not_load_name_the_block(cache_dir):
    from transformers import AutoModelForCausalLM

    config = hf_oracle.deepseek_v2("greedy", layers=2)
    config.mlp_bias = True  # shared experts with biases: no DeepSeek checkpoint has them
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.config.mlp_bias = False  # a config that says so is refused by key, before any load
    with pytest.raises(MoecError, match=r"model.layers.1.mlp: cannot load the weights:\n.*bias"):
        patch_model(model, overrides=["target.device=cpu"], cache_dir=cache_dir)


def test_refuses_other_transformers_versions_and_models():
    for version in ("4.57.1", "5.12.1", "6.0.0", "dev"):
        with pytest.raises(MoecError, match=r"transformers = .*: is not a version moec's drop-in"):
            check_version(version)
    for version in ("5.13.0", "5.17.0", "5.24.0", "5.30.0.dev0"):
        check_version(version)
    with pytest.raises(MoecError, match="has no DeepSeek MoE block to replace"):
        patch_model(torch.nn.Linear(4, 4))


@pytest.mark.parametrize(
    ("capability", "arch"),
    [((9, 0), "sm90"), ((10, 3), "sm100"), ((8, 6), "sm80"), ((8, 9), "sm89")],
)
def test_spec_from_the_config_targets_the_gpu_it_finds(monkeypatch, capability, arch):
    """On CUDA the spec names the newest architecture moec knows that the GPU has."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: capability)
    config = hf_oracle.deepseek_v3()
    loaded = spec_for_model(config, torch.bfloat16, torch.device("cuda", 0), ["name=on_gpu"])
    target = loaded.spec.target
    assert (target.device, target.arch, target.dtype) == ("cuda", arch, "bfloat16")
    assert loaded.spec.quant.checkpoint == "bf16" and loaded.spec.name == "on_gpu"


def test_spec_from_the_config_refuses_a_gpu_older_than_sm80(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: (7, 5))
    with pytest.raises(MoecError, match="target.arch: the model's GPU is sm75, older than"):
        spec_for_model(hf_oracle.deepseek_v3(), torch.bfloat16, torch.device("cuda", 0))
