"""Hash routing (router.topk_method = "hash", DeepSeek-V4's hash_moe layers): the experts of a
token are tid2eid[token_id], a table loaded from the checkpoint; the forward takes the token
ids beside x. Against transformers' DeepseekV4HashRouter block (a tiny random DeepSeek-V4 saved
with save_pretrained, its tid2eid random), in float32 within the bound of
test_integration_families.py; the Triton package (GEMMs, interpreted) against the torch one.
"""

from __future__ import annotations

import re

import hf_oracle
import pytest
import torch
from test_integration_families import U32, _block_bound, _load, summed_terms

import moec
from moec.cli import main
from moec.errors import MoecError
from moec.integrations.transformers import MoecMoE, patch_model

PREFIX = "model.layers.0.ffn."
"""The hash layer's tensors as transformers saves DeepSeek-V4 (its checkpoints' names)."""


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hf_v4_hash")
    hf_oracle.save_model(hf_oracle.deepseek_v4(layers=2, hash_layers=1), folder)
    return folder


@pytest.fixture(scope="module")
def hash_layer(saved, cache_dir):
    """The spec init writes for the hash_moe layers, built, loaded from model.safetensors."""
    package = moec.load(hf_oracle.init_spec(saved, "--layer-type", "hash_moe"), cache_dir=cache_dir)
    return package.MoELayer(device="cpu").load_weights(saved / "model.safetensors", PREFIX)


def _ids(count: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 64, (count,), generator=torch.Generator().manual_seed(seed))


def test_init_writes_a_hash_spec(saved, capsys):
    spec = moec.load_spec(hf_oracle.init_spec(saved, "--layer-type", "hash_moe")).spec
    assert (spec.router.topk_method, spec.model.vocab_size) == ("hash", 64)
    assert (spec.router.scoring_func, spec.router.norm_topk_prob) == ("sqrtsoftplus", True)
    capsys.readouterr()
    assert main(["init", "--from-hf", str(saved / "config.json")]) == 2
    assert "holds 1 hash_moe and 1 moe layers" in capsys.readouterr().err


def test_hash_layer_equals_transformers_block(saved, hash_layer):
    reference = _load(saved)
    block = reference.model.layers[0].mlp
    assert block.is_hash
    x = torch.randn(13, 64, generator=torch.Generator().manual_seed(3))
    ids = _ids(13, 4)
    with torch.no_grad():
        expected = block(x.unsqueeze(0), input_ids=ids.unsqueeze(0)).squeeze(0)
    error = (hash_layer(x, ids) - expected).abs().max().item()
    assert error <= _block_bound(reference.config) * expected.abs().max().item()


def test_repeated_ids_choose_alike(hash_layer, saved):
    """A batch of one token id repeated: every row takes the same experts (the table's row of
    that id), so equal rows give equal outputs, up to the order of the GEMMs' sums."""
    x = torch.randn(1, 64, generator=torch.Generator().manual_seed(5)).expand(9, 64).contiguous()
    ids = torch.full((9,), 7)
    out = hash_layer(x, ids)
    bound = _block_bound(_load(saved).config) * out.abs().max().item()
    assert (out - out[:1]).abs().max().item() <= bound
    other = hash_layer(x, torch.full((9,), 8))  # another row of the table: other experts
    assert (other - out).abs().max().item() > 100 * bound
    table = _load(saved).model.layers[0].mlp.gate.tid2eid
    assert torch.equal(hash_layer.tid2eid[7].long(), table[7])


@pytest.mark.parametrize(
    ("ids", "message"),
    [
        (None, "hash-routed: forward(x, token_ids) takes the token id of each row of x"),
        (torch.tensor([1, 64, 2]), "token id 64 is outside the hash table's 64 ids"),
        (torch.tensor([1, -1, 2]), "token id -1 is outside the hash table's 64 ids"),
        (torch.tensor([1.0, 2.0, 3.0]), "token_ids must be [3] int64 or int32 ids"),
        (torch.tensor([1, 2]), "token_ids must be [3] int64 or int32 ids"),
    ],
)
def test_token_ids_are_checked(hash_layer, ids, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        hash_layer(torch.randn(3, 64), ids)


def test_a_table_id_outside_the_experts_is_refused(hash_layer, saved):
    from safetensors.torch import load_file

    tensors = {
        name.removeprefix(PREFIX): tensor
        for name, tensor in load_file(saved / "model.safetensors").items()
        if name.startswith(PREFIX)
    }
    tensors["gate.tid2eid"] = tensors["gate.tid2eid"].clone()
    tensors["gate.tid2eid"][3, 0] = 16
    with pytest.raises(ValueError, match=r"gate.tid2eid: 1 ids outside the experts 0..15"):
        hash_layer.load_weights(tensors)
    tensors["gate.tid2eid"] = tensors["gate.tid2eid"].float()
    with pytest.raises(ValueError, match="expected int64 or int32 expert ids"):
        hash_layer.load_weights(tensors)


def test_triton_layer_equals_torch_layer(saved, hash_layer, cache_dir):
    """The Triton package (GEMMs and elementwise stages interpreted; the selection a torch
    gather in both) on the same weights and ids: the same float32 sums in other orders."""
    spec = hf_oracle.init_spec(
        saved, "--layer-type", "hash_moe", "--set", "experts.gemm_backend=triton"
    )
    package = moec.load(spec, cache_dir=cache_dir)
    layer = package.MoELayer(device="cpu").load_weights(saved / "model.safetensors", PREFIX)
    x, ids = torch.randn(6, 64, generator=torch.Generator().manual_seed(6)), _ids(6, 7)
    expected = hash_layer(x, ids)
    error = (layer(x, ids) - expected).abs().max().item()
    assert error <= _block_bound(_load(saved).config) * expected.abs().max().item()


def test_patched_v4_with_hash_layers_equals_transformers(saved, cache_dir):
    reference, model = _load(saved), _load(saved)
    patch_model(model, cache_dir=cache_dir)
    patched = [model.get_submodule(f"model.layers.{i}.mlp") for i in range(2)]
    assert all(isinstance(block, MoecMoE) for block in patched)
    assert [block.hashed for block in patched] == [True, False]
    tokens = hf_oracle.tokens(8)
    with torch.no_grad():
        expected, logits = reference(tokens).logits, model(tokens).logits
    bound = 2 * U32 * summed_terms(model.config, tokens.shape[1])
    assert (logits - expected).abs().max().item() <= bound * expected.abs().max().item()
    kwargs = dict(attention_mask=torch.ones_like(tokens), max_new_tokens=6, do_sample=False)
    assert torch.equal(model.generate(tokens, **kwargs), reference.generate(tokens, **kwargs))


def test_one_spec_for_two_layer_types_is_refused(saved, cache_dir):
    spec = hf_oracle.init_spec(saved, "--layer-type", "moe")
    with pytest.raises(MoecError, match="describes one MoE layer type, and the model has 1 moe"):
        patch_model(_load(saved), spec, cache_dir=cache_dir)
    with pytest.raises(MoecError, match=r"names the layer types \['moe'\], and the model has"):
        patch_model(_load(saved), {"moe": spec}, cache_dir=cache_dir)


def test_explain_shows_the_token_ids_input(saved, capsys):
    spec = hf_oracle.init_spec(saved, "--layer-type", "hash_moe")
    capsys.readouterr()
    assert main(["explain", spec, "--tokens", "1"]) == 0
    text = capsys.readouterr().out
    assert "out  token_ids     i64[T]" in text
    assert "in   token_ids     i64[T]  <- input" in text
    assert "w    tid2eid       i32[V, Kr]" in text
    assert "top-k = hash table, torch: each token's experts are tid2eid[token_id]" in text


def test_hash_layer_compiles_fullgraph_equal_to_eager(hash_layer):
    """torch.compile traces a hash layer as one custom op taking x and the token ids."""
    torch._dynamo.reset()
    x = torch.randn(7, 64, generator=torch.Generator().manual_seed(9))
    ids = _ids(7, 10)
    expected = hash_layer(x, ids)
    compiled = torch.compile(hash_layer, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(x, ids), expected)
    assert not torch.equal(compiled(x, _ids(7, 11)), expected)  # the ids reach the op
    torch._dynamo.reset()


def test_a_compiled_hash_layer_refuses_missing_ids_and_compiles_after(hash_layer):
    """The checks run inside the custom op: a compiled call without token ids raises the
    layer's own error, and does not leave Dynamo skipping forward for a later fullgraph."""
    torch._dynamo.reset()
    x = torch.randn(7, 64, generator=torch.Generator().manual_seed(9))
    ids = _ids(7, 10)
    with pytest.raises(ValueError, match="is hash-routed: forward"):
        torch.compile(hash_layer, backend="aot_eager")(x)
    compiled = torch.compile(hash_layer, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(x, ids), hash_layer(x, ids))
    torch._dynamo.reset()
