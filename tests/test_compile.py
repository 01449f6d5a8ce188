"""torch.compile of the generated layer and of a patched transformers model.

Under torch.compile the generated `MoELayer.forward` is one custom op (`moec::<package>_forward`,
its fake giving the output's shape and dtype), as serving engines treat an MoE layer: the graph
traces around it without a break (fullgraph=True) and the op runs the eager computation, so the
compiled outputs equal the eager ones bit for bit. A recording backend checks the op is in the
graph once per layer; "aot_eager" checks fake tensors and functionalization; one inductor run
(slow to compile on two cores) checks the layer with dynamic token counts.
"""

from __future__ import annotations

import hf_oracle
import pytest
import torch

from moec.cli import main
from moec.integrations.transformers import patch_model


def _recording(graphs: list):
    """A torch.compile backend that keeps each FX graph Dynamo gives it, then runs aot_eager."""
    aot_eager = torch._dynamo.lookup_backend("aot_eager")

    def backend(gm, example_inputs):
        graphs.append(gm)
        return aot_eager(gm, example_inputs)

    return backend


def _moe_calls(graphs: list) -> int:
    """How many nodes of `graphs` call a moec layer's custom op."""
    return sum(
        1
        for gm in graphs
        for node in gm.graph.nodes
        if node.op == "call_function" and str(node.target).startswith("moec.")
    )


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_layer_compiles_fullgraph_equal_to_eager(load_layer):
    layer = load_layer("examples/tiny-cpu.toml").MoELayer().random_(0)
    x = torch.randn(9, 256, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    expected = layer(x)
    graphs = []
    compiled = torch.compile(layer, fullgraph=True, backend=_recording(graphs))
    assert torch.equal(compiled(x), expected)
    assert _moe_calls(graphs) == 1


def test_layer_under_inductor_with_other_token_counts(load_layer):
    layer = load_layer("examples/tiny-cpu.toml").MoELayer().random_(0)
    compiled = torch.compile(layer, fullgraph=True, dynamic=True)
    for tokens in (9, 1, 0):
        x = torch.randn(tokens, 256, generator=torch.Generator().manual_seed(tokens))
        x = x.to(torch.bfloat16)
        out = compiled(x)
        assert out.shape == x.shape and out.dtype == torch.bfloat16
        assert torch.equal(out, layer(x)), tokens


def test_patched_model_compiles_fullgraph_equal_to_eager(tmp_path, cache_dir):
    from transformers import AutoModelForCausalLM

    hf_oracle.save_model(hf_oracle.deepseek_v3(layers=3), tmp_path)
    spec = tmp_path / "spec.toml"
    args = ["init", "--from-hf", str(tmp_path / "config.json"), "-o", str(spec)]
    assert main([*args, "--set", "target.device=cpu", "--set", "target.dtype=float32"]) == 0
    model = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    patch_model(model, str(spec), cache_dir=cache_dir)
    tokens = torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(0))
    graphs = []
    compiled = torch.compile(model, fullgraph=True, backend=_recording(graphs))
    with torch.no_grad():
        expected = model(tokens).logits
        logits = compiled(tokens).logits
    assert torch.equal(logits, expected)
    assert _moe_calls(graphs) == model.config.num_hidden_layers - 1  # the first layer is dense
