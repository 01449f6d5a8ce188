"""A fourth hostile corpus, the generated package (examples/tiny-cpu.toml and its schemes):
pickle.dumps of a layer (torch's legacy storages, which pickle writes, could not rebuild float8,
and a CUDA stream cannot be pickled at all); `python -m <package>.check` with hostile
arguments, a reader that goes away, a full disk, Ctrl-C and a layer that does not fit; and the
layer's moves, state dicts and parameters on more than one device."""

from __future__ import annotations

import copy
import importlib
import os
import pickle
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from conftest import EXAMPLES
from torch import nn

from moec.codegen import build

TINY = EXAMPLES / "tiny-cpu.toml"  # 16 experts, fp8 block weights from a bf16 checkpoint
HIDDEN = 256
SCHEMES = {  # the overrides of tiny-cpu.toml that give each scheme
    "fp8_block": [],
    "fp8_per_tensor": ["quant.scheme=fp8_per_tensor"],
    "mxfp8": ["quant.scheme=mxfp8"],
    "mxfp4": ["quant.scheme=mxfp4", "quant.checkpoint=quantized", "quant.shared_scheme=mxfp8"],
    "bf16": ["quant.scheme=bf16"],
}


@pytest.fixture(scope="module")
def package(load_layer):
    return load_layer(TINY)


@pytest.fixture(scope="module")
def layer(package):
    return package.MoELayer().random_(1)


@pytest.fixture(scope="module")
def x() -> torch.Tensor:
    return torch.randn(6, HIDDEN, generator=torch.Generator().manual_seed(5)).bfloat16()


def _bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().reshape(-1).view(torch.uint8)


def _same_parameters(layer, twin) -> bool:
    """Same names, classes, dtypes, devices, requires_grad and bytes."""
    ours, theirs = dict(layer.named_parameters()), dict(twin.named_parameters())
    return ours.keys() == theirs.keys() and all(
        type(ours[name]) is type(theirs[name])
        and (ours[name].dtype, ours[name].device, ours[name].requires_grad)
        == (theirs[name].dtype, theirs[name].device, theirs[name].requires_grad)
        and torch.equal(_bytes(ours[name]), _bytes(theirs[name]))
        for name in ours
    )


# --- pickle -------------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_a_pickled_layer_is_the_layer(load_layer, x, scheme):
    """pickle.loads(pickle.dumps(layer)) raised AttributeError ('UntypedStorage' has no
    attribute 'dtype') for a layer of float8 weights; now every scheme round-trips exactly,
    as a layer of its own (its own op_id and storage)."""
    package = load_layer(TINY, *SCHEMES[scheme])
    layer = package.MoELayer().random_(1)
    twin = pickle.loads(pickle.dumps(layer))
    assert _same_parameters(layer, twin) and twin.weights_set
    assert torch.equal(twin(x), layer(x))
    assert twin.op_id != layer.op_id and package.layer._LAYERS[twin.op_id] is twin
    before = layer(x)
    twin.random_(2)
    assert torch.equal(layer(x), before) and not torch.equal(twin(x), before)


def test_pickling_leaves_the_layer_as_it_was(layer, x):
    """The copy carries float8 tensors as uint8 views; the layer's own stay its own."""
    parameters = dict(layer.named_parameters())
    before = layer(x)
    pickle.dumps(layer)
    copy.deepcopy(layer)
    assert all(parameters[name] is p for name, p in layer.named_parameters())
    assert layer.w13.dtype == torch.float8_e4m3fn and isinstance(layer.w13, nn.Parameter)
    assert torch.equal(layer(x), before)


def test_a_layer_saved_before_its_state_carried_bytes_still_loads(package, layer, x):
    """A torch.save of an earlier build holds nn.Module's state, float8 tensors as they are."""
    old_state = nn.Module.__getstate__(layer)
    twin = package.MoELayer.__new__(package.MoELayer)
    twin.__setstate__(dict(old_state))
    assert _same_parameters(layer, twin) and torch.equal(twin(x), layer(x))


def test_a_pickled_copy_runs_its_own_weights_when_compiled(layer, x):
    torch._dynamo.reset()
    twin = pickle.loads(pickle.dumps(layer)).random_(2)
    out = torch.compile(twin, backend="eager", fullgraph=True)(x)
    assert torch.equal(out, twin(x)) and not torch.equal(out, layer(x))


@pytest.mark.parametrize(
    "make_copy",
    [copy.deepcopy, lambda m: pickle.loads(pickle.dumps(m))],
    ids=["deepcopy", "pickle"],
)
def test_a_layer_that_ran_its_side_stream_copies(load_layer, x, make_copy):
    """After a forward on a GPU, the side stream of overlapped shared experts holds a
    torch.cuda.Stream, which pickle refuses (TypeError: cannot pickle 'Stream' object, seen on
    an H200): deepcopy, torch.save and pickle of the layer all failed. A lock stands in for the
    stream here: it cannot be pickled either. The copy makes its own stream on first use."""
    package = load_layer(TINY, "experts.shared_experts=overlapped")
    layer = package.MoELayer().random_(1)
    lock = threading.Lock()
    layer.side_stream.stream = lock
    twin = make_copy(layer)
    assert twin.side_stream.stream is None and layer.side_stream.stream is lock
    assert torch.equal(twin(x), layer(x))


# --- python -m <package>.check ------------------------------------------------------------


@pytest.fixture(scope="module")
def check(package):
    return importlib.import_module(f"{package.__name__}.check")


HOSTILE_ARGUMENTS = {  # argv -> what the one message names
    "an unknown option": (["--bogus"], "unrecognized arguments: --bogus"),
    "an unknown short option": (["-x"], "unrecognized arguments: -x"),
    "a word": (["extra"], "unrecognized arguments: extra"),
    "no value": (["--tokens"], "argument --tokens: expected one argument"),
    "zero tokens": (["--tokens", "0"], "expects positive token counts"),
    "negative tokens": (["--tokens", "-1"], "expects positive token counts"),
    "tokens in e-notation": (["--tokens", "1e3"], "'1e3'"),
    "an empty count": (["--tokens", "1,,2"], "'1,,2'"),
    "other scripts' digits": (["--tokens", "\u0661"], "expects positive token counts"),
    "tokens over max_num_tokens": (
        ["--tokens", "1,257"],
        "--tokens 257 is more than target.max_num_tokens = 256",
    ),
    "a huge token count": (["--tokens", "9" * 30], f"--tokens {'9' * 30} is more than"),
    "65 token counts": (["--tokens", ",".join(["1"] * 65)], "(at most 64)"),
    "a path for tokens": (["--tokens", "/etc/passwd"], "'/etc/passwd'"),
    "a negative seed": (["--seed", "-1"], "--seed must be a whole number from 0 to 4294967295"),
    "a seed over 2**32 - 1": (["--seed", str(2**32)], f"got {2**32}"),
    "a word for a seed": (["--seed", "x"], "expects a whole number, e.g. 0: 'x'"),
    "zero repeats": (["--repeats", "0"], "expects a positive count: '0'"),
    "negative repeats": (["--repeats", "-3"], "expects a positive count: '-3'"),
    "too many repeats": (["--repeats", "10001"], "--repeats must be at most 10000"),
    "huge repeats": (["--repeats", "9" * 30], "--repeats must be at most 10000"),
    "a device torch names otherwise": (["--device", "gpu"], "invalid choice: 'gpu'"),
    "a device index": (["--device", "cuda:0"], "invalid choice: 'cuda:0'"),
    "a capital device": (["--device", "CUDA"], "invalid choice: 'CUDA'"),
    "a path for a device": (["--device", "/dev/null"], "invalid choice: '/dev/null'"),
}


@pytest.mark.parametrize("case", HOSTILE_ARGUMENTS)
def test_a_hostile_argument_is_one_message(check, capsys, case):
    argv, fragment = HOSTILE_ARGUMENTS[case]
    with pytest.raises(SystemExit) as raised:
        check.main(argv)
    captured = capsys.readouterr()
    assert raised.value.code == 2 and captured.out == ""
    assert "Traceback" not in captured.err
    message = captured.err.splitlines()[-1]
    assert message.startswith("python -m tiny_cpu.check: error: ") and fragment in message


def test_ctrl_c_stops_the_check_with_130(package, check, monkeypatch, capsys):
    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(package.stages, "gemm_down", interrupted)
    try:  # an interrupt that escapes would stop pytest itself
        code = check.main(["--tokens", "1", "--repeats", "1"])
    except KeyboardInterrupt:
        code = "KeyboardInterrupt escaped"
    assert code == 130
    assert "Traceback" not in capsys.readouterr().err


def test_a_layer_that_does_not_fit_is_one_message(package, check, monkeypatch, capsys):
    def out_of_memory(self, seed=0):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 11.00 GiB")

    monkeypatch.setattr(package.MoELayer, "random_", out_of_memory)
    assert check.main(["--tokens", "1"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        "tiny_cpu.check: the layer does not fit on cpu: CUDA out of memory. Tried to allocate "
        "11.00 GiB\n"
    )


def test_a_layer_that_fails_while_timed_fails_the_check(package, check, monkeypatch, capsys):
    """The checked run passes; the timed run raises: a failed T, not a traceback."""
    gemm_down, calls = package.stages.gemm_down, []

    def second_call_fails(*args):
        calls.append(1)
        if len(calls) > 1:
            raise RuntimeError("illegal memory access")
        return gemm_down(*args)

    monkeypatch.setattr(package.stages, "gemm_down", second_call_fails)
    assert check.main(["--tokens", "2", "--repeats", "1"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "FAILED: T=2: raised RuntimeError: illegal memory access"


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """tiny-cpu built into a folder, for the check run as a user runs it."""
    folder = tmp_path_factory.mktemp("built")
    build(TINY, folder)
    return folder


def _run_check(folder: Path, *args: str, stdout=subprocess.PIPE, env=None):
    return subprocess.run(
        [sys.executable, "-m", "tiny_cpu.check", "--tokens", "1", "--repeats", "1", *args],
        cwd=folder,
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=300,
    )


def test_a_reader_that_went_away_ends_the_check_quietly(built):
    """`python -m tiny_cpu.check | head -1`: was a BrokenPipeError traceback; now exit 141,
    as a Unix tool killed by SIGPIPE, and no message."""
    read, write = os.pipe()
    os.close(read)
    try:
        done = _run_check(built, stdout=write)
    finally:
        os.close(write)
    assert (done.returncode, done.stderr) == (141, "")


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full here")
def test_a_full_disk_is_one_message(built):
    """`python -m tiny_cpu.check > file` on a full disk: was an OSError traceback."""
    with open("/dev/full", "w") as full:
        done = _run_check(built, stdout=full)
    assert done.returncode == 2
    assert done.stderr == (
        "tiny_cpu.check: cannot write to standard output: No space left on device\n"
    )


def test_cuda_asked_for_where_there_is_none_is_one_message(built):
    """As a user runs it, on a machine whose CUDA devices are hidden (or absent)."""
    done = _run_check(built, "--device", "cuda", env={"CUDA_VISIBLE_DEVICES": ""})
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.startswith("tiny_cpu.check: --device cuda: no CUDA device here")
    assert len(done.stderr.splitlines()) == 1


# --- moves, state dicts, devices ----------------------------------------------------------

BAD_MOVES = {
    "an unknown device": (
        lambda m: m.to("nonsense"),
        ValueError,
        ".to('nonsense'): Expected one of",
    ),
    "a dtype by name": (
        lambda m: m.to(dtype="float16"),
        TypeError,
        ".to(dtype='float16') takes a device (e.g. 'cuda'), a torch.dtype or a tensor",
    ),
    "type(None)": (lambda m: m.type(None), TypeError, ".type(None) takes a torch.dtype"),
    "an unknown type": (lambda m: m.type("nonsense"), TypeError, ".type('nonsense') takes"),
}


@pytest.mark.parametrize("case", BAD_MOVES)
def test_a_bad_move_is_one_message_and_moves_nothing(layer, x, case):
    """.to('nonsense') and .to(dtype='float16') raised torch's parser errors (the second a
    list of signatures), .type(None) an AttributeError about a str."""
    move, error, fragment = BAD_MOVES[case]
    before = layer(x)
    with pytest.raises(error) as raised:
        move(layer)
    message = str(raised.value)
    assert message.startswith("tiny_cpu: ") and fragment in message
    assert message.endswith("it is unchanged") and "\n" not in message
    assert layer.w13.device.type == "cpu" and torch.equal(layer(x), before)


def test_a_layer_moved_to_meta_refuses_to_run(layer, x):
    """.to('meta') kept weights_set: the forward ran into torch's NotImplementedError for
    nonzero on meta tensors."""
    moved = copy.deepcopy(layer).to("meta")
    with pytest.raises(ValueError, match="tiny_cpu: forward: the layer is on the meta device"):
        moved(x.to("meta"))


def test_a_parameter_left_on_meta_refuses_to_run(layer, x):
    """The forward compared x's device with the first parameter's only."""
    partial = copy.deepcopy(layer)
    partial.w2 = nn.Parameter(torch.empty_like(partial.w2, device="meta"), requires_grad=False)
    with pytest.raises(ValueError, match="forward: the layer is on the meta device"):
        partial(x)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_parameters_on_two_devices_are_named(layer, x):
    """load_state_dict(assign=True) of a tensor elsewhere leaves the layer on two devices; the
    forward failed inside torch ('Expected all tensors to be on the same device')."""
    split = copy.deepcopy(layer)
    split.load_state_dict({"w2": layer.w2.detach().cuda()}, strict=False, assign=True)
    with pytest.raises(ValueError, match="the layer's parameters are on cpu and cuda:0"):
        split(x)


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        (lambda d: d.update({1: torch.zeros(1)}), "the names are strings, got 1 (int)"),
        (lambda d: d.update({1: torch.zeros(1), "w9": 0}), "got 1 (int)"),
        (lambda d: d.update(gate_bias=d["gate_bias"].numpy()), "gate_bias is ndarray, not a"),
    ],
    ids=["an int name", "an int name beside a str one", "a numpy array"],
)
def test_a_non_strict_state_dict_of_odd_names_or_values_is_one_error(
    package, layer, change, fragment
):
    """strict=False with an int name raised AttributeError ('int' object has no attribute
    'startswith') after copying what matched; a numpy array was 'float32, the layer's
    torch.float32'."""
    target = package.MoELayer().random_(2)
    before = {name: _bytes(tensor).clone() for name, tensor in target.state_dict().items()}
    state = dict(layer.state_dict())
    change(state)
    with pytest.raises(TypeError, match="the layer is unchanged") as raised:
        target.load_state_dict(state, strict=False)
    assert fragment in str(raised.value)
    assert all(torch.equal(before[k], _bytes(v)) for k, v in target.state_dict().items())
