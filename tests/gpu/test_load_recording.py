"""The load counter (parallel.record_load) of the Triton layer at DeepSeek-V3 dims, captured in a
CUDA graph: the capture succeeds (a host sync inside it would fail it), each replay adds one
forward's histogram of the selected experts, and a reset between replays starts again from
zero; with redundant experts (random replicas) the counts stay per logical expert.

The histogram of one forward is taken from the package's own selection stage on the same
input (bincount of its top-k ids), so the comparison is exact; that the selection equals the
torch reference is tests/gpu/test_layer.py's job, that the counter equals an independent
router's histogram tests/test_eplb.py's and tests/test_recording_ranks.py's."""

from __future__ import annotations

import importlib
import inspect

import pytest
import torch

from moec.runtime import cuda_graph

from .specs import HIDDEN, SCHEMES, V3

RECORDED = [*SCHEMES["fp8_block"], "experts.layout=contiguous", "experts.gemm_backend=triton",
            "experts.shared_experts=separate", "parallel.record_load=true"]  # fmt: skip
CASES = {
    "plain": RECORDED,
    "replicas": [*RECORDED, "parallel.redundant_experts=8", "parallel.replica_choice=random"],
}
EXPERTS, TOP_K = 256, 8


@pytest.fixture(scope="module")
def recorded(load_layer):
    """recorded(case) -> (layer, its stages module); the last one built is kept (11-12 GB)."""
    built = {}

    def get(case):
        if case not in built:
            built.clear()
            torch.cuda.empty_cache()
            package = load_layer(V3, *CASES[case])
            stages = importlib.import_module(f"{package.__name__}.stages")
            built[case] = (package.MoELayer(device="cuda").random_(0), stages)
        return built[case]

    yield get
    built.clear()
    torch.cuda.empty_cache()


def _histogram(layer, stages, x: torch.Tensor) -> torch.Tensor:
    """The experts the layer's selection stage chooses for x, counted: [E] int64 (the stage
    takes x, then the layer's tensors of its parameters' names, as the forward calls it)."""
    names = list(inspect.signature(stages.select).parameters)[1:]
    _, ids = stages.select(x, *(getattr(layer, name) for name in names))
    assert ids.shape == (x.shape[0], TOP_K)
    return torch.bincount(ids.flatten().long(), minlength=EXPERTS)


@pytest.mark.parametrize("tokens", [1, 64])
@pytest.mark.parametrize("case", list(CASES))
def test_replays_add_one_forward_each(recorded, case, tokens):
    layer, stages = recorded(case)
    gen = torch.Generator("cuda").manual_seed(tokens)
    x = torch.randn(tokens, HIDDEN, device="cuda", generator=gen).bfloat16()
    once = _histogram(layer, stages, x)
    assert int(once.sum()) == tokens * TOP_K
    layer.reset_expert_load()
    eager = layer(x)
    assert torch.equal(layer.expert_load(), once)
    layer.reset_expert_load()
    replay, out = cuda_graph.capture(lambda: layer(x), warmup=1)
    torch.cuda.synchronize()
    assert torch.equal(layer.expert_load(), once)  # the warm-up ran; the capture did not
    layer.reset_expert_load()
    for _ in range(3):
        replay()
    assert torch.equal(layer.expert_load(), 3 * once)
    assert torch.equal(out, eager)
    layer.reset_expert_load()  # in place: the graph keeps adding to the same counter
    assert int(layer.expert_load().sum()) == 0
    replay()
    replay()
    assert torch.equal(layer.expert_load(), 2 * once)
    assert layer.expert_load().device == x.device and not layer.gate_counters.any()
