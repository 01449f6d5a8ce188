"""patch_model given what it cannot patch: not a model, a model patched already, a block whose
weights do not load after others were replaced (the error says which were, the model runs)."""

from __future__ import annotations

import hf_oracle
import pytest
import torch

from moec.errors import MoecError
from moec.integrations.transformers import MoecMoE, patch_model


def _model(layers: int = 4):
    config = hf_oracle.deepseek_v3(layers=layers)
    torch.manual_seed(0)
    model = hf_oracle.causal_lm_class(config).from_config(config, torch_dtype=torch.float32)
    return model.eval()


@pytest.mark.parametrize("model", [None, 3, "model", {"config": {}}])
def test_not_a_transformers_model_is_a_type_error(model):
    with pytest.raises(TypeError, match="model must be a transformers model"):
        patch_model(model)


def test_a_patched_model_is_called_patched(cache_dir):
    model = _model(layers=3)
    patch_model(model, cache_dir=cache_dir)
    assert sum(isinstance(m, MoecMoE) for m in model.modules()) == 2
    with pytest.raises(MoecError, match="already patched: its 2 MoE block") as error:
        patch_model(model, cache_dir=cache_dir)
    assert "has no DeepSeek MoE block" not in str(error.value)


def test_a_block_that_does_not_load_names_the_blocks_replaced_before_it(cache_dir):
    model = _model(layers=4)  # MoE blocks in layers 1-3
    with torch.no_grad():
        model.model.layers[2].mlp.experts.down_proj[0, 0, 0] = float("nan")
    tokens = hf_oracle.tokens(1)
    with pytest.raises(MoecError) as error:
        patch_model(model, cache_dir=cache_dir)
    message = str(error.value)
    assert "model.layers.2.mlp" in message
    assert "1 block(s) replaced before this one (model.layers.1.mlp)" in message
    assert "the model still runs" in message
    kinds = [type(model.model.layers[i].mlp).__name__ for i in (1, 2, 3)]
    assert kinds == ["MoecMoE", "DeepseekV3MoE", "DeepseekV3MoE"]
    with torch.no_grad():
        assert model(tokens).logits.shape[:2] == tokens.shape  # runs (NaN where layer 2 is)


def test_a_first_block_that_does_not_load_leaves_the_model_unchanged(cache_dir):
    model = _model(layers=3)
    with torch.no_grad():
        model.model.layers[1].mlp.experts.gate_up_proj[0, 0, 0] = float("inf")
    with pytest.raises(MoecError, match="is unchanged: no block was replaced"):
        patch_model(model, cache_dir=cache_dir)
    assert not any(isinstance(m, MoecMoE) for m in model.modules())


@pytest.mark.parametrize("odd_layer", [1, 2])
def test_blocks_in_another_dtype_are_named_before_any_is_replaced(odd_layer, cache_dir):
    """One MoE block's experts in float16, the others float32 (the model runs so unpatched):
    the layers were all built for the first block's dtype, rounding the others' weights, and
    then refused the float32 hidden states at every forward. Now each block whose dtype
    differs from the first's is named, and nothing is replaced."""
    model = _model(layers=4)  # MoE blocks in layers 1-3
    model.model.layers[odd_layer].mlp.experts.to(torch.float16)
    tokens = hf_oracle.tokens(1)
    with torch.no_grad():
        before = model(input_ids=tokens).logits
    with pytest.raises(MoecError) as error:
        patch_model(model, cache_dir=cache_dir)
    text = str(error.value)
    differ = [2, 3] if odd_layer == 1 else [odd_layer]  # from the first block, layer 1's
    named = [i for i in (1, 2, 3) if f"model.layers.{i}.mlp.experts.gate_up_proj" in text]
    assert named == differ, text
    assert "for one dtype and device kind" in text and "Traceback" not in text
    assert not any(isinstance(m, MoecMoE) for m in model.modules())
    with torch.no_grad():
        assert torch.equal(model(input_ids=tokens).logits, before)
