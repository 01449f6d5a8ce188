"""Probes of the moec command as a user meets it: a build beside a leftover-named folder moec
did not make, a Ctrl-C while the command starts, and the single-file outputs (explain, schema,
eplb -o) replaced only while they are as moec wrote them."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from clihelp import assert_refused, cli, snapshot
from conftest import EXAMPLES, ROOT

from moec.codegen.ownership import MARKER, marker_bytes

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

TINY = EXAMPLES / "tiny-cpu.toml"


# --- (6) leftovers of killed builds: recognized by the marker only ------------------------


def test_build_leaves_an_empty_folder_of_a_leftover_name(tmp_path, capsys):
    """An empty `.tiny_cpu.moec-<hex>` holds no marker: moec cannot tell it from a user's
    folder, so the build keeps it (and succeeds); a leftover with the marker is removed."""
    empty = tmp_path / ".tiny_cpu.moec-0123abcd"
    empty.mkdir()
    killed = tmp_path / ".tiny_cpu.moec-99aa"
    killed.mkdir()
    (killed / MARKER).write_bytes(marker_bytes({"plan.json": b"{}\n"}))
    code, out, err = cli(capsys, "build", TINY, "-o", tmp_path)
    assert code == 0, err
    assert sorted(p.name for p in tmp_path.iterdir()) == [empty.name, "tiny_cpu"]
    assert empty.is_dir() and not any(empty.iterdir())


# --- (7) a Ctrl-C while moec.cli loads --------------------------------------------------


_CTRL_C_AT_IMPORT = """
import sys

class CtrlC:
    '''Raises KeyboardInterrupt when pydantic is imported: while moec.cli's imports load.'''

    def find_spec(self, name, path=None, target=None):
        if name == "pydantic":
            raise KeyboardInterrupt
        return None

sys.meta_path.insert(0, CtrlC())
"""


def _commands() -> list[list[str]]:
    found = [[sys.executable, "-m", "moec"]]
    script = Path(sys.executable).with_name("moec")
    if script.exists():  # the console script the editable install made
        found.append([str(script)])
    return found


@pytest.mark.parametrize("command", _commands(), ids=lambda argv: Path(argv[-1]).name)
def test_ctrl_c_while_the_command_starts_exits_130_without_traceback(tmp_path, command):
    (tmp_path / "sitecustomize.py").write_text(textwrap.dedent(_CTRL_C_AT_IMPORT))
    paths = [str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    done = subprocess.run(
        [*command, "validate", str(TINY)], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 130, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr and done.stdout == ""


def test_the_console_script_is_the_entry_module():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"moec": "moec.entry:main"}
    assert "from moec.entry import main" in (ROOT / "moec" / "__main__.py").read_text()


def test_the_entry_module_and_the_cli_agree_on_ctrl_c(monkeypatch, capsys):
    """Ctrl-C later, inside a command: the same exit status, nothing printed."""
    import moec.cli
    from moec.entry import INTERRUPTED, main

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setitem(moec.cli._COMMANDS, "validate", interrupted)
    monkeypatch.setattr(sys, "argv", ["moec", "validate", str(TINY)])
    assert INTERRUPTED == 130 and main() == INTERRUPTED
    assert capsys.readouterr() == ("", "")


# --- (9) explain, schema and eplb -o replace only their own unchanged output ----------------


def record_path(path: Path) -> Path:
    """Where moec keeps the record of the file at `path`: beside it, hidden."""
    return path.with_name(f".{path.name}.moec")


def _records(path: Path) -> bool:
    """Whether the record beside `path` holds the sha256 of its bytes now."""
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return record_path(path).read_text().splitlines()[-1] == f"sha256 {digest}"


def _load(tmp_path: Path) -> Path:
    load = tmp_path / "load.json"
    load.write_text(json.dumps({"format": "moec-load", "load": [1, 2, 3, 4]}))
    return load


_WRITERS = {
    "explain text": lambda tmp, out: ["explain", TINY, "-o", out],
    "explain json": lambda tmp, out: ["explain", TINY, "--format", "json", "-o", out],
    "explain svg": lambda tmp, out: ["explain", TINY, "--format", "svg", "-o", out],
    "matrix": lambda tmp, out: ["explain", "--matrix", "-o", out],
    "schema": lambda tmp, out: ["schema", "-o", out],
    "eplb": lambda tmp, out: ["eplb", _load(tmp), "-o", out, "--ranks", "2"],
}


def _edits(path: Path) -> list:
    """Ways a user changes a file moec wrote, each keeping moec's mark where it is (and a JSON
    file JSON)."""
    return [
        lambda: path.write_bytes(path.read_bytes() + b"\n"),  # a line added at the end
        lambda: path.write_bytes(path.read_bytes()[:-1] + b" \n"),  # a space at the end
    ]


@pytest.mark.parametrize("writer", _WRITERS)
def test_an_output_edited_since_moec_wrote_it_is_left_alone(writer, tmp_path, capsys):
    out = tmp_path / "out.file"
    argv = _WRITERS[writer](tmp_path, out)
    for _ in range(2):  # written, then replaced: unchanged, it is moec's
        assert cli(capsys, *argv)[0] == 0
    assert _records(out)
    for edit in _edits(out):
        edit()
        before = snapshot(tmp_path)
        code, text, err = cli(capsys, *argv)
        assert_refused(code, text, err, str(out), "was changed after moec wrote it")
        assert "remove it first, or write to another path" in err
        assert snapshot(tmp_path) == before
    out.unlink()  # the user's way on: remove it (its record may stay)
    assert cli(capsys, *argv)[0] == 0


@pytest.mark.parametrize("writer", _WRITERS)
def test_an_output_without_its_record_is_left_alone(writer, tmp_path, capsys):
    """A file with moec's mark but no record (copied, or written by an earlier moec) may have
    been edited: moec cannot tell, so it leaves it."""
    out = tmp_path / "out.file"
    argv = _WRITERS[writer](tmp_path, out)
    assert cli(capsys, *argv)[0] == 0
    record_path(out).unlink()
    before = snapshot(tmp_path)
    code, text, err = cli(capsys, *argv)
    assert_refused(code, text, err, str(out), "carries no record", str(record_path(out)))
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize(
    "record",
    [
        lambda path: path.write_text("my notes\n"),  # a user's file of the record's name
        lambda path: path.mkdir(),
        lambda path: path.symlink_to("elsewhere"),
    ],
    ids=["file", "folder", "link"],
)
def test_a_record_name_moec_did_not_make_is_left_alone(record, tmp_path, capsys):
    out = tmp_path / "plan.txt"
    record(record_path(out))
    before = snapshot(tmp_path)
    code, text, err = cli(capsys, "explain", TINY, "-o", out)
    assert_refused(code, text, err, str(record_path(out)), "not the record moec keeps")
    assert snapshot(tmp_path) == before


def test_an_edited_record_is_refused(tmp_path, capsys):
    out = tmp_path / "s.json"
    assert cli(capsys, "schema", "-o", out)[0] == 0
    record = record_path(out)
    record.write_bytes(record.read_bytes().replace(b"sha256 ", b"sha256 0"))
    code, text, err = cli(capsys, "schema", "-o", out)
    assert_refused(code, text, err, str(out), "is not as moec writes it")


def test_standard_output_writes_no_record(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli(capsys, "explain", TINY, "-o", "-")[0] == 0
    assert cli(capsys, "schema", "-o", "-")[0] == 0
    assert list(tmp_path.iterdir()) == []


def test_the_committed_outputs_carry_their_records():
    """`make schema` and `make figures` replace the repository's own outputs: each has its
    record, so that they still may."""
    for path in (
        ROOT / "schemas" / "moec-spec.schema.json",
        ROOT / "docs" / "figures" / "plan-deepseek-v3-fp8.svg",
    ):
        assert _records(path), path
