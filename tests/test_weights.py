"""load_weights: every source kind, HF / DeepSeek names, quantize-on-load, quantized checkpoints,
and one error listing every missing, unexpected or mis-shaped tensor."""

from __future__ import annotations

import json

import hf_oracle
import pytest
import torch
from safetensors.torch import save_file

from moec.cli import main

E4M3 = torch.float8_e4m3fn


def _save(tmp_path_factory, name, config):
    folder = tmp_path_factory.mktemp(name)
    block = hf_oracle.save_model(config, folder)
    spec = folder / "spec.toml"
    args = ["init", "--from-hf", str(folder / "config.json"), "-o", str(spec), "--name", "weights"]
    for item in ("target.device=cpu", "target.dtype=float32", "experts.gemm_backend=torch"):
        args += ["--set", item]
    assert main(args) == 0
    return folder, block, str(spec)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    return _save(tmp_path_factory, "v3", hf_oracle.deepseek_v3())


@pytest.fixture(scope="module")
def saved_128(tmp_path_factory):
    """Dims that fit 128 x 128 weight blocks (hidden 256, intermediate 128)."""
    return _save(tmp_path_factory, "v3_128", hf_oracle.deepseek_v3(hidden=256, intermediate=128))


def _moe_tensors(folder):
    from safetensors.torch import load_file

    return {
        k: v
        for k, v in load_file(folder / "model.safetensors").items()
        if k.startswith(hf_oracle.PREFIX)
    }


def _check_equal(layer, block):
    x = torch.randn(9, 64, generator=torch.Generator().manual_seed(5))
    out, ref = layer(x), hf_oracle.oracle(block, x)
    assert (out - ref).abs().max() / ref.abs().max() <= 1e-5


def test_sources(saved, load_layer, tmp_path):
    folder, block, spec = saved
    package = load_layer(spec)
    tensors = _moe_tensors(folder)
    # a state dict, an iterable of pairs, a single safetensors file, a folder without index
    _check_equal(package.MoELayer().load_weights(tensors, hf_oracle.PREFIX), block)
    _check_equal(package.MoELayer().load_weights(iter(tensors.items()), hf_oracle.PREFIX), block)
    _check_equal(
        package.MoELayer().load_weights(folder / "model.safetensors", hf_oracle.PREFIX), block
    )
    _check_equal(package.MoELayer().load_weights(folder, hf_oracle.PREFIX), block)
    # a folder of shards with model.safetensors.index.json
    shards = tmp_path / "sharded"
    shards.mkdir()
    names = sorted(tensors)
    weight_map = {}
    for index, part in enumerate((names[: len(names) // 2], names[len(names) // 2 :])):
        shard = f"model-{index + 1:05d}-of-00002.safetensors"
        save_file({n: tensors[n].contiguous() for n in part}, shards / shard)
        weight_map.update({n: shard for n in part})
    (shards / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    _check_equal(package.MoELayer().load_weights(shards, hf_oracle.PREFIX), block)
    # a torch state dict file is not unpickled (it could run code): the error says how to
    # convert it; the state dict torch.load(weights_only=True) returns loads
    torch.save(tensors, tmp_path / "moe.pt")
    with pytest.raises(ValueError, match="pickle file"):
        package.MoELayer().load_weights(tmp_path / "moe.pt", hf_oracle.PREFIX)
    state = torch.load(tmp_path / "moe.pt", weights_only=True)
    _check_equal(package.MoELayer().load_weights(state, hf_oracle.PREFIX), block)


def test_transformers_fused_in_memory_names(saved, load_layer):
    folder, block, spec = saved
    state = {f"mlp.{k}": v for k, v in block.state_dict().items()}
    assert "mlp.experts.gate_up_proj" in state  # transformers keeps the experts fused in memory
    _check_equal(load_layer(spec).MoELayer().load_weights(state, "mlp."), block)


def _shared_renamed(tensors: dict, fuse: bool) -> dict:
    """The checkpoint with its shared expert named as Flint's and Lara-Mini's (shared_expert.*)
    or, fuse=True, with gate and up stacked in one shared_experts.gate_up_proj (MiniMax-M3's)."""
    shared = f"{hf_oracle.PREFIX}shared_experts."
    if not fuse:
        return {
            k.replace(shared, f"{hf_oracle.PREFIX}shared_expert."): v for k, v in tensors.items()
        }
    renamed = dict(tensors)
    gate, up = renamed.pop(f"{shared}gate_proj.weight"), renamed.pop(f"{shared}up_proj.weight")
    renamed[f"{shared}gate_up_proj.weight"] = torch.cat([gate, up])
    return renamed


@pytest.mark.parametrize("fuse", [False, True], ids=["shared_expert", "fused gate_up"])
def test_other_names_of_the_shared_expert_load_from_a_file(saved, load_layer, tmp_path, fuse):
    folder, block, spec = saved
    tensors = _shared_renamed(_moe_tensors(folder), fuse)
    save_file({k: v.contiguous() for k, v in tensors.items()}, tmp_path / "moe.safetensors")
    layer = load_layer(spec).MoELayer()
    _check_equal(layer.load_weights(tmp_path / "moe.safetensors", hf_oracle.PREFIX), block)


def test_a_fused_shared_gate_up_of_odd_rows_is_a_problem(saved, load_layer):
    folder, block, spec = saved
    tensors = _shared_renamed(_moe_tensors(folder), fuse=True)
    name = f"{hf_oracle.PREFIX}shared_experts.gate_up_proj.weight"
    tensors[name] = tensors[name][1:]
    with pytest.raises(ValueError, match=r"gate_up_proj.weight: shape \[\d+, 64\], expected \[2 x"):
        load_layer(spec).MoELayer().load_weights(tensors, hf_oracle.PREFIX)


def test_two_names_for_one_weight_are_a_problem(saved, load_layer):
    """A checkpoint holding one weight twice, fused and per expert, or under two spellings of
    an expert's number: which value is meant is unknown, so it is reported, not one taken."""
    folder, block, spec = saved
    fused = {f"mlp.{k}": v for k, v in block.state_dict().items()}
    split = {
        k.replace(hf_oracle.PREFIX, "mlp."): v
        for k, v in _moe_tensors(folder).items()
        if ".experts.0." in k
    }
    assert split and "mlp.experts.gate_up_proj" in fused
    padded = {k.replace(".experts.0.", ".experts.00."): v for k, v in split.items()}
    for state in ({**fused, **split}, {**split, **padded}):
        with pytest.raises(Exception, match="a second value of a weight"):
            load_layer(spec).MoELayer().load_weights(state, "mlp.")


def _quantize_blocks(w: torch.Tensor, block=128):
    """An independent 128x128 block quantizer (DeepSeek-V3 checkpoint format)."""
    n, k = w.shape
    rows, cols = -(-n // block), -(-k // block)
    padded = torch.zeros(rows * block, cols * block)
    padded[:n, :k] = w
    blocks = padded.view(rows, block, cols, block)
    scale = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-10) / 448.0
    q = (blocks / scale[:, None, :, None]).view(rows * block, cols * block)[:n, :k].to(E4M3)
    return q, scale


def test_fp8_checkpoint_loads_its_bytes(saved_128, load_layer):
    folder, block, spec = saved_128
    tensors = _moe_tensors(folder)
    quantized = {}
    for name, tensor in tensors.items():
        if name.endswith("_proj.weight"):
            q, scale = _quantize_blocks(tensor.float())
            quantized[name] = q
            quantized[name.replace(".weight", ".weight_scale_inv")] = scale
        else:
            quantized[name] = tensor
    package = load_layer(
        spec, "quant.scheme=fp8_block", "quant.checkpoint=quantized", "target.dtype=bfloat16"
    )
    layer = package.MoELayer().load_weights(quantized, hf_oracle.PREFIX)
    gate = quantized[hf_oracle.PREFIX + "experts.3.gate_proj.weight"]
    up = quantized[hf_oracle.PREFIX + "experts.3.up_proj.weight"]
    assert torch.equal(layer.w13[3].view(torch.uint8), torch.cat([gate, up]).view(torch.uint8))
    scale = quantized[hf_oracle.PREFIX + "experts.3.down_proj.weight_scale_inv"]
    assert torch.equal(layer.w2_scale[3], scale)


def test_bf16_checkpoint_is_quantized_on_load(saved_128, load_layer):
    folder, block, spec = saved_128
    package = load_layer(
        spec, "quant.scheme=fp8_block", "quant.checkpoint=bf16", "target.dtype=bfloat16"
    )
    layer = package.MoELayer().load_weights(folder, hf_oracle.PREFIX)
    original = _moe_tensors(folder)[hf_oracle.PREFIX + "experts.5.down_proj.weight"].float()
    q, scale = _quantize_blocks(original)
    assert torch.equal(layer.w2[5].view(torch.uint8), q.view(torch.uint8))
    assert torch.equal(layer.w2_scale[5], scale)


def test_ue8m0_scales_requantize_an_fp32_scaled_checkpoint(saved_128, load_layer):
    folder, block, spec = saved_128
    tensors = _moe_tensors(folder)
    quantized = dict(tensors)
    for name, tensor in tensors.items():
        if name.endswith("_proj.weight"):
            quantized[name], quantized[name.replace(".weight", ".weight_scale_inv")] = (
                _quantize_blocks(tensor.float())
            )
    package = load_layer(
        spec, "quant.scheme=fp8_block", "quant.scale_dtype=ue8m0", "target.dtype=bfloat16"
    )
    layer = package.MoELayer().load_weights(quantized, hf_oracle.PREFIX)
    scales = layer.w13_scale
    assert torch.equal(scales, torch.exp2(torch.log2(scales).round()))  # powers of two


def test_mxfp4_checkpoint_loads_packed_values(saved, load_layer):
    folder, block, spec = saved
    tensors = _moe_tensors(folder)
    generator = torch.Generator().manual_seed(9)
    checkpoint = {
        k: v for k, v in tensors.items() if not k.split(hf_oracle.PREFIX)[1].startswith("experts.")
    }
    for e in range(16):
        for proj, (n, k) in (("gate", (32, 64)), ("up", (32, 64)), ("down", (64, 32))):
            name = f"{hf_oracle.PREFIX}experts.{e}.{proj}_proj"
            checkpoint[f"{name}.weight"] = torch.randint(
                0, 256, (n, k // 2), generator=generator, dtype=torch.uint8
            )
            checkpoint[f"{name}.weight_scale_inv"] = torch.randint(
                120, 130, (n, k // 32), generator=generator, dtype=torch.uint8
            )
    overrides = [
        "quant.scheme=mxfp4",
        "quant.checkpoint=quantized",
        "quant.shared_scheme=mxfp8",
        "target.dtype=bfloat16",
    ]
    layer = load_layer(spec, *overrides).MoELayer().load_weights(checkpoint, hf_oracle.PREFIX)
    # float shared weights in a quantized checkpoint are quantized on load (mxfp8 here)
    shared = checkpoint[f"{hf_oracle.PREFIX}shared_experts.down_proj.weight"].float()
    assert layer.shared_w2.dtype == E4M3
    restored = layer.shared_w2.float() * layer.shared_w2_scale.repeat_interleave(32, 1)
    assert ((restored - shared).norm() / shared.norm()).item() < 2**-4
    name = f"{hf_oracle.PREFIX}experts.2.down_proj"
    assert torch.equal(layer.w2[2], checkpoint[f"{name}.weight"])
    assert torch.equal(
        layer.w2_scale[2], torch.exp2(checkpoint[f"{name}.weight_scale_inv"].float() - 127)
    )


def test_every_problem_is_listed_once(saved, load_layer):
    folder, block, spec = saved
    tensors = _moe_tensors(folder)
    del tensors[hf_oracle.PREFIX + "experts.4.up_proj.weight"]
    tensors[hf_oracle.PREFIX + "experts.7.down_proj.weight"] = torch.zeros(3, 3)
    tensors[hf_oracle.PREFIX + "experts.2.gate_projj.weight"] = torch.zeros(1)
    tensors[hf_oracle.PREFIX + "gate.weight"] = torch.zeros(16, 63)
    layer = load_layer(spec).MoELayer()
    with pytest.raises(ValueError) as error:
        layer.load_weights(tensors, hf_oracle.PREFIX)
    problems = error.value.problems
    text = "\n".join(problems)
    assert "experts.4.up_proj.weight: missing" in text
    assert "experts.7.down_proj.weight: shape [3, 3], expected [64, 32]" in text
    assert "experts.2.gate_projj.weight: unexpected" in text
    assert "gate.weight: shape [16, 63], expected [16, 64]" in text
    assert len(problems) == 4


def test_integer_bytes_are_no_float_weights(saved, saved_128, load_layer):
    """uint8 / int8 tensors are weights only in a packed mxfp4 checkpoint: elsewhere they are
    refused by name, not read as numbers (a uint8 weight of 200s is no weight of 200.0s)."""
    folder, _, spec = saved
    tensors = _moe_tensors(folder)
    for name in ("gate.weight", "experts.3.gate_proj.weight", "shared_experts.down_proj.weight"):
        full = hf_oracle.PREFIX + name
        tensors[full] = torch.full_like(tensors[full], 7, dtype=torch.uint8)
    with pytest.raises(ValueError) as error:
        load_layer(spec).MoELayer().load_weights(tensors, hf_oracle.PREFIX)
    problems = error.value.problems
    assert len(problems) == 3
    assert all("torch.uint8" in p and "expected floating-point" in p for p in problems)
    # an fp8 checkpoint: an int8 weight and an int8 scale
    folder, _, spec = saved_128
    package = load_layer(spec, "quant.scheme=fp8_block", "quant.checkpoint=quantized")
    tensors = {}
    for name, value in _moe_tensors(folder).items():
        if name.endswith("_proj.weight"):
            tensors[name], tensors[name + "_scale_inv"] = _quantize_blocks(value.float())
        else:
            tensors[name] = value
    weight = hf_oracle.PREFIX + "experts.1.up_proj.weight"
    tensors[weight] = tensors[weight].view(torch.int8)
    tensors[weight.replace("1.up", "2.up") + "_scale_inv"] = torch.ones(1, 2, dtype=torch.int8)
    with pytest.raises(ValueError) as error:
        package.MoELayer().load_weights(tensors, hf_oracle.PREFIX)
    text = "\n".join(error.value.problems)
    assert "experts.1.up_proj.weight: torch.int8" in text
    assert "experts.2.up_proj.weight_scale_inv: torch.int8: expected floating-point" in text


def test_forward_rejects_bad_inputs(saved, load_layer):
    folder, block, spec = saved
    package = load_layer(spec)
    layer = package.MoELayer().random_(0)
    with pytest.raises(ValueError, match=r"must be \[T, 64\]"):
        layer(torch.zeros(3, 65))
    with pytest.raises(ValueError, match="must be torch.float32"):
        layer(torch.zeros(3, 64, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="was built for torch.float32"):
        package.MoELayer(dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"must be \[T, 64\]"):
        layer(torch.zeros(64))
    assert layer(torch.zeros(0, 64)).shape == (0, 64)


def test_random_weights_are_realistic(saved, load_layer):
    folder, block, spec = saved
    layer = load_layer(spec).MoELayer().random_(1)
    assert layer.gate_bias.abs().max() > 0  # the router bias is random too
    again = load_layer(spec).MoELayer().random_(1)
    assert all(
        torch.equal(a, b) for a, b in zip(layer.parameters(), again.parameters(), strict=True)
    )
    other = load_layer(spec).MoELayer().random_(2)
    assert not torch.equal(layer.w13, other.w13)


STATIC_PER_TENSOR = """
name = "static_fused"
[model]
hidden_size = 256
moe_intermediate_size = 128
n_routed_experts = 4
num_experts_per_tok = 2
n_shared_experts = 2
[quant]
scheme = "fp8_per_tensor"
activation_scheme = "static"
checkpoint = "quantized"
[target]
device = "cpu"
max_num_tokens = 16
"""


def test_static_scales_reach_fused_shared_experts(load_layer):
    """Static per-tensor activation scales are the shared MLP's: fused as extra experts, each
    part takes them (a KeyError before), and fused equals separate on the same weights."""
    x = torch.randn(5, 256, generator=torch.Generator().manual_seed(1)).bfloat16()
    outs = []
    for mode in ("fused", "separate"):
        package = load_layer(STATIC_PER_TENSOR, f"experts.shared_experts={mode}")
        layer = package.MoELayer().random_(0)
        state = {k: v for k, v in layer.state_dict().items()}
        assert "w13_input_scale" in state
        outs.append(layer(x))
    assert torch.allclose(outs[0].float(), outs[1].float(), rtol=2**-7, atol=2**-7)


def test_a_one_block_weight_keeps_its_scale_grid():
    """A 128 x 128 fp8_block weight has one scale, [1, 1] in the checkpoint (the shared expert
    of a small DeepSeek-V4 layer): taken as the grid it is, not flattened to [1]."""
    from moec.runtime import quant
    from moec.runtime.weight_formats import WeightFormat

    fmt = WeightFormat("fp8_block", (128, 128), False, True, False, torch.bfloat16)
    w = torch.randn(128, 128)
    value, scale = quant.quantize_blocks(w, 128, 128, pow2_scales=False)
    problems = []
    pair = fmt.from_checkpoint(value, scale, (128, 128), "shared_experts.w1", problems)
    assert problems == [] and torch.equal(pair[1], scale)
