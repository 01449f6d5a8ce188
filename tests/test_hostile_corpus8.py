"""An eighth hostile corpus, of what a fuzzer found wrong in the generated layer:
- a hash-routed layer on Triton read strided or expanded token ids as if they were contiguous
  (other experts, a wrong output); ids of another shape than [T] with T elements, or sparse
  ones, were taken or failed inside torch;
- a Triton layer read an input with torch's negation bit (a view such as `t.conj().imag`) as its
  memory, negated: a wrong output; load_state_dict(..., assign=True) took such a view as a
  parameter;
- `write_expert_load(path)` wrote over any file (a hand-made load file too), through a symbolic
  link, into a folder's name or a built package, and took an int as a file descriptor (closing
  stdout for 1);
- load_weights read `experts.<i>.` of another script's digits (Arabic-Indic) as expert i;
- an index naming a missing shard for every tensor was also told "pass that prefix" of a prefix
  the names do not have;
- a spec or config path "-" (standard input, which moec does not read) was "No such file";
- a key of other case than moec's got no suggestion; a right-to-left override or a zero-width
  space in a path reached the terminal as it is.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
from conftest import EXAMPLES

TINY = EXAMPLES / "tiny-cpu.toml"
TRITON = EXAMPLES / "tiny-cpu-triton.toml"
HASH = (
    "router.topk_method=hash",
    "model.vocab_size=64",
    "router.n_group=1",
    "router.topk_group=1",
    "router.scoring_func=sqrtsoftplus",
)

# --- token ids ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def triton_hash_layer(load_layer):
    return load_layer(TINY, *HASH, "experts.gemm_backend=triton").MoELayer().random_(1)


@pytest.mark.parametrize(
    "ids",
    [
        torch.tensor([1, 0, 2, 0, 3, 0, 4, 0])[::2],
        torch.tensor([[1, 9], [2, 9], [3, 9], [4, 9]])[:, 0],
    ],
    ids=["every-other", "a-column"],
)
def test_triton_hash_layer_reads_strided_ids_as_their_values(triton_hash_layer, ids):
    x = torch.randn(4, 256, generator=torch.Generator().manual_seed(0)).bfloat16()
    assert not ids.is_contiguous()
    assert torch.equal(triton_hash_layer(x, ids), triton_hash_layer(x, ids.contiguous()))


def test_triton_hash_layer_reads_expanded_ids_as_their_values(triton_hash_layer):
    x = torch.randn(4, 256, generator=torch.Generator().manual_seed(1)).bfloat16()
    expanded = torch.tensor([5]).expand(4)
    assert torch.equal(triton_hash_layer(x, expanded), triton_hash_layer(x, torch.full((4,), 5)))


@pytest.mark.parametrize(
    "ids, error, says",
    [
        (torch.tensor([[1, 2], [3, 4]]), ValueError, "token_ids must be [4] int64 or int32 ids"),
        (torch.tensor([[1], [2], [3], [4]]), ValueError, "got torch.int64 [4, 1]"),
        (torch.tensor([1, 2, 3, 4]).to_sparse(), TypeError, "token_ids must be a dense tensor"),
    ],
    ids=["2x2", "4x1", "sparse"],
)
def test_token_ids_of_another_shape_or_layout_are_refused(triton_hash_layer, ids, error, says):
    with pytest.raises(error) as raised:
        triton_hash_layer(torch.randn(4, 256).bfloat16(), ids)
    assert says in str(raised.value)


# --- torch's negation bit -------------------------------------------------------------------


@pytest.fixture(scope="module")
def triton_layer(load_layer):
    return load_layer(TRITON, "target.dtype=float32").MoELayer().random_(1)


def test_an_input_with_the_negation_bit_is_read_as_its_values(triton_layer):
    view = torch.randn(3, 256, dtype=torch.complex64).conj().imag
    assert view.is_neg()
    assert torch.equal(triton_layer(view), triton_layer(view.resolve_neg()))


@pytest.mark.parametrize("name", ["w13_scale", "w2_scale"])
def test_assign_refuses_a_parameter_with_the_negation_bit(triton_layer, name):
    state = {key: value.clone() for key, value in triton_layer.state_dict().items()}
    before = triton_layer.state_dict()[name].clone()
    state[name] = (-state[name])._neg_view()  # the same values, negated in memory
    with pytest.raises(ValueError) as raised:
        triton_layer.load_state_dict(state, assign=True)
    assert f"{name} is a view with torch's negation bit set" in str(raised.value)
    assert "tensor.resolve_neg()" in str(raised.value)
    assert torch.equal(triton_layer.state_dict()[name], before)


# --- write_expert_load ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def counting_layer(load_layer):
    layer = load_layer(TINY, "parallel.record_load=true").MoELayer().random_(2)
    layer(torch.randn(5, 256).bfloat16())
    return layer


def test_write_expert_load_writes_and_rewrites_its_own_file(counting_layer, tmp_path):
    path = tmp_path / "load.json"
    load = counting_layer.write_expert_load(path)
    assert sum(load) == 5 * 4  # every token's top-k
    written = json.loads(path.read_text())
    assert {key: written[key] for key in ("format", "layer", "load")} == {
        "format": "moec-load",
        "layer": "tiny_cpu",
        "load": load,
    }
    assert counting_layer.write_expert_load(str(path)) == load  # its own load file: replaced
    assert sorted(os.listdir(tmp_path)) == ["load.json"]  # no temporary file left


def _load_file(folder, **changes):
    path = folder / "load.json"
    path.write_text(json.dumps({"format": "moec-load", "load": [1, 2], **changes}))
    return path


def _edited(folder, counting_layer):
    path = folder / "load.json"
    counting_layer.write_expert_load(path)
    written = json.loads(path.read_text())
    written["load"][0] += 1
    path.write_text(json.dumps(written))
    return path


def _in_a_package(folder):
    from moec.cli import main

    assert main(["build", str(TINY), "-o", str(folder / "built")]) == 0
    return next((folder / "built").iterdir()) / "load.json"


@pytest.mark.parametrize(
    "make, says",
    [
        (
            lambda d: (d / "notes.txt").write_text("mine") and d / "notes.txt",
            "exists and is no load file moec wrote",
        ),
        (
            lambda d: (d / "x.json").symlink_to(d / "target.json") or d / "x.json",
            "is a symbolic link",
        ),
        (lambda d: d, "is a folder"),
        (lambda d: d / "absent" / "load.json", "is in no folder"),
        (lambda d: "", "is no path"),
        (lambda d: _load_file(d, note="mine"), "exists and is no load file moec wrote"),
        (_in_a_package, "a package moec built"),
    ],
    ids=["a-users-file", "a-link", "a-folder", "no-folder", "empty", "hand-made", "in-a-package"],
)
def test_write_expert_load_refuses_a_path_it_may_not_write(counting_layer, tmp_path, make, says):
    (tmp_path / "target.json").write_text("{}")
    path = make(tmp_path)
    before = {
        name: (tmp_path / name).read_bytes()
        for name in os.listdir(tmp_path)
        if (tmp_path / name).is_file()
    }
    with pytest.raises(ValueError) as raised:
        counting_layer.write_expert_load(path)
    assert says in str(raised.value)
    after = {
        name: (tmp_path / name).read_bytes()
        for name in os.listdir(tmp_path)
        if (tmp_path / name).is_file()
    }
    assert after == before


@pytest.mark.parametrize("path", [1, None, 2.5, True])
def test_write_expert_load_takes_paths_only(counting_layer, path):
    with pytest.raises(TypeError) as raised:
        counting_layer.write_expert_load(path)
    assert "path must be a str or os.PathLike" in str(raised.value)


# --- checkpoint names -----------------------------------------------------------------------


@pytest.mark.parametrize("index", ["\u0661", "\uff11"], ids=["arabic", "fullwidth"])
def test_an_expert_index_of_other_digits_is_no_experts_name(load_layer, index):
    layer = load_layer(TINY).MoELayer()
    name = f"experts.{index}.gate_proj.weight"
    with pytest.raises(ValueError) as raised:  # the package's WeightError
        layer.load_weights({name: torch.zeros(128, 256)})
    assert type(raised.value).__name__ == "WeightError"
    assert f"{name}: unexpected" in str(raised.value)


# --- standard input -------------------------------------------------------------------------


@pytest.mark.parametrize("argv", [("validate", "-"), ("build", "-"), ("init", "--from-hf", "-")])
def test_a_path_dash_is_standard_input_which_moec_does_not_read(
    argv, tmp_path, monkeypatch, capsys
):
    from clihelp import refused

    monkeypatch.chdir(tmp_path)
    err = refused(capsys, *argv)
    assert err.startswith("-: ") and "is standard input, which moec does not read" in err
    assert os.listdir(tmp_path) == []


# --- messages -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "setting, meant",
    [
        ("model.HIDDEN_SIZE=256", "(did you mean hidden_size?)"),
        ("ROUTER.n_group=1", "(did you mean router?)"),
        ("router.Topk_Group=1", "(did you mean topk_group?)"),
    ],
)
def test_a_key_of_other_case_is_told_the_key(setting, meant, capsys):
    from clihelp import refused

    assert meant in refused(capsys, "validate", TINY, "--set", setting)


@pytest.mark.parametrize("char", ["\u202e", "\u200b", "\u2066"])
def test_an_invisible_character_in_a_path_is_escaped(char, tmp_path, monkeypatch, capsys):
    from clihelp import refused

    monkeypatch.chdir(tmp_path)
    err = refused(capsys, "validate", f"a{char}b.toml")
    assert char not in err and f"a\\u{ord(char):04x}b.toml" in err


def test_write_expert_load_refuses_its_own_file_edited(counting_layer, tmp_path):
    path = _edited(tmp_path, counting_layer)
    before = path.read_bytes()
    with pytest.raises(ValueError) as raised:
        counting_layer.write_expert_load(path)
    assert "exists and is no load file moec wrote (or it was edited)" in str(raised.value)
    assert path.read_bytes() == before


def test_a_missing_shard_is_the_one_problem(tmp_path, capsys):
    from clihelp import refused

    names = ["gate.weight", "gate.e_score_correction_bias"]
    names += [
        f"experts.{e}.{p}.weight" for e in range(16) for p in ("gate_proj", "up_proj", "down_proj")
    ]
    index = {"metadata": {}, "weight_map": dict.fromkeys(names, "missing.safetensors")}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    err = refused(capsys, "run", TINY, "--tokens", "2", "--weights", tmp_path)
    assert "names the shard missing.safetensors, which is not a file in" in err
    assert "prefix" not in err
