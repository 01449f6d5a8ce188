"""Issue 28, points 2 and 5 (the generated layer's API): no forward before the layer has weights,
argument types checked with one message each, dtype conversions refused at the conversion, and
`python -m <package>.check` bounding its numbers as `moec run` does."""

from __future__ import annotations

import importlib

import numpy as np
import pytest
import torch
from conftest import EXAMPLES

TINY = EXAMPLES / "tiny-cpu.toml"  # fp8 block-scaled experts, the torch backend


@pytest.fixture
def package(load_layer):
    return load_layer(TINY)


def tokens(package, count: int = 3) -> torch.Tensor:
    hidden = package.layer.HIDDEN
    return torch.randn(count, hidden, generator=torch.Generator().manual_seed(4)).bfloat16()


def test_a_forward_before_weights_names_both_ways_out(package):
    layer = package.MoELayer()
    with pytest.raises(
        ValueError,
        match=r"no weights yet: call load_weights\(checkpoint\) or "
        r"random_\(seed\)",
    ):
        layer(tokens(package))


def test_a_failed_load_leaves_a_layer_without_weights_refusing(package):
    layer = package.MoELayer()
    with pytest.raises(ValueError):
        layer.load_weights({"gate.weight": torch.zeros(1)})
    with pytest.raises(ValueError, match="no weights yet"):
        layer(tokens(package))


@pytest.mark.parametrize("seed", [1.0, "1", None, True, b"1"])
def test_a_seed_that_is_not_an_int_is_a_type_error(package, seed):
    layer = package.MoELayer()
    with pytest.raises(TypeError, match=r"random_\(seed\): seed must be an int, got "):
        layer.random_(seed)
    with pytest.raises(ValueError, match="no weights yet"):  # and the layer is still unset
        layer(tokens(package))


@pytest.mark.parametrize("seed", [-1, 2**32, 10**20])
def test_a_seed_out_of_range_is_a_value_error(package, seed):
    with pytest.raises(
        ValueError, match=f"seed must be a whole number from 0 to 4294967295, got {seed}"
    ):
        package.MoELayer().random_(seed)


def test_a_numpy_integer_seed_is_the_same_seed(package):
    x = tokens(package)
    assert torch.equal(package.MoELayer().random_(np.int64(3))(x), package.MoELayer().random_(3)(x))


@pytest.mark.parametrize(
    "make", [lambda x: x.tolist(), lambda x: x.float().numpy(), lambda x: None]
)
def test_an_input_that_is_not_a_tensor_is_a_type_error(package, make):
    layer = package.MoELayer().random_(0)
    given = make(tokens(package))
    with pytest.raises(
        TypeError, match=rf"x must be a torch.Tensor \[T, 256\], got {type(given).__name__}"
    ):
        layer(given)


@pytest.mark.parametrize(
    ("convert", "call"),
    [
        (lambda layer: layer.half(), r"\.half\(\)"),
        (lambda layer: layer.float(), r"\.float\(\)"),
        (lambda layer: layer.double(), r"\.double\(\)"),
        (lambda layer: layer.bfloat16(), r"\.bfloat16\(\)"),
        (lambda layer: layer.to(torch.float16), r"\.to\(torch.float16\)"),
        (lambda layer: layer.to("cpu", torch.float16), r"\.to\(torch.float16\)"),
        (lambda layer: layer.to(dtype=torch.float32), r"\.to\(torch.float32\)"),
    ],
)
def test_a_dtype_conversion_is_refused_at_the_conversion(package, convert, call):
    layer = package.MoELayer().random_(2)
    x = tokens(package)
    before = {name: tensor.clone() for name, tensor in layer.state_dict().items()}
    with pytest.raises(
        TypeError,
        match=call + r" would convert \w+ from torch\.\w+ to torch\.\w+: "
        "the layer's parameters keep the dtypes it was built for",
    ):
        convert(layer)
    after = layer.state_dict()
    assert all(
        after[name].dtype == t.dtype and torch.equal(after[name], t) for name, t in before.items()
    )
    assert torch.equal(layer(x), package.MoELayer().random_(2)(x))  # still runs


def test_a_device_move_still_works(package):
    layer = package.MoELayer().random_(2)
    x = tokens(package)
    expected = layer(x)
    assert layer.to("cpu") is layer and layer.cpu() is layer
    assert torch.equal(layer.to(torch.device("cpu"))(x), expected)


@pytest.fixture
def check(package):
    return importlib.import_module(f"{package.__name__}.check")


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--seed", "1" * 20], "--seed must be a whole number from 0 to 4294967295, got 1111"),
        (["--seed", "-1"], "--seed must be a whole number from 0 to 4294967295, got -1"),
        (["--tokens", "100000000"], "--tokens 100000000 is more than target.max_num_tokens = 256"),
        (["--tokens", "1,257"], "--tokens 257 is more than target.max_num_tokens = 256"),
        (["--repeats", "1" * 30], "--repeats must be at most 10000"),
    ],
)
def test_the_check_bounds_its_numbers(check, capsys, argv, fragment):
    with pytest.raises(SystemExit) as raised:
        check.main(argv)
    assert raised.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert fragment in captured.err and "Traceback" not in captured.err


def test_the_check_runs_at_its_bounds(check, capsys):
    assert check.main(["--seed", "4294967295", "--tokens", "256", "--repeats", "1"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("ok: within")


def test_a_triton_package_built_for_cuda_refuses_a_cpu_layer(load_layer, monkeypatch):
    """Built for CUDA, its Triton kernels cannot run on the CPU unless interpreted: refused when
    the layer is made, naming the target, instead of failing in Triton's driver lookup."""
    package = load_layer(
        str(EXAMPLES / "tiny-cpu-triton.toml"),
        "target.device=cuda",
        "target.arch=sm90",
        "name=tiny_cuda_triton",
    )
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="built for CUDA: its Triton kernels run on a CUDA"):
        package.MoELayer(device="cpu")
    with pytest.raises(ValueError, match="not on cpu"):
        package.MoELayer()
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert package.MoELayer(device="cpu").rank == 0  # interpreted: allowed
