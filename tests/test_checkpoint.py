"""Issue 9, point 6: moec/runtime/checkpoint.py reads every kind of source, reports every
problem of one read together, naming the file or tensor, and never unpickles by default."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from moec.runtime import checkpoint
from moec.runtime.checkpoint import (
    FLOATING,
    STORED,
    WIDE_FLOAT,
    WeightError,
    read_tensors,
    suggest_prefixes,
)

PREFIX = "model.layers.3.mlp."
TENSORS = {
    f"{PREFIX}gate.weight": torch.randn(4, 8),
    f"{PREFIX}experts.0.up_proj.weight": torch.randn(2, 8),
    "model.embed.weight": torch.randn(3, 8),
}


def read(source, prefix=PREFIX, expected=None, **options) -> dict[str, torch.Tensor]:
    return dict(read_tensors(source, prefix, expected, **options))


def problems_of(source, prefix=PREFIX, expected=None, **options) -> list[str]:
    with pytest.raises(WeightError) as caught:
        read(source, prefix, expected, **options)
    return caught.value.problems


def one_problem(source, *fragments: str, **options) -> str:
    (found,) = problems_of(source, **options)
    for fragment in fragments:
        assert fragment in found, (fragment, found)
    return found


def shards(folder: Path, index: bool = True) -> Path:
    """TENSORS saved in two shards (the second without a tensor under PREFIX), with an
    index.json when `index`."""
    under = sorted(n for n in TENSORS if n.startswith(PREFIX))
    weight_map = {}
    for number, part in enumerate((under, sorted(set(TENSORS) - set(under))), start=1):
        shard = f"model-{number:05d}-of-00002.safetensors"
        save_file({n: TENSORS[n] for n in part}, folder / shard)
        weight_map.update({n: shard for n in part})
    if index:
        (folder / checkpoint.INDEX).write_text(json.dumps({"weight_map": weight_map}))
    return folder


# --- sources that read --------------------------------------------------------------------

EXPECTED_NAMES = {"gate.weight", "experts.0.up_proj.weight"}


def _pairs(tmp_path):
    return iter(TENSORS.items())


def _file(tmp_path):
    save_file(TENSORS, tmp_path / "model.safetensors")
    return tmp_path / "model.safetensors"


def _string_path(tmp_path):
    return str(_file(tmp_path))


@pytest.mark.parametrize(
    "make",
    [
        lambda tmp: TENSORS,
        _pairs,
        _file,
        _string_path,
        lambda tmp: shards(tmp, index=True),
        lambda tmp: shards(tmp, index=False),
    ],
    ids=["state dict", "pairs", "safetensors", "str path", "index", "shards"],
)
def test_every_source_reads_the_tensors_under_the_prefix(make, tmp_path):
    found = read(make(tmp_path))
    assert set(found) == EXPECTED_NAMES
    assert torch.equal(found["gate.weight"], TENSORS[f"{PREFIX}gate.weight"])


def test_expected_limits_the_read(tmp_path):
    assert set(read(shards(tmp_path), expected={"gate.weight"})) == {"gate.weight"}


def test_a_shard_without_wanted_tensors_is_not_opened(tmp_path):
    folder = shards(tmp_path)
    (folder / "model-00002-of-00002.safetensors").write_bytes(b"garbage")  # embed only
    assert set(read(folder)) == EXPECTED_NAMES


def test_a_safetensors_header_whose_length_starts_like_a_pickle(tmp_path):
    """A header length of 0x..80 bytes puts 0x80 first, as a pickle starts: still safetensors
    (transformers' GLM-4.5 test model hit it)."""
    path = tmp_path / "model.safetensors"
    for pad in range(256):
        save_file(TENSORS, path, metadata={"pad": "x" * pad})
        if path.read_bytes()[0] == 0x80:
            break
    assert path.read_bytes()[0] == 0x80
    assert set(read(path)) == EXPECTED_NAMES


def test_an_opt_in_pickle_loads(tmp_path):
    torch.save(TENSORS, tmp_path / "model.bin")
    assert set(read(tmp_path / "model.bin", allow_pickle=True)) == EXPECTED_NAMES


def test_problems_list_collects_instead_of_raising():
    problems = ["the caller's own"]
    found = read({**TENSORS, f"{PREFIX}bias": torch.tensor([float("nan")])}, problems=problems)
    assert set(found) == EXPECTED_NAMES | {"bias"}  # yielded anyway: not reported missing too
    assert problems[0] == "the caller's own" and "bias" in problems[1]


# --- files and folders that do not read ---------------------------------------------------


def _truncated(tmp):
    path = _file(tmp)
    path.write_bytes(path.read_bytes()[:-50])
    return path


def _garbage(tmp):
    (tmp / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}......")
    return tmp / "model.safetensors"


def _empty(tmp):
    (tmp / "model.safetensors").write_bytes(b"")
    return tmp / "model.safetensors"


def _huge_header(tmp):
    (tmp / "model.safetensors").write_bytes(b"\xff" * 8 + b"{}")
    return tmp / "model.safetensors"


def _index_not_json(tmp):
    shards(tmp)
    (tmp / checkpoint.INDEX).write_text("{weight_map: ")
    return tmp


def _index_without_weight_map(tmp):
    shards(tmp)
    (tmp / checkpoint.INDEX).write_text(json.dumps({"metadata": {}}))
    return tmp


def _index_weight_map_list(tmp):
    shards(tmp)
    (tmp / checkpoint.INDEX).write_text(json.dumps({"weight_map": ["a"]}))
    return tmp


def _index_missing_shard(tmp):
    shards(tmp)
    (tmp / "model-00001-of-00002.safetensors").unlink()
    return tmp


def _index_shard_outside(tmp):
    (tmp / checkpoint.INDEX).write_text(
        json.dumps({"weight_map": {f"{PREFIX}gate.weight": "../x"}})
    )
    return tmp


def _index_lies(tmp):
    shards(tmp)
    data = json.loads((tmp / checkpoint.INDEX).read_text())
    data["weight_map"][f"{PREFIX}gate.weight"] = "model-00002-of-00002.safetensors"
    (tmp / checkpoint.INDEX).write_text(json.dumps(data))
    return tmp


def _folder_without_safetensors(tmp):
    (tmp / "config.json").write_text("{}")
    return tmp


def _folder_of_bins(tmp):
    torch.save(TENSORS, tmp / "pytorch_model.bin")
    return tmp


def _pickle_file(tmp):
    torch.save(TENSORS, tmp / "model.pt")
    return tmp / "model.pt"


def _pickle_without_suffix(tmp):
    torch.save(TENSORS, tmp / "weights")
    return tmp / "weights"


BAD_FILES = {
    "missing path": (lambda tmp: tmp / "nope.safetensors", "no such file or folder"),
    "truncated": (_truncated, "not a readable safetensors file"),
    "garbage": (_garbage, "not a readable safetensors file"),
    "empty file": (_empty, "not a readable safetensors file"),
    "header too large": (_huge_header, "not a readable safetensors file"),
    "index not JSON": (_index_not_json, "not a JSON index"),
    "index without weight_map": (_index_without_weight_map, '"weight_map"'),
    "weight_map a list": (_index_weight_map_list, '"weight_map"'),
    "index names a missing shard": (_index_missing_shard, "model-00001-of-00002.safetensors"),
    "index names a path": (_index_shard_outside, "not a file name"),
    "index puts a tensor in the wrong shard": (_index_lies, "which lacks them"),
    "folder without safetensors": (_folder_without_safetensors, "without *.safetensors"),
    "folder of .bin files": (_folder_of_bins, "pickle file"),
    "a .pt file": (_pickle_file, "safetensors.torch"),
    "a pickle without suffix": (_pickle_without_suffix, "weights_only=True"),
}


@pytest.mark.parametrize("case", BAD_FILES)
def test_a_bad_file_or_folder_is_one_problem_naming_it(case, tmp_path):
    make, fragment = BAD_FILES[case]
    source = make(tmp_path)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    found = problems_of(source)
    assert any(fragment in each for each in found), found
    assert any(str(tmp_path) in each or PREFIX in each for each in found), found
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


def test_pickle_advice_says_how_to_convert(tmp_path):
    found = one_problem(_pickle_file(tmp_path), "not unpickled by default", "save_file")
    assert "allow_pickle=True" in found


@pytest.mark.parametrize(
    "content", [b"not a pickle at all", b"PK\x03\x04broken zip"], ids=["text", "broken zip"]
)
def test_a_bad_pickle_with_the_opt_in(content, tmp_path):
    (tmp_path / "model.bin").write_bytes(content)
    one_problem(tmp_path / "model.bin", "torch.load(weights_only=True)", allow_pickle=True)


def test_a_pickle_of_no_state_dict(tmp_path):
    torch.save([torch.ones(1)], tmp_path / "model.pt")
    one_problem(tmp_path / "model.pt", "not a state dict", allow_pickle=True)


# --- sources that are no mapping of names to tensors --------------------------------------


@pytest.mark.parametrize(
    ("source", "fragment"),
    [
        ({1: torch.ones(1)}, "is a int, not a string"),
        ({f"{PREFIX}gate.weight": np.ones(2)}, "numpy.ndarray, not a tensor"),
        ({f"{PREFIX}gate.weight": [1.0, 2.0]}, "list, not a tensor"),
        ({f"{PREFIX}gate.weight": None}, "NoneType, not a tensor"),
        ([torch.ones(2)], "not a (name, tensor) pair"),
        ([("a", torch.ones(1), 3)], "not a (name, tensor) pair"),
        (42, "cannot read weights from an int"),
        (None, "cannot read weights from a NoneType"),
        (b"model.safetensors", "cannot read weights from a bytes"),
        (torch.nn.Linear(2, 2), "state_dict()"),
        ({}, "holds no tensors"),
    ],
    ids=lambda value: type(value).__name__ if not isinstance(value, str) else value[:20],
)
def test_a_source_that_is_not_names_to_tensors(source, fragment):
    one_problem(source, fragment, prefix="")


def test_the_prefix_must_be_a_string():
    assert "prefix" in problems_of(TENSORS, prefix=3)[0]


# --- tensors that are no weights ----------------------------------------------------------


@pytest.mark.parametrize(
    ("tensor", "kind", "fragment"),
    [
        (torch.tensor([1.0, float("nan")]), STORED, "1 of its 2 values are not finite"),
        (torch.tensor([float("inf")] * 3, dtype=torch.bfloat16), STORED, "3 of its 3 values"),
        (torch.tensor([-float("inf"), 0.0], dtype=torch.float16), STORED, "not finite"),
        (torch.tensor([1.0, float("nan")]).to(torch.float8_e4m3fn), STORED, "1 of its 2"),
        (torch.tensor([float("inf")]).to(torch.float8_e5m2), STORED, "not finite"),
        (torch.ones(4, dtype=torch.int32), STORED, "torch.int32"),
        (torch.ones(4, dtype=torch.int64), STORED, "floating point"),
        (torch.ones(4, dtype=torch.bool), STORED, "torch.bool"),
        (torch.ones(4, dtype=torch.uint8), FLOATING, "expected floating-point values"),
        (torch.ones(4).to(torch.float8_e4m3fn), WIDE_FLOAT, "needs its scale"),
        (torch.ones(4, device="meta"), STORED, "meta device"),
    ],
    ids=lambda value: str(value.dtype) if isinstance(value, torch.Tensor) else str(value),
)
def test_a_tensor_that_is_no_weight_names_the_tensor(tensor, kind, fragment):
    state = {f"{PREFIX}gate.weight": tensor, f"{PREFIX}gate.weight_scale_inv": torch.ones(1)}
    found = one_problem(state, fragment, expected={"gate.weight": kind})
    assert found.startswith(f"{PREFIX}gate.weight: ")


@pytest.mark.parametrize(
    ("tensor", "kind"),
    [
        (torch.ones(4, dtype=torch.uint8), STORED),  # packed e2m1 / UE8M0 bytes
        (torch.ones(4, dtype=torch.int8), STORED),
        (torch.ones(4).to(torch.float8_e4m3fn), FLOATING),
        (torch.ones(4, dtype=torch.bfloat16), WIDE_FLOAT),
        (torch.empty(0), STORED),
    ],
    ids=lambda value: str(value.dtype) if isinstance(value, torch.Tensor) else str(value),
)
def test_weights_of_the_right_kind_read(tensor, kind):
    assert set(read({f"{PREFIX}w": tensor}, expected={"w": kind})) == {"w"}


def test_an_fp8_weight_without_its_scale():
    fp8 = torch.ones(2, 2).to(torch.float8_e4m3fn)
    one_problem({f"{PREFIX}experts.0.up_proj.weight": fp8}, "without", "_scale_inv")
    for scale in ("weight_scale_inv", "weight_scale"):
        state = {f"{PREFIX}w.weight": fp8, f"{PREFIX}w.{scale}": torch.ones(1)}
        assert set(read(state)) == {"w.weight", f"w.{scale}"}


def test_non_finite_values_are_found_in_a_safetensors_file(tmp_path):
    bad = {**TENSORS, f"{PREFIX}gate.weight": torch.full((4, 8), float("nan"))}
    save_file(bad, tmp_path / "model.safetensors")
    one_problem(tmp_path / "model.safetensors", f"{PREFIX}gate.weight: 32 of its 32 values")


def test_every_problem_of_one_read_comes_together(tmp_path):
    folder = shards(tmp_path / "f" if (tmp_path / "f").mkdir() is None else tmp_path)
    nan = {f"{PREFIX}experts.1.up_proj.weight": torch.tensor([float("nan")])}
    save_file(nan, folder / "model-00003-of-00003.safetensors")
    (folder / "model-00004-of-00004.safetensors").write_bytes(b"junk")
    (folder / checkpoint.INDEX).unlink()
    found = problems_of(folder)
    assert len(found) == 2
    assert any("experts.1.up_proj.weight" in p for p in found)
    assert any("model-00004-of-00004.safetensors" in p for p in found)


# --- prefixes -----------------------------------------------------------------------------


def test_suggest_prefixes_names_the_layer():
    found = [f"model.layers.{n}.mlp.gate.weight" for n in (10, 3)] + ["model.layers.3.mlp.x"]
    found.append("model.layers.3.mlp.experts.0.up_proj.weight")
    layers = ["model.layers.3.mlp.", "model.layers.10.mlp."]
    assert suggest_prefixes(EXPECTED_NAMES, found) == layers
    assert suggest_prefixes(None, found) == layers  # names like a layer's
    assert suggest_prefixes({"gate.weight"}, ["gate.weight"]) == []


@pytest.mark.parametrize("expected", [EXPECTED_NAMES, None], ids=["expected", "layer names"])
def test_a_checkpoint_under_another_prefix_gets_the_prefix(expected, tmp_path):
    hint = f'under "{PREFIX}": pass that prefix'
    found = one_problem(_file(tmp_path), hint, prefix="", expected=expected)
    assert 'the prefix ""' in found


def test_the_most_matching_prefix_comes_first():
    state = {f"model.layers.{n}.mlp.experts.0.up_proj.weight": torch.ones(1) for n in (4, 5)}
    state[f"{PREFIX}gate.weight"] = torch.ones(1)
    state[f"{PREFIX}experts.0.up_proj.weight"] = torch.ones(1)
    found = one_problem(state, f'under "{PREFIX}" (and 2 other prefixes)', prefix="model.")
    assert found.startswith('no tensor of the layer is under the prefix "model."')


def test_a_prefix_nothing_is_under_shows_the_names():
    one_problem({"encoder.w": torch.ones(1)}, "its names look like encoder.w", prefix="layers.9.")


def test_names_of_another_kind_are_left_to_the_caller():
    assert set(read({"w": torch.ones(1)}, prefix="")) == {"w"}


# --- progress -----------------------------------------------------------------------------


def test_progress_on_a_terminal_only(tmp_path, monkeypatch):
    folder = shards(tmp_path, index=False)  # both shards are read
    stream = io.StringIO()
    monkeypatch.setattr("sys.stderr", stream)
    read(folder)
    assert stream.getvalue() == ""  # not a terminal
    monkeypatch.setattr(stream, "isatty", lambda: True, raising=False)
    read(folder)
    assert "loading weights: [" in stream.getvalue() and "2/2" in stream.getvalue()
    assert stream.getvalue().endswith("\n")


def test_weight_error_is_a_value_error_listing_every_problem():
    error = WeightError(["a: missing", "b: wrong shape"])
    assert isinstance(error, ValueError) and error.problems == ["a: missing", "b: wrong shape"]
    assert "a: missing" in str(error) and "b: wrong shape" in str(error)


def test_a_name_in_two_files_of_a_folder_is_a_problem(tmp_path):
    """Without an index, which of two values of one tensor is meant is unknown: reported,
    not the later file's silently taken."""
    save_file({"gate.weight": torch.zeros(2, 2)}, tmp_path / "a.safetensors")
    save_file({"gate.weight": torch.ones(2, 2)}, tmp_path / "b.safetensors")
    with pytest.raises(WeightError) as error:
        dict(read_tensors(tmp_path))
    assert "b.safetensors: holds gate.weight again" in str(error.value)


def test_the_conversion_command_runs_whole_from_a_long_odd_path(tmp_path):
    """The command a pickle file's error suggests is never clipped (a load's message clips
    each problem to _WIDTH) and survives quotes and spaces in the path: run as printed, it
    writes the safetensors file."""
    import shlex
    import subprocess
    import sys

    folder = tmp_path / ('it\'s a "long" folder ' * 12).strip()
    folder.mkdir()
    path = _pickle_file(folder)
    with pytest.raises(WeightError) as error:
        read(path)
    message = str(error.value)
    assert len(message.splitlines()[1]) > checkpoint._WIDTH  # longer than a clipped line
    command = message.split("Convert it once: ", 1)[1].split(" ; or pass", 1)[0]
    argv = shlex.split(command)
    assert argv[0] == "python"
    subprocess.run([sys.executable, *argv[1:]], check=True, capture_output=True)
    assert path.with_suffix(".safetensors").is_file()
