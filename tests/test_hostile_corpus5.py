"""A fifth hostile corpus: `moec build -o -` is refused as eplb's and tune's are (not a folder
named "-"); ... Each is exit 2, one line, nothing written."""

from __future__ import annotations

import os

from clihelp import refused, snapshot
from conftest import EXAMPLES

TINY = EXAMPLES / "tiny-cpu.toml"


# --- -o - ------------------------------------------------------------------------------------


def test_build_refuses_standard_output_as_its_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    err = refused(capsys, "build", TINY, "-o", "-")
    assert err == (
        'moec build: -o = "-": is standard output, and moec build writes its package to a '
        "folder (a folder's path, or leave -o out for out/)\n"
    )
    assert snapshot(tmp_path) == {}
    assert not os.path.exists("-")
