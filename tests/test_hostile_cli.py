"""Issue 28, point 4: the CLI's standard output is part of its contract. A write that fails
(full disk, closed descriptor) is exit 2 with the reason and no traceback; a reader that went
away (`| head`) ends the command quietly, as Unix tools do; an OSError of no path names the
command, not the spec."""

from __future__ import annotations

import errno
import os
import subprocess
import sys

import pytest
from clihelp import assert_refused, cli
from conftest import EXAMPLES, ROOT

import moec.cli

TINY = str(EXAMPLES / "tiny-cpu.toml")
FULL = "/dev/full"  # every write fails with ENOSPC


def moec_to(stdout, *argv: str) -> subprocess.CompletedProcess:
    """`python -m moec argv...` with standard output `stdout` (a descriptor, or None: closed)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "moec", *argv]
    if stdout is None:  # the shell's >&-: no descriptor 1 at all
        command = ["sh", "-c", 'exec "$@" >&-', "sh", *command]
    return subprocess.run(
        command, stdout=stdout, stderr=subprocess.PIPE, text=True, env=env, timeout=120
    )


def assert_no_traceback(err: str) -> None:
    assert "Traceback" not in err and "Exception ignored" not in err, err


needs_dev_full = pytest.mark.skipif(not os.path.exists(FULL), reason="no /dev/full here")


@needs_dev_full
@pytest.mark.parametrize(
    "argv",
    [
        ("explain", TINY),
        ("explain", TINY, "--format", "json"),
        ("validate", TINY),
        ("schema", "-o", "-"),
        ("explain", "--matrix"),
    ],
)
def test_a_full_disk_on_stdout_is_exit_2_with_the_reason(argv):
    with open(FULL, "w") as full:
        done = moec_to(full, *argv)
    assert done.returncode == 2, done.stderr
    assert_no_traceback(done.stderr)
    assert done.stderr == (
        "<standard output>: cannot write: No space left on device "
        "(free some space on that disk, or write elsewhere)\n"
    )


def test_a_closed_stdout_is_exit_2():
    done = moec_to(None, "explain", TINY)
    assert done.returncode == 2, done.stderr
    assert_no_traceback(done.stderr)
    assert done.stderr == "<standard output>: cannot write: standard output is closed\n"


@pytest.mark.parametrize("argv", [("explain", TINY), ("explain", "--matrix")])
def test_a_broken_pipe_ends_quietly(argv):
    """The reader closed its end before moec wrote (as `| head -1` does once it has its line)."""
    read, write = os.pipe()
    os.close(read)
    try:
        done = moec_to(write, *argv)
    finally:
        os.close(write)
    assert done.returncode == moec.cli.BROKEN_PIPE == 141
    assert done.stderr == ""


class Failing:
    """A standard output whose writes fail with `number`."""

    def __init__(self, number: int) -> None:
        self.number = number

    def write(self, text: str) -> int:
        raise OSError(self.number, os.strerror(self.number))

    def flush(self) -> None:
        pass


@pytest.mark.parametrize(
    ("number", "reason"),
    [(errno.ENOSPC, "No space left on device"), (errno.EIO, "Input/output error")],
)
def test_a_failed_write_is_told_in_process(capsys, monkeypatch, number, reason):
    monkeypatch.setattr(sys, "stdout", Failing(number))
    code = moec.cli.main(["validate", TINY])
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"<standard output>: cannot write: {reason}")
    assert isinstance(sys.stdout, Failing)  # main puts standard output back as it found it


def test_a_broken_pipe_in_process_is_silent(capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdout", Failing(errno.EPIPE))
    assert moec.cli.main(["validate", TINY]) == moec.cli.BROKEN_PIPE
    assert capsys.readouterr().err == ""


def test_an_os_error_of_no_path_names_the_command(capsys, monkeypatch):
    """A full TMPDIR is no fault of the spec's."""

    def full_tmp(args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setitem(moec.cli._COMMANDS, "explain", full_tmp)
    code, out, err = cli(capsys, "explain", TINY)
    assert_refused(code, out, err, "moec explain: cannot read or write: No space left on device")
    assert "<spec>" not in err


def test_a_path_error_still_names_its_path(capsys, monkeypatch):
    def refused(args):
        raise PermissionError(errno.EACCES, "Permission denied", "/some/folder/file")

    monkeypatch.setitem(moec.cli._COMMANDS, "explain", refused)
    code, out, err = cli(capsys, "explain", TINY)
    assert_refused(code, out, err, "/some/folder/file: cannot read or write: Permission denied")


def test_written_output_is_whole_and_exit_0(tmp_path):
    with open(tmp_path / "plan.txt", "w") as plan:
        done = moec_to(plan, "explain", TINY)
    assert done.returncode == 0 and done.stderr == ""
    text = (tmp_path / "plan.txt").read_text()
    assert text.startswith("moec ") and "tiny_cpu" in text.splitlines()[0]
