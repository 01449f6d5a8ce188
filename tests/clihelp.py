"""Helpers of the user-error tests: run the CLI in-process, snapshot a folder, check a refusal."""

from __future__ import annotations

import os
from pathlib import Path

from moec.cli import main


def cli(capsys, *argv: object) -> tuple[int, str, str]:
    """Run `moec argv...` in this process: (exit code, stdout, stderr)."""
    code = main([str(arg) for arg in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def snapshot(folder: Path) -> dict[str, object]:
    """Everything under `folder`: relative path -> bytes, "folder", "link -> target" or the
    file type, so a test can assert that nothing was lost or modified."""
    found: dict[str, object] = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = Path(root) / name
            key = str(path.relative_to(folder))
            if path.is_symlink():
                found[key] = f"link -> {os.readlink(path)}"
            elif path.is_dir():
                found[key] = "folder"
            elif path.is_file():
                found[key] = path.read_bytes()
            else:
                found[key] = "special"
    return found


def assert_refused(code: int, out: str, err: str, *fragments: str, lines: int | None = 1) -> None:
    """Exit 2, nothing on stdout, no traceback, `lines` message lines naming every fragment."""
    assert code == 2, (code, out, err)
    assert out == ""
    assert "Traceback" not in err
    if lines is not None:
        assert len(err.strip().splitlines()) == lines, err
    for fragment in fragments:
        assert fragment in err, (fragment, err)


LONGEST_LINE = 1000
"""A message line is a screenful at most, whatever the value it quotes."""


def refused(capsys, *argv: object, lines: int | None = 1, fragments=()) -> str:
    """Run `moec argv...`: refused as assert_refused checks, every line at most LONGEST_LINE
    characters; its stderr."""
    code, out, err = cli(capsys, *argv)
    assert_refused(code, out, err, *fragments, lines=lines)
    assert all(len(line) <= LONGEST_LINE for line in err.splitlines()), err[:2000]
    return err
