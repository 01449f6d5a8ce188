"""A third hostile corpus, the commands: a file name with a newline or a terminal escape quoted
in a message keeps the problem on one line. Each is exit 2 with one line per problem naming the
key, no traceback."""

from __future__ import annotations

import json

import pytest
from clihelp import cli, refused, snapshot
from conftest import EXAMPLES

TINY = EXAMPLES / "tiny-cpu.toml"
HOSTILE_NAME = "evil\nname\x1b[2J.json"
"""A file name that would split a message line and clear the terminal, were it printed raw."""


# --- a file name quoted in a message --------------------------------------------------------

PLACEMENT_FILES = {  # contents of the placement file -> what the message says of it
    "missing": (None, "cannot read"),
    "not JSON": ("{", "is not JSON"),
    "no placement": (json.dumps({"format": "other"}), "not a placement file"),
    "a key twice": ('{"format": "moec-placement", "format": "moec-placement"}', "twice"),
}


@pytest.mark.parametrize("case", PLACEMENT_FILES)
def test_a_placement_file_name_with_a_newline_stays_one_line(case, tmp_path, capsys):
    text, says = PLACEMENT_FILES[case]
    path = tmp_path / HOSTILE_NAME
    if text is not None:
        path.write_text(text)
    err = refused(capsys, "validate", TINY, "--set", f"parallel.placement={json.dumps(str(path))}")
    assert says in err
    assert "evil\\x0aname\\x1b[2J.json" in err  # the name, escaped where it is quoted
    assert "\x1b" not in err


def test_an_output_inside_a_package_in_a_folder_with_a_newline_is_one_line(tmp_path, capsys):
    folder = tmp_path / "two\nlines"
    code, out, err = cli(capsys, "build", TINY, "-o", folder)
    assert code == 0, err
    before = snapshot(folder)
    err = refused(capsys, "explain", TINY, "-o", folder / "tiny_cpu" / "plan.txt")
    assert "two\\x0alines" in err and "a package moec built" in err
    assert snapshot(folder) == before
