"""The spec.toml a package carries parses to the spec it was built from: the file as it was, or,
with --set overrides, the spec as built written back as TOML, whatever the strings hold; and
spec strings stay on their line wherever moec writes them."""

from __future__ import annotations

from pathlib import Path

import pytest

from moec.codegen import spec_copy
from moec.spec import load_spec, parse_spec
from moec.spec.toml_text import one_line, string

EXAMPLES = sorted((Path(__file__).resolve().parents[1] / "examples").glob("*.toml"))
NASTY = [
    "two\nlines",
    'quotes " and """ and \\ backslash',
    "# not a comment\r\n[model]\nhidden_size = 1",
    "controls \x00\x01\x1f\x7f and \u2028\u2029\x85 separators",
    "unicode é ß 中文 😀 and a tab\there",
]


@pytest.mark.parametrize("text", NASTY)
def test_a_toml_string_holds_any_text(text):
    import tomli

    assert tomli.loads(f"x = {string(text)}")["x"] == text
    assert "\n" not in one_line(text) and len(one_line(text).splitlines()) == 1


def _copy(loaded) -> str:
    return spec_copy(loaded)


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_the_copy_parses_to_the_built_spec(example):
    plain = load_spec(example)
    assert parse_spec(_copy(plain)).content_hash == plain.content_hash
    changed = load_spec(example, [f"description={string(NASTY[3] + NASTY[0])}"])
    copy = _copy(changed)
    assert copy.startswith("# The spec of ") and copy.splitlines()[0].count("--set") == 1
    assert parse_spec(copy).content_hash == changed.content_hash


def test_an_override_with_a_raw_newline_stays_in_its_comment():
    """A multi-line literal string in --set puts a real newline in the value: the header
    writes it escaped, and the copy still parses to the same spec."""
    loaded = load_spec(EXAMPLES[0], ["description='''first\n[model]\nhidden_size = 1'''"])
    copy = _copy(loaded)
    header = [line for line in copy.splitlines() if line.startswith("#")]
    assert len(header) == 2 and "\\u000a" in header[0]
    assert parse_spec(copy).content_hash == loaded.content_hash


def test_bidirectional_and_zero_width_controls_are_escaped():
    """A right-to-left override or a zero-width space of a --set value is written as an escape
    in the copy's comment and its strings, so no editor shows the line reordered or hidden,
    and the copy still parses to the same spec."""
    hidden = "admin\u202e\u2066 \u200bnote\ufeff"
    loaded = load_spec(EXAMPLES[0], [f"description={string(hidden)}"])
    copy = _copy(loaded)
    assert not any(char in copy for char in "\u202e\u2066\u200b\ufeff")
    assert "\\u202e" in copy.splitlines()[0] and 'description = "admin\\u202e' in copy
    assert parse_spec(copy).spec.description == hidden


def test_a_spec_naming_a_placement_file_is_copied_with_the_placement_in_it(tmp_path):
    """The copy lies in the package, where the spec's relative file name names no file (or
    another one later): the copy holds the placement it was built with, and parses alone."""
    import json

    placement = {"format": "moec-placement", "physical_to_logical": [[0, 2, 4, 6], [1, 3, 5, 7]]}
    (tmp_path / "place.json").write_text(json.dumps(placement))
    spec = (
        'name = "two_ranks"\n[model]\nhidden_size = 64\nmoe_intermediate_size = 32\n'
        'n_routed_experts = 8\nnum_experts_per_tok = 2\n[experts]\ngemm_backend = "torch"\n'
        '[target]\ndevice = "cpu"\ndtype = "float32"\n'
        '[parallel]\nep_size = 2\ndispatch = "all2all"\nplacement = "place.json"\n'
    )
    (tmp_path / "spec.toml").write_text(spec)
    loaded = load_spec(tmp_path / "spec.toml")
    copy = _copy(loaded)
    assert copy.startswith("# The spec of spec.toml as built with its placement file read into")
    assert "place.json" not in copy
    assert parse_spec(copy, folder=tmp_path / "elsewhere").content_hash == loaded.content_hash
    inline = spec.replace('"place.json"', "[[0, 2, 4, 6], [1, 3, 5, 7]]")
    assert _copy(parse_spec(inline)).startswith("# Copy of <spec> as built\n")


def test_a_copy_of_a_copy_has_one_header(tmp_path):
    """Building from a package's spec.toml writes one "Copy of" line, not one per build."""
    first = _copy(load_spec(EXAMPLES[0]))
    (tmp_path / "spec.toml").write_text(first)
    again = _copy(load_spec(tmp_path / "spec.toml"))
    assert again.count("# Copy of ") == 1 and again.startswith("# Copy of spec.toml as built\n")
    assert parse_spec(again).content_hash == load_spec(EXAMPLES[0]).content_hash


def test_a_relative_schema_pointer_is_dropped(tmp_path):
    """The examples' first line, `#:schema ../schemas/...`, names the schema from examples/:
    from the package it would name no file, so the copy drops it; a URL is kept."""
    text = EXAMPLES[0].read_text()
    assert text.startswith("#:schema ../schemas/")
    copy = _copy(load_spec(EXAMPLES[0]))
    assert "#:schema" not in copy
    assert parse_spec(copy).content_hash == load_spec(EXAMPLES[0]).content_hash
    url = "#:schema https://example.com/moec-spec.schema.json\n"
    (tmp_path / "spec.toml").write_text(url + text.split("\n", 1)[1])
    assert _copy(load_spec(tmp_path / "spec.toml")).split("\n")[1] == url.strip()
