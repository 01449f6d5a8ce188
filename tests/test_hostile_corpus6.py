"""A sixth hostile corpus: a path holding a NUL byte (which no OS path can) given to `-o`,
`--from-hf` or a path argument of the Python API is one message naming it, not Python's
ValueError "embedded null byte" from stat() or open(); ... Each is exit 2, one line, nothing
written."""

from __future__ import annotations

import pytest
from clihelp import refused, snapshot
from conftest import EXAMPLES

import moec
from moec.errors import MoecError

TINY = EXAMPLES / "tiny-cpu.toml"

# --- a NUL byte in a path -----------------------------------------------------------------

NUL = "x\x00y"
NUL_SAYS = '-o = "x\\u0000y": holds a NUL byte, which no path can (a path)\n'


@pytest.mark.parametrize(
    "argv",
    [
        ("build", TINY, "-o", NUL),
        ("explain", TINY, "-o", NUL),
        ("explain", TINY, "--format", "svg", "-o", NUL),
        ("schema", "-o", NUL),
        ("init", "--from-hf", TINY, "-o", NUL),
    ],
    ids=["build", "explain", "explain-svg", "schema", "init"],
)
def test_an_out_path_with_a_nul_byte_is_one_message(argv, tmp_path, monkeypatch, capsys):
    """build, explain and schema raised ValueError('embedded null byte') from os.stat."""
    monkeypatch.chdir(tmp_path)
    err = refused(capsys, *argv)
    assert err == f"moec {argv[0]}: {NUL_SAYS}"
    assert snapshot(tmp_path) == {}


def test_a_from_hf_path_with_a_nul_byte_is_one_message(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    err = refused(capsys, "init", "--from-hf", NUL)
    assert err == f"moec init: --from-hf{NUL_SAYS[2:]}"


@pytest.mark.parametrize(
    "call, says",
    [
        (lambda: moec.build(TINY, out_dir=NUL), 'moec.build: out_dir = "x\\u0000y"'),
        (lambda: moec.load(TINY, cache_dir=NUL), 'moec.load: cache_dir = "x\\u0000y"'),
        (lambda: moec.load(NUL), 'moec.load: spec = "x\\u0000y"'),
        (lambda: moec.load_spec(NUL), 'load_spec: path = "x\\u0000y"'),
    ],
    ids=["build", "load-cache", "load-spec", "load_spec"],
)
def test_a_python_path_argument_with_a_nul_byte_is_a_usage_error(call, says, tmp_path, monkeypatch):
    """moec.build(out_dir=...) and moec.load(cache_dir=...) raised the ValueError."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(MoecError) as caught:
        call()
    assert caught.value.kind == "usage"
    assert str(caught.value) == f"{says}: holds a NUL byte, which no path can (a path)"
    assert snapshot(tmp_path) == {}
