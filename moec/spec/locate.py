"""Where each key of a TOML document is written, so messages can point at a line.

tomli parses values but keeps no positions; this scanner reads the text once more and maps
each dotted key path to the 1-based line that defines it. It understands table headers, dotted
keys and inline tables, which is all a spec uses; anything it cannot place falls back to the
line of the nearest enclosing table.
"""

from __future__ import annotations

import re

_HEADER = re.compile(r"^\s*\[\[?\s*([^\[\]]+?)\s*\]\]?\s*(#.*)?$")
_KEY = re.compile(
    r"""^\s*((?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*')(?:\s*\.\s*(?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*'))*)\s*="""
)
_INLINE_KEY = re.compile(r"""[{,]\s*([A-Za-z0-9_-]+|"[^"]*")\s*=""")


def _split(dotted: str) -> list[str]:
    return [part.strip().strip("\"'") for part in dotted.split(".")]


def key_lines(text: str) -> dict[str, int]:
    """Map `table.key` (and `table`) to the line that defines it."""
    lines: dict[str, int] = {}
    table: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        header = _HEADER.match(line)
        if header:
            table = _split(header.group(1))
            lines.setdefault(".".join(table), number)
            continue
        key = _KEY.match(line)
        if not key:
            continue
        path = table + _split(key.group(1))
        lines.setdefault(".".join(path), number)
        rest = line[key.end() :]
        if rest.lstrip().startswith("{"):
            for inner in _INLINE_KEY.finditer(rest):
                lines.setdefault(".".join(path + [inner.group(1).strip("\"'")]), number)
    return lines


_LONG_NUMBER = re.compile(r"[0-9][0-9_]{4000,}")
"""Digits near what Python converts to an int at most (4,300 by default), underscores allowed."""


def long_number(text: str) -> tuple[int, int] | None:
    """(line, digits) of the first number in `text` too long for Python to convert, or None."""
    found = _LONG_NUMBER.search(text)
    if found is None:
        return None
    return text.count("\n", 0, found.start()) + 1, sum(c.isdigit() for c in found.group())


def line_of(lines: dict[str, int], path: str) -> int | None:
    """Line of `path`, or of its nearest written ancestor; None if nothing is written."""
    parts = path.split(".") if path else []
    while parts:
        found = lines.get(".".join(parts))
        if found is not None:
            return found
        parts.pop()
    return None
