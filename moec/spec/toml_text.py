"""A spec's plain data written back as TOML, and any text made safe for one TOML comment line.

Used for the spec.toml a package carries when `--set` changed the file's spec: the copy is the
spec as built (every default explicit), and it parses back to the same spec. Strings are TOML
basic strings with every character TOML forbids raw escaped.
"""

from __future__ import annotations

import math
import re
from typing import Any

from moec.errors import INVISIBLE

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_LINE_BREAKING = {"\u2028", "\u2029", "\x85"}  # break a line for editors and str.splitlines
_INVISIBLE = re.compile(f"[{INVISIBLE}]")  # reorder or hide text on a reader's screen


def _needs_escape(char: str) -> bool:
    """What TOML forbids raw in basic strings and comments (controls but tab, DEL), plus the
    characters other tools take for line breaks, lone surrogates (UTF-8 cannot hold them),
    and the zero-width and bidirectional controls (a right-to-left override in a value would
    show the rest of its line reversed in an editor: the escape parses back the same)."""
    code = ord(char)
    surrogate = 0xD800 <= code <= 0xDFFF  # a file name's bytes that are not UTF-8
    return (
        (code < 0x20 and char != "\t")
        or code == 0x7F
        or char in _LINE_BREAKING
        or surrogate
        or _INVISIBLE.match(char) is not None
    )


def one_line(text: str) -> str:
    """`text` with every control, line-breaking or invisible character written as \\uXXXX."""
    return "".join(f"\\u{ord(c):04x}" if _needs_escape(c) else c for c in text)


def string(text: str) -> str:
    """A TOML basic string holding `text` exactly."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{one_line(escaped)}"'


def value(item: Any) -> str:
    if isinstance(item, bool):
        return "true" if item else "false"
    if isinstance(item, int):
        return str(item)
    if isinstance(item, float):
        if math.isnan(item):
            return "nan"
        if math.isinf(item):
            return "inf" if item > 0 else "-inf"
        return repr(item)
    if isinstance(item, str):
        return string(item)
    if isinstance(item, (list, tuple)):
        return "[" + ", ".join(value(each) for each in item) + "]"
    raise TypeError(f"no TOML value for {type(item).__name__}")


def key(name: str) -> str:
    return name if _BARE_KEY.fullmatch(name) else string(name)


def dumps(data: dict[str, Any], prefix: tuple[str, ...] = ()) -> str:
    """TOML of nested dicts of scalars and lists: a table's scalars, then its sub-tables;
    None values are left out (TOML has no null)."""
    lines = [
        f"{key(k)} = {value(v)}"
        for k, v in data.items()
        if v is not None and not isinstance(v, dict)
    ]
    for name, table in data.items():
        if isinstance(table, dict):
            path = (*prefix, name)
            lines += [
                "",
                f"[{'.'.join(key(part) for part in path)}]",
                dumps(table, path).rstrip("\n"),
            ]
    return "\n".join(line for line in lines) + "\n"
