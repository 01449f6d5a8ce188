"""`moec init --from-hf` follows what transformers' MoE block computes for a config's
swiglu_limit.

A DeepSeek-V3 config.json that carries swiglu_limit: transformers' DeepseekV3MoE never reads
it (nor does DeepSeek's own V3 code), and patch_model followed the block, while init wrote a
clamped activation, so the spec init wrote computed otherwise than the model it came from
(and patch_model refused it). Now init writes silu and says, in a comment, which key it did not
follow and why; patch_model(router_keys="config") still clamps, as SGLang's runner does.

Tolerances, float32 (u = 2**-24), as in test_hf_more_families.py: one block, 2u (H + I + K +
S) of its largest output.
"""

from __future__ import annotations

import warnings

import hf_oracle
import pytest
import torch
from test_hf_more_families import _checkpoint
from test_integration_families import _block_bound

import moec
from moec.integrations.transformers import patch_model, spec_for_model
from moec.spec import load_spec

TORCH = "experts.gemm_backend=torch"


@pytest.fixture(scope="module")
def clamped_v3(tmp_path_factory):
    """A tiny DeepSeek-V3 saved with swiglu_limit 1.0, inside the pre-activations' range (about
    N(0, 1)): a clamp would act."""
    config = hf_oracle.deepseek_v3()
    config.swiglu_limit = 1.0
    return hf_oracle.saved_folder(tmp_path_factory, "v3_swiglu_limit", config)


def _load(folder):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def test_init_on_a_v3_config_with_swiglu_limit_computes_the_v3_block(clamped_v3, cache_dir):
    """init wrote silu_clamped (the layer 'clamped where transformers does not', its output
    off); now silu, as DeepseekV3MoE computes, with a comment naming the key; patch_model takes
    that spec without a word and leaves the model computing what it did."""
    spec = hf_oracle.init_spec(clamped_v3, "--set", TORCH)
    text = open(spec).read()
    assert "# swiglu_limit = 1.0 is not followed: transformers' deepseek_v3 MoE block" in text
    loaded = load_spec(spec).spec
    assert loaded.activation.kind == "silu"
    reference = _load(clamped_v3)
    name = hf_oracle.moe_names(reference)[0]
    source, prefix = _checkpoint(clamped_v3, name)
    layer = moec.load(spec, cache_dir=cache_dir).MoELayer(device="cpu").load_weights(source, prefix)
    x = 3 * torch.randn(11, loaded.model.hidden_size, generator=torch.Generator().manual_seed(1))
    expected = hf_oracle.oracle(reference.get_submodule(name), x)
    error = (layer(x) - expected).abs().max().item()
    assert error <= _block_bound(loaded.model) * expected.abs().max().item()

    model = _load(clamped_v3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no RouterKeysIgnored: the spec agrees with the block
        patch_model(model, spec, cache_dir=cache_dir)
    assert type(model.get_submodule(name)).__name__ == "MoecMoE"


def test_router_keys_config_still_clamps_as_sglang_does(clamped_v3):
    """patch_model(router_keys="config") reads the config as SGLang's runner does: clamped."""
    config = _load(clamped_v3).config
    loaded = spec_for_model(config, torch.float32, torch.device("cpu"))
    assert (loaded.spec.activation.kind, loaded.spec.activation.swiglu_limit) == (
        "silu_clamped",
        1.0,
    )


def test_a_swiglu_limit_nobody_reads_is_not_checked(tmp_path, capsys):
    """A Kimi-K2.5 (DeepSeek-V3 text model) whose text_config writes swiglu_limit as a string:
    init refused it ('is a string'), though no block reads it; now the spec is silu and the
    comment names the key where it is (without a value that is no number)."""
    from test_spec_hf import init, write_config
    from test_spec_hf_families import KIMI_K25

    config = {**KIMI_K25, "text_config": {**KIMI_K25["text_config"], "swiglu_limit": "10"}}
    spec_path = tmp_path / "spec.toml"
    code, _, err = init(
        capsys, "--from-hf", str(write_config(tmp_path, config)), "-o", str(spec_path)
    )
    assert (code, err) == (0, "")
    assert "# text_config.swiglu_limit is not followed: " in spec_path.read_text()
    assert load_spec(spec_path).spec.activation.kind == "silu"
