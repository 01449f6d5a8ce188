"""The generated layer (torch backend) against transformers' DeepSeek MoE blocks.

Each case saves a tiny random transformers model with `save_pretrained`, writes the spec with
`moec init --from-hf` from its config.json, loads the safetensors into the generated layer and
compares outputs on the same input.

Tolerances: float32 runs the same arithmetic in another order: max relative error <= 1e-5 of
the output's max magnitude. bfloat16 rounds inputs, weights (bf16 experts) and the output to
8 significant bits: each value within a few bf16 ulps (2**-8 relative) of the fp32 oracle.
"""

from __future__ import annotations

import hf_oracle
import pytest
import torch

from moec.cli import main


def _spec_from_hf(folder, dtype: str, *extra: str) -> str:
    spec = folder / "spec.toml"
    args = ["init", "--from-hf", str(folder / "config.json"), "-o", str(spec), "--name", "oracle"]
    for item in (
        "target.device=cpu",
        f"target.dtype={dtype}",
        "experts.gemm_backend=torch",
        *extra,
    ):
        args += ["--set", item]
    assert main(args) == 0
    return str(spec)


CASES = {
    "v3_noaux_tc_shared": lambda: hf_oracle.deepseek_v3(),
    "v3_no_shared": lambda: hf_oracle.deepseek_v3(n_shared=0),
    "v2_greedy": lambda: hf_oracle.deepseek_v2("greedy"),
    "v2_group_limited": lambda: hf_oracle.deepseek_v2("group_limited_greedy"),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def saved(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    block = hf_oracle.save_model(CASES[request.param](), folder)
    return request.param, folder, block


def _relative(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref.double()).abs().max() / ref.double().abs().max()).item()


@pytest.mark.parametrize("layout", ["contiguous", "masked"])
def test_float32_equals_transformers(saved, load_layer, layout):
    name, folder, block = saved
    package = load_layer(_spec_from_hf(folder, "float32", f"experts.layout={layout}"))
    layer = package.MoELayer().load_weights(folder, prefix=hf_oracle.PREFIX)
    x = torch.randn(37, 64, generator=torch.Generator().manual_seed(1))
    out = layer(x)
    ref = hf_oracle.oracle(block, x)
    assert _relative(out, ref) <= 1e-5, name


def test_bfloat16_within_bf16_rounding(saved, load_layer):
    name, folder, block = saved
    package = load_layer(_spec_from_hf(folder, "bfloat16"))
    layer = package.MoELayer().load_weights(folder, prefix=hf_oracle.PREFIX)
    x = torch.randn(37, 64, generator=torch.Generator().manual_seed(2)).bfloat16()
    out = layer(x).float()
    # The oracle in fp32 on the same bf16 inputs and bf16-rounded expert weights.
    ref = hf_oracle.oracle(block, x.float())
    error = (out - ref).abs() / ref.abs().max()
    assert error.max().item() <= 2**-6, name  # a few bf16 ulps of the largest output


def test_routing_equals_transformers(saved, load_layer):
    name, folder, block = saved
    package = load_layer(_spec_from_hf(folder, "float32"))
    layer = package.MoELayer().load_weights(folder, prefix=hf_oracle.PREFIX)
    stages = __import__(f"{package.__name__}.stages", fromlist=["stages"])
    x = torch.randn(1000, 64, generator=torch.Generator().manual_seed(3))
    logits = stages.router(x, layer.gate_weight)
    select_args = (logits, layer.gate_bias) if hasattr(layer, "gate_bias") else (logits,)
    _, ids = stages.select(*select_args)
    ours = ids.long().sort(dim=-1).values
    assert torch.equal(ours, hf_oracle.oracle_routing(block, x)), name
