"""`--cpu` (or `--set target.device=cpu`) makes every example, GPU ones included, a CPU spec
that validates, printing each change it made as one line (moec/spec/cpu.py)."""

from __future__ import annotations

import json
import re

import pytest
from clihelp import assert_refused, cli
from conftest import EXAMPLES

from moec.spec import cpu, load_spec

SPECS = sorted(EXAMPLES.glob("*.toml"))
CHANGE = re.compile(r"^(?P<file>[^:]+):(?P<line>\d+): (?P<key>[a-z_.]+) = (?P<value>\S+): (.+)$")


@pytest.mark.parametrize("example", SPECS, ids=[e.stem for e in SPECS])
def test_every_example_validates_on_the_cpu(example, capsys):
    """Not --portable: the CPU spec names no package a CPU cannot have."""
    as_written = load_spec(example).spec
    code, out, err = cli(capsys, "validate", "--cpu", example)
    assert (code, out) == (0, "ok\n"), err
    changes = err.splitlines()
    loaded = load_spec(example, ["target.device=cpu"])
    assert list(loaded.changes) == changes
    spec = loaded.spec
    assert spec.target.device == "cpu" and spec.target.arch is None and spec.target.gpu is None
    assert spec.experts.gemm_backend != "deep_gemm"
    assert not spec.parallel.dispatch.startswith("deepep")
    if as_written.target.device == "cpu":
        assert changes == []
        return
    gpu_keys = {
        "target.arch": as_written.target.arch is not None,
        "target.gpu": as_written.target.gpu is not None,
        "experts.gemm_backend": as_written.experts.gemm_backend == "deep_gemm",
        "parallel.dispatch": as_written.parallel.dispatch.startswith("deepep"),
    }
    lines = example.read_text().splitlines()
    keys = []
    for line in changes:  # where, the key and its value as written, what is done and why
        found = CHANGE.match(line)
        assert found and found["file"] == str(example) and "for the CPU: " in line, line
        assert lines[int(found["line"]) - 1].startswith(found["key"].split(".")[1] + " = ")
        keys.append(found["key"])
    assert sorted(keys) == sorted(key for key, gpu_only in gpu_keys.items() if gpu_only)


def test_deep_gemm_and_deepep_are_replaced_saying_why(capsys):
    code, out, err = cli(capsys, "validate", "--cpu", EXAMPLES / "deepseek-v4-flash.toml")
    assert code == 0
    assert 'experts.gemm_backend = "deep_gemm": now "torch" for the CPU: DeepGEMM runs on' in err
    code, out, err = cli(capsys, "validate", "--cpu", EXAMPLES / "deepseek-v3-deepep-ll-ep8.toml")
    assert code == 0
    assert 'parallel.dispatch = "deepep_low_latency": now "all2all" for the CPU' in err
    assert (
        load_spec(
            EXAMPLES / "deepseek-v3-deepep-ll-ep8.toml", ["target.device=cpu"]
        ).spec.parallel.ep_size
        == 8
    )


def test_set_device_is_the_same_and_a_key_set_beside_it_is_kept(capsys):
    fp8 = EXAMPLES / "deepseek-v3-fp8.toml"
    code, out, err = cli(capsys, "validate", fp8, "--set", "target.device=cpu")
    assert code == 0
    assert (
        err
        == f'{fp8}:20: target.arch = "sm90": left out for the CPU: a CPU target has no CUDA architecture\n'
    )
    code, out, err = cli(capsys, "validate", fp8, "--cpu", "--set", "target.arch=sm90")
    assert_refused(code, out, err, "target.arch", "a CPU target has no CUDA architecture")
    # a later --set of the device wins, as for any key
    code, out, err = cli(capsys, "validate", fp8, "--cpu", "--set", "target.device=cuda")
    assert (code, err) == (0, "")


def test_build_and_explain_take_it(capsys, tmp_path):
    fp8 = EXAMPLES / "deepseek-v3-fp8.toml"
    code, out, err = cli(capsys, "build", fp8, "--cpu", "-o", tmp_path)
    assert code == 0 and "left out for the CPU" in err
    built = json.loads((tmp_path / "deepseek_v3_fp8" / "spec.json").read_text())
    assert built["target"]["device"] == "cpu" and built["target"]["arch"] is None
    code, out, err = cli(capsys, "explain", fp8, "--cpu", "--tokens", "1")
    assert code == 0 and "target: cpu bfloat16" in out and err.count("\n") == 1


def test_python_callers_get_the_changes_without_printing(capsys):
    cpu.report_to(None)
    loaded = load_spec(EXAMPLES / "kimi-k2.toml", ["target.device=cpu"])
    assert capsys.readouterr().err == ""
    assert len(loaded.changes) == 1 and "target.arch" in loaded.changes[0]
