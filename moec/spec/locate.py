"""Where each key of a TOML document is written, so messages can point at a line.

tomli parses values but keeps no positions; this scanner reads the text once more, token by
token as TOML does (strings of the four kinds, multi-line ones included, comments, table
headers and arrays of tables, dotted and quoted keys, inline tables and arrays over several
lines), and maps each key path to the 1-based line that defines it: each key and table tomli
reads, and each item of an array, under its index (as pydantic's locations say: a `[[name]]`
table's keys are under `name.N`). Anything it cannot place falls back to the line of the
nearest enclosing table.

A key path is written as TOML writes a dotted key (`dotted`): each part bare where it is a
bare key, else quoted, so that `"a.b" = 1` under [router] is `router."a.b"`, never the
three-part `router.a.b`.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable

import tomli

_BARE = re.compile(r"[A-Za-z0-9_-]+")
_BASIC = re.compile(r'"(?:[^"\\\n]|\\.)*"')
_LITERAL = re.compile(r"'[^'\n]*'")
_MULTI_BASIC = re.compile(r'"""(?:[^"\\]|\\[\s\S]|"(?!""))*"{3,5}')
_MULTI_LITERAL = re.compile(r"'''[\s\S]*?'{3,5}")
_SCALAR = re.compile(r"[^\s,\]}#]+(?:[ T][0-9]{2}:[^\s,\]}#]*)?")
"""A number, boolean or date-time (whose time may follow a space)."""


def dotted(parts: Iterable[object]) -> str:
    """A key path as TOML writes a dotted key: a part that is no bare key in double quotes, its
    backslashes and quotes escaped (its control characters are left for the message to
    escape, errors.Problem.format)."""
    return ".".join(_quoted(str(part)) for part in parts)


def _quoted(part: str) -> str:
    if _BARE.fullmatch(part):
        return part
    return '"' + part.replace("\\", "\\\\").replace('"', '\\"') + '"'


_QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)


def split_dotted(path: str) -> list[str]:
    """The parts of a path `dotted` wrote (a bare path: its parts between the dots)."""
    parts: list[str] = []
    at = 0
    while path and at <= len(path):
        found = _QUOTED.match(path, at) if path.startswith('"', at) else None
        if found is not None and path[found.end() : found.end() + 1] in ("", "."):
            parts.append(re.sub(r"\\(.)", r"\1", found.group()[1:-1], flags=re.DOTALL))
            at = found.end() + 1
            continue
        end = path.find(".", at)
        end = len(path) if end < 0 else end
        parts.append(path[at:end])
        at = end + 1
    return parts


def key_lines(text: str) -> dict[str, int]:
    """Map each key path (and table path) written in `text`, as `dotted` writes it, to the
    line that defines it."""
    return _Scanner(text).scan()


class _Scanner:
    """One pass over a TOML document (tomli has read it: it is valid TOML), recording where
    each key path is defined. Never raises: text it does not follow is skipped to the end of
    its line."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.newlines = [found.start() for found in re.finditer("\n", text)]
        self.explicit: dict[str, int] = {}
        """Keys and tables written as such."""
        self.implicit: dict[str, int] = {}
        """Tables made by a dotted key or a header's prefix, where they first appear."""
        self.arrays: dict[str, int] = {}
        """Each array of tables ([[name]]) -> the index of its last table so far."""

    def scan(self) -> dict[str, int]:
        table: list[str] = []
        text, size = self.text, len(self.text)
        while self.pos < size:
            self._skip_spaces()
            char = text[self.pos : self.pos + 1]
            if char in ("", "\n", "\r", "#"):
                self._next_line()
                continue
            if char == "[":
                header = self._header()
                if header is not None:
                    table = header
                self._next_line()
                continue
            start = self.pos
            names = self._key()
            if names is not None and self._take("="):
                self._record(table, names, start)
                self._skip_spaces()
                self._value(table + names)
            self._next_line()
        return {**self.implicit, **self.explicit}

    # --- positions and records ---------------------------------------------------------

    def _line(self, pos: int) -> int:
        return bisect.bisect_left(self.newlines, pos) + 1

    def _mark(self, path: list[str], pos: int, explicit: bool = True) -> None:
        into = self.explicit if explicit else self.implicit
        into.setdefault(dotted(path), self._line(pos))

    def _record(self, table: list[str], names: list[str], pos: int) -> None:
        """A key `names` (dotted: its prefixes are tables it makes) in `table`."""
        for count in range(1, len(names)):
            self._mark(table + names[:count], pos, explicit=False)
        self._mark(table + names, pos)

    # --- tokens ------------------------------------------------------------------------

    def _skip_spaces(self) -> None:
        text, size = self.text, len(self.text)
        while self.pos < size and text[self.pos] in " \t":
            self.pos += 1

    def _skip_blank(self) -> None:
        """Spaces, newlines and comments (between the items of an array or inline table)."""
        text, size = self.text, len(self.text)
        while self.pos < size:
            char = text[self.pos]
            if char in " \t\r\n":
                self.pos += 1
            elif char == "#":
                end = text.find("\n", self.pos)
                self.pos = size if end < 0 else end
            else:
                return

    def _next_line(self) -> None:
        """Past the rest of this line (spaces and a comment, after a value) and its newline."""
        end = self.text.find("\n", self.pos)
        self.pos = len(self.text) if end < 0 else end + 1

    def _take(self, token: str) -> bool:
        self._skip_spaces()
        if self.text.startswith(token, self.pos):
            self.pos += len(token)
            return True
        return False

    def _key(self) -> list[str] | None:
        """A dotted key's parts (each decoded), or None where none starts here."""
        names: list[str] = []
        while True:
            self._skip_spaces()
            name = self._simple_key()
            if name is None:
                return None
            names.append(name)
            if not self._take("."):
                return names

    def _simple_key(self) -> str | None:
        text, pos = self.text, self.pos
        pattern = {'"': _BASIC, "'": _LITERAL}.get(text[pos : pos + 1], _BARE)
        found = pattern.match(text, pos)
        if found is None:
            return None
        self.pos = found.end()
        if pattern is _BARE:
            return found.group()
        if pattern is _LITERAL:
            return found.group()[1:-1]
        try:  # tomli's own reading of the escapes
            return next(iter(tomli.loads(f"{found.group()} = 0")))
        except (tomli.TOMLDecodeError, StopIteration, ValueError):
            return found.group()[1:-1]

    def _header(self) -> list[str] | None:
        """A [table] or [[array of tables]] header: its path, with the index of each array of
        tables in it."""
        is_array = self.text.startswith("[[", self.pos)
        self.pos += 2 if is_array else 1
        start = self.pos
        names = self._key()
        if names is None or not self._take("]]" if is_array else "]"):
            return None
        path = self._resolve(names[:-1]) + names[-1:]
        if is_array:
            name = dotted(path)
            self.arrays[name] = self.arrays.get(name, -1) + 1
            for count in range(1, len(path) + 1):
                self._mark(path[:count], start, explicit=count == len(path))
            path = path + [str(self.arrays[name])]
        for count in range(1, len(path)):
            self._mark(path[:count], start, explicit=False)
        self._mark(path, start)
        return path

    def _resolve(self, names: list[str]) -> list[str]:
        """`names` with the index of the last table of each array of tables it goes through
        ([[a]] then [a.b]: a.N.b)."""
        path: list[str] = []
        for name in names:
            path.append(name)
            index = self.arrays.get(dotted(path))
            if index is not None:
                path.append(str(index))
        return path

    # --- values ------------------------------------------------------------------------

    def _value(self, path: list[str]) -> None:
        """Past the value at `path` (arrays and inline tables nested in it, each item and key
        recorded); iterative, so that no nesting tomli reads is too deep here."""
        stack: list[tuple[str, list[str], list[int], str]] = []
        """(closer, path, [items so far], path as `dotted` writes it) of each open array and
        inline table."""
        text, size = self.text, len(self.text)
        while True:
            char = text[self.pos : self.pos + 1]
            if char == "[":
                self.pos += 1
                stack.append(("]", path, [0], dotted(path)))
            elif char == "{":
                self.pos += 1
                stack.append(("}", path, [0], ""))
            else:
                self._scalar()
            while stack:  # the next item of the innermost array or table, or its end
                closer, inside, count, name = stack[-1]
                self._skip_blank()
                if text.startswith(",", self.pos):
                    self.pos += 1
                    self._skip_blank()
                if self.pos >= size:
                    return
                if text[self.pos] == closer:
                    self.pos += 1
                    stack.pop()
                    continue
                if closer == "]":
                    path = inside + [str(count[0])]
                    self.explicit.setdefault(f"{name}.{count[0]}", self._line(self.pos))
                    count[0] += 1
                    break
                start = self.pos
                names = self._key()
                if names is None or not self._take("="):
                    return
                self._record(inside, names, start)
                self._skip_spaces()
                path = inside + names
                break
            else:
                return

    def _scalar(self) -> None:
        """Past a string, number, boolean or date-time."""
        text, pos = self.text, self.pos
        if text.startswith('"""', pos):
            pattern = _MULTI_BASIC
        elif text.startswith("'''", pos):
            pattern = _MULTI_LITERAL
        else:
            pattern = {'"': _BASIC, "'": _LITERAL}.get(text[pos : pos + 1], _SCALAR)
        found = pattern.match(text, pos)
        self.pos = found.end() if found is not None and found.end() > pos else pos + 1


_LONG_NUMBER = re.compile(r"[0-9][0-9_]{4000,}")
"""Digits near what Python converts to an int at most (4,300 by default), underscores allowed."""


def long_number(text: str) -> tuple[int, int] | None:
    """(line, digits) of the first number in `text` too long for Python to convert, or None."""
    found = _LONG_NUMBER.search(text)
    if found is None:
        return None
    return text.count("\n", 0, found.start()) + 1, sum(c.isdigit() for c in found.group())


def line_of(lines: dict[str, int], path: str) -> int | None:
    """Line of `path` (as `dotted` writes it), or of its nearest written ancestor; None if
    nothing is written."""
    parts = split_dotted(path) if path else []
    while parts:
        found = lines.get(dotted(parts))
        if found is not None:
            return found
        parts.pop()
    return None
