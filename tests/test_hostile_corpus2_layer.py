"""A second hostile corpus, the generated package (examples/tiny-cpu.toml, and tiny-cpu-triton
on the interpreted Triton kernels): inputs of every wrong kind refused by name, and views,
strides, subclasses and modes that must give the contiguous input's output; state dicts with
values of the wrong kind; load_weights from broken safetensors files and folders, index files
pointing outside the folder, a fifo or /dev/zero, and tensors no layer holds, each refused by
name with the layer unchanged; and `python -m <package>.check` with odd arguments."""

from __future__ import annotations

import copy
import importlib
import io
import json
import os
import struct
import threading

import pytest
import torch
from conftest import EXAMPLES
from safetensors.torch import save_file

TINY = EXAMPLES / "tiny-cpu.toml"  # 16 experts, fp8 block weights from a bf16 checkpoint
TRITON = EXAMPLES / "tiny-cpu-triton.toml"
HIDDEN = 256
SHAPES = {"gate": (128, 256), "up": (128, 256), "down": (256, 128)}


@pytest.fixture(scope="module")
def package(load_layer):
    return load_layer(TINY)


@pytest.fixture(scope="module")
def layer(package):
    return package.MoELayer().random_(1)


@pytest.fixture(scope="module")
def x() -> torch.Tensor:
    return torch.randn(6, HIDDEN, generator=torch.Generator().manual_seed(5)).bfloat16()


@pytest.fixture(scope="module")
def expected(layer, x) -> torch.Tensor:
    return layer(x)


# --- inputs -------------------------------------------------------------------------------

REFUSED_INPUTS = {
    "3-D": (lambda x: x[None], ValueError, "x must be [T, 256], got [1, 6, 256]"),
    "1-D": (lambda x: x[0], ValueError, "x must be [T, 256], got [256]"),
    "0-D": (lambda x: x[0, 0], ValueError, "x must be [T, 256], got []"),
    "float32": (lambda x: x.float(), ValueError, "x must be torch.bfloat16, got torch.float32"),
    "fp8": (
        lambda x: x.to(torch.float8_e4m3fn),
        ValueError,
        "x must be torch.bfloat16, got torch.float8_e4m3fn",
    ),
    "int32": (lambda x: x.int(), ValueError, "got torch.int32"),
    "complex": (lambda x: x.float().to(torch.complex64), ValueError, "got torch.complex64"),
    "on meta": (lambda x: x.to("meta"), ValueError, "x is on meta, the weights on cpu"),
    "a list": (lambda x: x.tolist(), TypeError, "x must be a torch.Tensor [T, 256], got list"),
}


@pytest.mark.parametrize("case", REFUSED_INPUTS)
def test_an_input_of_the_wrong_kind_is_named(layer, x, case):
    make, error, fragment = REFUSED_INPUTS[case]
    with pytest.raises(error, match=fragment.replace("[", r"\[").replace("]", r"\]")):
        layer(make(x))


class _Sub(torch.Tensor):
    pass


def _inference(layer, x):
    with torch.inference_mode():
        return layer(x.clone())


def _made_in_inference_mode(layer, x):
    with torch.inference_mode():
        inner = x.clone()
    return layer(inner)


SAME_VALUES = {  # an input holding x's values in another way: x's output exactly
    "a transposed copy": lambda layer, x: layer(x.t().contiguous().t()),
    "every other column": lambda layer, x: layer(torch.stack([x, -x], 2).reshape(6, 512)[:, ::2]),
    "a storage offset": lambda layer, x: layer(torch.cat([x[:1], x])[1:]),
    "an nn.Parameter": lambda layer, x: layer(torch.nn.Parameter(x.clone(), requires_grad=False)),
    "requires_grad": lambda layer, x: layer(x.clone().requires_grad_()),
    "a Tensor subclass": lambda layer, x: layer(x.as_subclass(_Sub)),
    "conj of a real tensor": lambda layer, x: layer(x.conj()),
    "inference_mode": _inference,
    "an inference tensor outside it": _made_in_inference_mode,
    "through numpy": lambda layer, x: layer(torch.from_numpy(x.float().numpy()).bfloat16()),
    "a deepcopy of the layer": lambda layer, x: copy.deepcopy(layer)(x),
}


@pytest.mark.parametrize("case", SAME_VALUES)
def test_an_input_of_the_same_values_gives_the_same_output(layer, x, expected, case):
    out = SAME_VALUES[case](layer, x)
    assert type(out) in (torch.Tensor, _Sub) and out.dtype == torch.bfloat16
    assert torch.equal(out.as_subclass(torch.Tensor), expected)
    assert not out.requires_grad


def test_rows_of_an_input_are_computed_as_rows(layer, x):
    """Expanded (zero-stride) and overlapping inputs: each row as that row alone."""
    overlapping = torch.randn(300).bfloat16().as_strided((5, HIDDEN), (1, 1))
    for view in (x[:1].expand(6, HIDDEN), overlapping):
        assert torch.equal(layer(view), layer(view.contiguous()))


def test_no_tokens_give_no_tokens(layer, x):
    out = layer(x[:0])
    assert out.shape == (0, HIDDEN) and out.dtype == torch.bfloat16


def test_more_tokens_than_max_num_tokens_are_as_two_forwards(layer):
    many = torch.randn(257, HIDDEN, generator=torch.Generator().manual_seed(6)).bfloat16()
    assert torch.equal(layer(many), torch.cat([layer(many[:1]), layer(many[1:])]))


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 3e38])
def test_a_non_finite_row_leaves_the_other_rows_alone(layer, x, value):
    bad = torch.cat([torch.full((1, HIDDEN), value).bfloat16(), x[1:]])
    assert torch.equal(layer(bad)[1:], layer(x[1:]))


def test_the_input_is_left_as_it_was(layer, x):
    before = x.clone()
    out = layer(x)
    assert torch.equal(x, before) and out.data_ptr() != x.data_ptr()


def test_a_layer_saved_whole_runs_the_same(layer, x, expected):
    buffer = io.BytesIO()
    torch.save(layer, buffer)
    buffer.seek(0)
    assert torch.equal(torch.load(buffer, weights_only=False)(x), expected)


def test_threads_share_a_layer(layer, x, expected):
    results = []
    threads = [threading.Thread(target=lambda: results.append(layer(x))) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 4 and all(torch.equal(r, expected) for r in results)


# --- state dicts --------------------------------------------------------------------------


def _snapshot(layer) -> dict[str, bytes]:
    return {
        k: v.detach().reshape(-1).view(torch.uint8).clone() for k, v in layer.state_dict().items()
    }


def _unchanged(layer, before) -> bool:
    after = _snapshot(layer)
    return after.keys() == before.keys() and all(torch.equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize(
    ("change", "error", "fragment"),
    [
        (lambda d: d.update(gate_weight="x"), TypeError, "gate_weight is str"),
        (lambda d: d.update(gate_weight=None), TypeError, "gate_weight is NoneType"),
        (lambda d: d.update({1: torch.zeros(1)}), ValueError, "unexpected 1"),
        (lambda d: d.update(w13=d["w13"][:1]), ValueError, "w13 is [1, 256, 256]"),
    ],
    ids=["a string", "None", "an int key", "one expert"],
)
def test_a_state_dict_value_of_the_wrong_kind_is_refused(package, layer, change, error, fragment):
    target = package.MoELayer().random_(2)
    before = _snapshot(target)
    state = dict(layer.state_dict())
    change(state)
    with pytest.raises(error, match="the layer is unchanged") as raised:
        target.load_state_dict(state)
    assert fragment in str(raised.value) and _unchanged(target, before)


def test_a_partial_non_strict_state_dict_sets_no_weights(package, layer, x):
    target = package.MoELayer()
    result = target.load_state_dict({"gate_weight": layer.gate_weight}, strict=False)
    assert "w13" in result.missing_keys and not target.weights_set
    with pytest.raises(ValueError, match="the layer has no weights yet"):
        target(x)


def test_a_non_strict_state_dict_with_an_extra_name_sets_the_weights(package, layer, x, expected):
    target = package.MoELayer()
    result = target.load_state_dict({**layer.state_dict(), "bogus": torch.zeros(1)}, strict=False)
    assert result.unexpected_keys == ["bogus"] and torch.equal(target(x), expected)


# --- load_weights -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def checkpoint() -> dict[str, torch.Tensor]:
    """A bf16 checkpoint of the layer, HF names."""
    generator = torch.Generator().manual_seed(0)
    out = {
        "gate.weight": torch.randn(16, HIDDEN, generator=generator).bfloat16(),
        "gate.e_score_correction_bias": 0.02 * torch.randn(16, generator=generator),
    }
    for owner in [f"experts.{e}" for e in range(16)] + ["shared_experts"]:
        for proj, shape in SHAPES.items():
            weight = torch.randn(*shape, generator=generator) / 16
            out[f"{owner}.{proj}_proj.weight"] = weight.bfloat16()
    return out


@pytest.fixture(scope="module")
def whole(checkpoint, tmp_path_factory) -> bytes:
    path = tmp_path_factory.mktemp("whole") / "whole.safetensors"
    save_file(checkpoint, str(path))
    return path.read_bytes()


def _refused(layer, source, *fragments: str) -> str:
    before = _snapshot(layer)
    with pytest.raises(ValueError) as raised:
        layer.load_weights(source)
    message = str(raised.value)
    assert type(raised.value).__name__ == "WeightError", message
    assert "the layer is unchanged" in message and _unchanged(layer, before)
    assert len(message.splitlines()) <= 23 and max(map(len, message.splitlines())) <= 410
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    return message


def _with_header(whole: bytes, change) -> bytes:
    length = struct.unpack("<Q", whole[:8])[0]
    header = json.loads(whole[8 : 8 + length])
    change(header)
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + whole[8 + length :]


def _set(name, key, value):
    return lambda header: header[name].__setitem__(key, value)


def _overlap(header):
    header["gate.weight"]["data_offsets"] = header["experts.0.up_proj.weight"]["data_offsets"]


def _rename(header):
    header["gate.weight\x1b[2J"] = header.pop("gate.weight")


FILES = {  # the bytes of one .safetensors file -> what the message says
    "empty": (lambda w: b"", "header too small"),
    "7 bytes": (lambda w: b"\0" * 7, "header too small"),
    "a header of length 0": (lambda w: struct.pack("<Q", 0), "not a readable safetensors file"),
    "a header of length 2**63": (lambda w: struct.pack("<Q", 2**63) + b"{}", "header too large"),
    "a header past the end": (lambda w: struct.pack("<Q", 1000) + b"{}", "invalid header length"),
    "a header of no JSON": (lambda w: struct.pack("<Q", 4) + b"abcd", "invalid JSON in header"),
    "a header list": (lambda w: struct.pack("<Q", 2) + b"[]", "invalid JSON in header"),
    "a header of no tensors": (lambda w: struct.pack("<Q", 2) + b"{}", "holds no tensors"),
    "cut in half": (lambda w: w[: len(w) // 2], "not a readable safetensors file"),
    "one byte short": (lambda w: w[:-1], "not a readable safetensors file"),
    "100 bytes too long": (lambda w: w + b"\0" * 100, "not a readable safetensors file"),
    "another dtype's size": (
        lambda w: _with_header(w, _set("gate.weight", "dtype", "I64")),
        "not a readable safetensors file",
    ),
    "an unknown dtype": (
        lambda w: _with_header(w, _set("gate.weight", "dtype", "XYZ")),
        "unknown variant `XYZ`",
    ),
    "a shape of other size": (
        lambda w: _with_header(w, _set("gate.weight", "shape", [16, 128])),
        "not a readable safetensors file",
    ),
    "overlapping tensors": (lambda w: _with_header(w, _overlap), "not a readable safetensors file"),
    "a negative dim": (
        lambda w: _with_header(w, _set("gate.weight", "shape", [-1, 256])),
        "not a readable safetensors file",
    ),
    "a shape of 2**80 values": (
        lambda w: _with_header(w, _set("gate.weight", "shape", [2**40, 2**40])),
        "not a readable safetensors file",
    ),
    "metadata of a number": (
        lambda w: _with_header(w, lambda h: h.__setitem__("__metadata__", {"a": 1})),
        "not a readable safetensors file",
    ),
    "a name with an escape": (
        lambda w: _with_header(w, _rename),
        "gate.weight\\x1b[2J: unexpected",
    ),
    "a zip archive (torch.save)": (lambda w: b"PK\x03\x04" + b"\0" * 100, "a pickle file"),
}


@pytest.mark.parametrize("case", FILES)
def test_a_broken_safetensors_file_is_named(layer, whole, case, tmp_path):
    make, fragment = FILES[case]
    path = tmp_path / "w.safetensors"
    path.write_bytes(make(whole))
    _refused(layer, path, fragment)


def _index(folder, data):
    (folder / "model.safetensors.index.json").write_text(
        data if isinstance(data, str) else json.dumps(data)
    )


def _to_everything(folder, shard):
    return {"weight_map": {"gate.weight": shard, "experts.0.up_proj.weight": shard}}


FOLDERS = {  # make(folder) with whole.safetensors in it -> what the message says
    "a tensor in two shards": (
        lambda f, c: save_file({"gate.weight": c["gate.weight"]}, str(f / "z.safetensors")),
        "holds gate.weight again",
    ),
    "an index pointing up": (
        lambda f, c: _index(f, _to_everything(f, "../whole.safetensors")),
        "is in '../whole.safetensors', not a file name",
    ),
    "an index pointing to /etc/passwd": (
        lambda f, c: _index(f, _to_everything(f, "/etc/passwd")),
        "is in '/etc/passwd', not a file name",
    ),
    "an index naming a missing shard": (
        lambda f, c: _index(f, _to_everything(f, "absent.safetensors")),
        "names the shard absent.safetensors, which is not a file",
    ),
    "a weight_map list": (lambda f, c: _index(f, {"weight_map": []}), 'has no "weight_map" object'),
    "an index list": (lambda f, c: _index(f, [1]), 'has no "weight_map" object'),
    "an empty weight_map": (lambda f, c: _index(f, {"weight_map": {}}), "holds no tensors"),
    "an index of no UTF-8": (
        lambda f, c: (f / "model.safetensors.index.json").write_bytes(b"\xff\xfe"),
        "not a JSON index",
    ),
    "an index nested 100000 deep": (
        lambda f, c: _index(f, '{"weight_map": ' + "[" * 100_000 + "]" * 100_000 + "}"),
        "not a JSON index",
    ),
    "an index that is a folder": (
        lambda f, c: (f / "model.safetensors.index.json").mkdir(),
        "index.json: a folder, not a regular file",
    ),
    "an index that is a fifo": (
        lambda f, c: os.mkfifo(f / "model.safetensors.index.json"),
        "index.json: a fifo, not a regular file",
    ),
    "an index linked to /dev/zero": (
        lambda f, c: (f / "model.safetensors.index.json").symlink_to("/dev/zero"),
        "index.json: a device, not a regular file",
    ),
    "an index of 65 MiB": (
        lambda f, c: (f / "model.safetensors.index.json").write_bytes(b" " * (65 << 20)),
        "more than an index of tensor names to shard files takes (at most 64 MiB)",
    ),
    "a folder named .safetensors": (
        lambda f, c: (f / "z.safetensors").mkdir(),
        "z.safetensors: not a regular file",
    ),
}


@pytest.mark.parametrize("case", FOLDERS)
def test_a_broken_checkpoint_folder_is_named(layer, whole, checkpoint, case, tmp_path):
    make, fragment = FOLDERS[case]
    folder = tmp_path / "checkpoint"
    folder.mkdir()
    (folder / "whole.safetensors").write_bytes(whole)
    (tmp_path / "whole.safetensors").write_bytes(whole)
    make(folder, checkpoint)
    done: list[str] = []  # in a thread: a load that opens the fifo waits for a writer
    reader = threading.Thread(target=lambda: done.append(_refused(layer, folder, fragment)))
    reader.start()
    reader.join(60)
    if reader.is_alive():
        os.close(os.open(folder / "model.safetensors.index.json", os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("the load waited on the fifo")
    assert done, "the load was not refused as expected (its assertion above)"


def test_shards_that_are_links_load_as_the_files(package, whole, checkpoint, tmp_path, x):
    """A HF cache's snapshot folder: links to blobs elsewhere."""
    (tmp_path / "blob").write_bytes(whole)
    folder = tmp_path / "snapshot"
    folder.mkdir()
    (folder / "model.safetensors").symlink_to(tmp_path / "blob")
    from_links = package.MoELayer().load_weights(folder)
    assert torch.equal(from_links(x), package.MoELayer().load_weights(checkpoint)(x))


def _fused(c):
    out = {k: v for k, v in c.items() if not k.startswith("experts.")}
    out["experts.gate_up_proj"] = torch.stack(
        [
            torch.cat([c[f"experts.{e}.gate_proj.weight"], c[f"experts.{e}.up_proj.weight"]])
            for e in range(16)
        ]
    )
    out["experts.down_proj"] = torch.stack([c[f"experts.{e}.down_proj.weight"] for e in range(16)])
    return out


def _change(name, value):
    return lambda c: {**c, name: value(c[name]) if callable(value) else value}


SOURCES = {  # change(checkpoint) -> what the message says
    "a dict value": (
        _change("gate.weight", {"a": 1}),
        "gate.weight: a builtins.dict, not a tensor",
    ),
    "numpy arrays": (
        lambda c: {k: v.float().numpy() for k, v in c.items()},
        "gate.weight: a numpy.ndarray, not a tensor",
    ),
    "half the experts of the router": (
        _change("gate.weight", lambda t: t[:8]),
        "gate.weight: shape [8, 256], expected [16, 256]",
    ),
    "a transposed expert": (
        _change("experts.0.gate_proj.weight", lambda t: t.t()),
        "experts.0.gate_proj.weight: shape [256, 128], expected [128, 256]",
    ),
    "a 3-D router": (_change("gate.weight", lambda t: t[None]), "shape [1, 16, 256]"),
    "a meta tensor": (
        _change("gate.weight", lambda t: t.to("meta")),
        "gate.weight: on the meta device",
    ),
    "a sparse tensor": (
        _change("gate.weight", lambda t: t.float().to_sparse()),
        "a torch.sparse_coo tensor",
    ),
    "an expert missing": (
        lambda c: {k: v for k, v in c.items() if k != "experts.3.up_proj.weight"},
        "experts.3.up_proj.weight: missing",
    ),
    "expert 16 of 16": (
        lambda c: {**c, "experts.16.up_proj.weight": c["experts.0.up_proj.weight"]},
        "experts.16.up_proj.weight: unexpected (expert id >= 16)",
    ),
    "expert -1": (
        lambda c: {**c, "experts.-1.up_proj.weight": c["experts.0.up_proj.weight"]},
        "experts.-1.up_proj.weight: unexpected",
    ),
    "expert 10**20": (
        lambda c: {**c, f"experts.{10**20}.up_proj.weight": c["experts.0.up_proj.weight"]},
        "unexpected (expert id >= 16)",
    ),
    "expert 01 beside 1": (
        lambda c: {**c, "experts.01.up_proj.weight": c["experts.1.up_proj.weight"]},
        "experts.01.up_proj.weight: a second value of a weight",
    ),
    "fused beside split": (
        lambda c: {**c, "experts.gate_up_proj": _fused(c)["experts.gate_up_proj"]},
        "experts.gate_up_proj[0]: a second value of a weight",
    ),
    "fused of 8 experts": (
        lambda c: {**_fused(c), "experts.gate_up_proj": _fused(c)["experts.gate_up_proj"][:8]},
        "experts.gate_up_proj: shape [8, 256, 256], expected [16, 256, 256]",
    ),
    "fused of 32 experts": (
        lambda c: {
            **_fused(c),
            "experts.down_proj": torch.cat([_fused(c)["experts.down_proj"]] * 2),
        },
        "experts.down_proj: shape [32, 256, 128], expected [16, 256, 128]",
    ),
    "fused 1-D": (
        lambda c: {**_fused(c), "experts.gate_up_proj": torch.zeros(16)},
        "experts.gate_up_proj: shape [16], expected [16, 256, 256]",
    ),
    "a complex router": (
        _change("gate.weight", lambda t: t.float().to(torch.complex64)),
        "gate.weight: torch.complex64 [16, 256]",
    ),
    "float64 beyond fp32": (
        _change("gate.weight", lambda t: torch.full(t.shape, 1e300, dtype=torch.float64)),
        "gate.weight: values beyond fp32",
    ),
    "fp32 beyond bf16": (
        _change("experts.0.up_proj.weight", lambda t: torch.full(t.shape, 3.4e38)),
        "32768 of its 32768 values are beyond what bf16 holds",
    ),
    "uint8 weights": (
        _change("experts.0.up_proj.weight", lambda t: t.view(torch.uint8)[:, :256]),
        "experts.0.up_proj.weight: torch.uint8 [128, 256]",
    ),
    "an int64 bias": (
        _change("gate.e_score_correction_bias", lambda t: t.long()),
        "gate.e_score_correction_bias: torch.int64 [16]",
    ),
    "a bool bias": (
        _change("gate.e_score_correction_bias", lambda t: t > 0),
        "gate.e_score_correction_bias: torch.bool [16]",
    ),
    "nothing": (lambda c: {}, "the dict: holds no tensors"),
    "None": (lambda c: None, "cannot read weights from a NoneType"),
    "a bytes path": (lambda c: b"/tmp/w.safetensors", "cannot read weights from a bytes"),
    "an empty path": (lambda c: "", "an empty path"),
    "a path with NUL": (lambda c: "/tmp/w\x00.safetensors", "/tmp/w\\x00.safetensors"),
}


@pytest.mark.parametrize("case", SOURCES)
def test_a_checkpoint_no_layer_holds_is_named(layer, checkpoint, case):
    change, fragment = SOURCES[case]
    _refused(layer, change(checkpoint), fragment)


def test_fused_experts_load_as_split_ones(package, checkpoint, x):
    split = package.MoELayer().load_weights(checkpoint)
    assert torch.equal(package.MoELayer().load_weights(_fused(checkpoint))(x), split(x))


def test_the_layers_own_parameters_are_no_checkpoint(layer):
    before = _snapshot(layer)
    with pytest.raises(ValueError, match="load it with load_state_dict"):
        layer.load_weights(dict(layer.named_parameters()))
    assert _unchanged(layer, before)


# --- python -m <package>.check ------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--device", "meta"], "invalid choice: 'meta'"),
        (["--device", "cpu:1"], "invalid choice: 'cpu:1'"),
        (["--device", ""], "invalid choice: ''"),
        (["--tokens", "0"], "expects positive token counts"),
        (["--tokens", ""], "expects positive token counts"),
        (["--tokens", "1,0"], "expects positive token counts"),
        (["--repeats", "0"], "expects a positive count"),
        (["--repeats", "1.5"], "expects a positive count"),
        (["--seed", " 1"], "expects a whole number"),
        (["--seed", "1_0"], "expects a whole number"),
        (["--bogus"], "unrecognized arguments: --bogus"),
        (["extra"], "unrecognized arguments: extra"),
    ],
)
def test_the_check_names_an_odd_argument(package, capsys, argv, fragment):
    check = importlib.import_module(f"{package.__name__}.check")
    with pytest.raises(SystemExit) as raised:
        check.main(argv)
    captured = capsys.readouterr()
    assert raised.value.code == 2 and captured.out == ""
    assert fragment in captured.err and "Traceback" not in captured.err


# --- the Triton package -------------------------------------------------------------------


def test_the_triton_layer_takes_views_and_more_tokens_than_planned(load_layer):
    triton_package = load_layer(TRITON)
    layer = triton_package.MoELayer().random_(1)
    many = torch.randn(65, HIDDEN, generator=torch.Generator().manual_seed(9)).bfloat16()
    expected = layer(many)  # 65 > max_num_tokens = 64
    x = many[:2]
    assert torch.equal(layer(torch.stack([x, -x], 2).reshape(2, 512)[:, ::2]), expected[:2])
    assert layer(x[:0]).shape == (0, HIDDEN)
    copied = triton_package.MoELayer()
    copied.load_state_dict(layer.state_dict())
    assert copied.weights_set


def test_constructor_arguments_of_the_wrong_kind_are_named(package):
    """A group that is not a process group, and a CUDA device on a CPU-only torch, are one
    clear error each, not an assertion from inside torch or a silently kept value."""
    for group in (5, "x", object()):
        with pytest.raises(TypeError, match="group must be a torch.distributed process group"):
            package.MoELayer(group=group)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="device 'cuda'"):
            package.MoELayer(device="cuda")


def test_a_state_dict_of_meta_tensors_is_one_error_and_changes_nothing(layer, x, expected):
    meta = {name: torch.empty_like(t, device="meta") for name, t in layer.state_dict().items()}
    with pytest.raises(ValueError, match="is a meta tensor") as error:
        layer.load_state_dict(meta)
    assert "\n" not in str(error.value)
    assert torch.equal(layer(x), expected)


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_non_finite_row_of_the_triton_layer_is_its_own(load_layer, x, value):
    """The Triton selection ranks a NaN score below every real one (ids stay experts of the
    layer): that token's output is NaN, the other tokens' exactly as without it."""
    layer = load_layer(TRITON).MoELayer().random_(1)
    bad = torch.cat([torch.full((1, HIDDEN), value).bfloat16(), x[1:]])
    out = layer(bad)
    assert torch.equal(out[1:], layer(x)[1:])
    assert out[0].isnan().all()
