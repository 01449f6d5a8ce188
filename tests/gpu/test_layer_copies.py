"""Copies of a layer on the GPU: a float8 layer through pickle, and a layer whose shared experts
ran on their second CUDA stream (which pickle refuses) through deepcopy, pickle and torch.save.
Each copy computes the same bits as the layer, eagerly and replayed from a CUDA graph, with a
stream of its own. The CPU suite checks the same with a stand-in for the stream
(tests/test_hostile_corpus4_layer.py); here the stream and the e4m3 weights are real."""

from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch

from moec.runtime import cuda_graph

from .specs import SMALL, SMALL_HIDDEN

COPIED = [
    "name=gpu_copies",
    "quant.scheme=fp8_block",
    "quant.checkpoint=bf16",
    "experts.shared_experts=overlapped",
]


def _torch_save_copy(layer):
    buffer = io.BytesIO()
    torch.save(layer, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


@pytest.mark.parametrize(
    "make_copy",
    [copy.deepcopy, lambda m: pickle.loads(pickle.dumps(m)), _torch_save_copy],
    ids=["deepcopy", "pickle", "torch.save"],
)
def test_a_copy_of_a_layer_that_ran_its_side_stream_computes_the_same(load_layer, make_copy):
    package = load_layer(SMALL, *COPIED)
    layer = package.MoELayer(device="cuda").random_(0)
    x = torch.randn(64, SMALL_HIDDEN, device="cuda").bfloat16()
    expected = layer(x)  # the shared experts' second stream is made here
    assert layer.side_stream.stream is not None
    twin = make_copy(layer)
    assert twin.w13.dtype == torch.float8_e4m3fn and twin.w13.device == layer.w13.device
    assert torch.equal(twin(x), expected)
    assert twin.side_stream.stream is not layer.side_stream.stream
    replay, out = cuda_graph.capture(lambda: twin(x), warmup=1)
    replay()
    torch.cuda.synchronize()
    assert torch.equal(out, expected)
