"""Errors are values: a `Problem` names where, what and what would be accepted.

Every user-facing failure (bad TOML, unknown key, impossible combination, missing optional
backend, an output path the operating system refuses) is raised as one `MoecError` carrying all the problems found. The CLI prints each as
`SPEC:LINE: key.path = value: what is wrong (what would be accepted)` and exits 2.
"""

from __future__ import annotations

import errno
import json
import os
import re
from dataclasses import dataclass, field
from typing import Any, Literal, overload


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a spec or a request."""

    path: str
    """Dotted key path in the spec (`quant.weight_block`), or an argument name; "" if none."""
    message: str
    """What is wrong, in plain words."""
    hint: str = ""
    """What would be accepted."""
    value: Any = field(default=None, hash=False)
    """The offending value, if there is one (not hashed: it can be a list or a table)."""
    has_value: bool = False
    """Whether `value` is meaningful (None can be an offending value)."""
    line: int | None = None
    """1-based line in the spec file where the key (or its table) is written."""
    origin: str = ""
    """Where the value came from when not the file: "--set", "preset deepseek-v3", ..."""
    rule: str = ""
    """Name of the combination rule that found it, if any."""

    def located(self, line: int | None, origin: str = "") -> Problem:
        return Problem(
            self.path, self.message, self.hint, self.value, self.has_value, line, origin, self.rule
        )

    def format(self, source: str = "") -> str:
        """`SPEC:LINE: key.path = value: message (hint)`."""
        where = _printable(source) or "<spec>"
        if self.line is not None:
            where = f"{where}:{self.line}"
        if self.origin:
            where = f"{where} ({self.origin})"
        subject = _key(self.path)
        if self.has_value:
            subject = f"{subject} = {_show(self.value)}" if subject else _show(self.value)
        # a message may run over lines (one per problem of a checkpoint), and it can quote a
        # checkpoint's names or an argument
        message = _printable(self.message, keep_newlines=True)
        text = f"{where}: {subject}: {message}" if subject else f"{where}: {message}"
        if self.hint:
            text += f" ({_printable(self.hint, keep_newlines=True)})"
        return text


def problem(
    path: str, message: str, hint: str = "", *, value: Any = ..., rule: str = ""
) -> Problem:
    """Build a Problem; pass `value=` to show the offending value."""
    if value is ...:
        return Problem(path, message, hint, rule=rule)
    return Problem(path, message, hint, value, True, rule=rule)


_SHOWN_DEPTH = 4
"""Levels of a nested value a message shows (deeper ones are "...")."""
_SHOWN_ITEMS = 16
"""Items of a list or table a message shows."""
_SHOWN_CHARS = 200
"""Characters of a string or number a message shows."""


def _show(value: Any, depth: int = 0) -> str:
    """The value as TOML writes it, cut short where it is long or deep (one readable line)."""
    if isinstance(value, str):
        text = json.dumps(value)
        return text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 4] + '..."'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple, dict)):
        if depth >= _SHOWN_DEPTH:
            return "[...]" if isinstance(value, (list, tuple)) else "{...}"
        if isinstance(value, dict):
            items = [
                f"{_key(str(k))} = {_show(v, depth + 1)}"
                for k, v in list(value.items())[:_SHOWN_ITEMS]
            ]
        else:
            items = [_show(v, depth + 1) for v in value[:_SHOWN_ITEMS]]
        if len(value) > _SHOWN_ITEMS:
            items.append(f"... {len(value) - _SHOWN_ITEMS} more")
        opening, closing = ("{", "}") if isinstance(value, dict) else ("[", "]")
        return opening + ", ".join(items) + closing
    return _cut(str(value))


def shown_path(path: object) -> str:
    """A path as a message quotes it: its control characters, the newline too, written as hex
    escapes (a message keeps its newlines, and a file name with one would split the problem's
    line in two)."""
    return _printable(str(path))


def _printable(text: str, keep_newlines: bool = False) -> str:
    """Text with its control characters (but the newline, with `keep_newlines`) written as hex
    escapes: a spec's key, a path or a message reaches the user's terminal, which would obey
    them."""
    pattern = _CONTROL_BUT_NEWLINE if keep_newlines else _CONTROL
    return pattern.sub(lambda found: _escape(found.group()), text)


def _escape(char: str) -> str:
    code = ord(char)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


INVISIBLE = "\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff"
"""Zero-width characters, line and paragraph separators and the bidirectional controls (a
right-to-left override would reorder the rest of the line on the user's terminal)."""
_CONTROL = re.compile(f"[\\x00-\\x1f\\x7f-\\x9f{INVISIBLE}]")
_CONTROL_BUT_NEWLINE = re.compile(f"[\\x00-\\x09\\x0b-\\x1f\\x7f-\\x9f{INVISIBLE}]")


def _key(text: str) -> str:
    """A key as a message shows it: moec's keys are ASCII, so anything else in one is written as
    an escape (a look-alike letter, a zero-width space), and a long one cut."""
    return _cut(_printable(text.encode("ascii", "backslashreplace").decode("ascii")))


def _cut(text: str) -> str:
    return text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 3] + "..."


_SHOWN_PROBLEMS = 50
"""Problems a MoecError's report lists."""


@dataclass
class MoecError(Exception):
    """All the problems found, and the file they concern."""

    problems: list[Problem]
    source: str = ""
    kind: str = "spec"
    """"spec" for a bad spec, "backend" for a missing optional package, "usage" for arguments,
    "io" for a file or folder the operating system would not read or write."""
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__init__(self.report())

    def report(self) -> str:
        """One line per problem, the first _SHOWN_PROBLEMS of them (a spec of a thousand
        unknown keys is a screenful, not a thousand lines); every one stays in `problems`."""
        lines = [p.format(self.source) for p in self.problems[:_SHOWN_PROBLEMS]]
        hidden = len(self.problems) - _SHOWN_PROBLEMS
        if hidden > 0:
            where = _printable(self.source) or "<spec>"
            lines.append(f"{where}: and {hidden} more problems (fix those above first)")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.report()


_OS_HINTS = {
    errno.EACCES: "a path you may write to (check the permissions of it and its folder)",
    errno.EPERM: "a path you may write to (check the permissions of it and its folder)",
    errno.ENOENT: "check the path: a folder on the way does not exist",
    errno.ENOTDIR: "a part of the path is a file, not a folder",
    errno.EISDIR: "a file path, not a folder",
    errno.ENOSPC: "free some space on that disk, or write elsewhere",
    errno.EROFS: "a path on a writable file system",
    errno.ENAMETOOLONG: "a shorter path",
}


def os_error(error: OSError, path: object, action: str = "cannot write") -> MoecError:
    """A MoecError of kind "io" for an OSError: `PATH: action: OS reason (hint)`."""
    where = error.filename if error.filename is not None else path
    reason = error.strerror or str(error)
    return MoecError(
        [problem("", f"{action}: {reason}", _OS_HINTS.get(error.errno or 0, ""))],
        str(where),
        kind="io",
    )


# --- arguments of the Python API ----------------------------------------------------------


@overload
def path_argument(value: Any, name: str, call: str, optional: Literal[False] = False) -> str: ...
@overload
def path_argument(value: Any, name: str, call: str, optional: bool) -> str | None: ...
def path_argument(value: Any, name: str, call: str, optional: bool = False) -> str | None:
    """`value` as a path string, for an argument of the Python API that takes a path (None
    where `optional`); a TypeError naming the argument otherwise."""
    if value is None and optional:
        return None
    try:
        text = os.fspath(value)
    except TypeError:
        text = None
    if not isinstance(text, str):
        raise TypeError(
            f"{call}: {name} must be a path (a str or os.PathLike), got {type(value).__name__}"
        )
    if optional and not text.strip():  # "" is not None: it would name the working folder
        raise MoecError(
            [problem(name, "is an empty path", f"a folder, or None for {call}'s default")],
            call,
            kind="usage",
        )
    refuse_nul(text, name, call)
    return text


def refuse_nul(text: str, name: str, call: str) -> None:
    """A usage MoecError naming `name` where the path `text` holds a NUL byte: the OS takes no
    path with one (open() and stat() raise ValueError, a traceback)."""
    if "\0" in text:
        raise MoecError(
            [problem(name, "holds a NUL byte, which no path can", "a path", value=text)],
            call,
            kind="usage",
        )


def override_list(overrides: Any, call: str) -> tuple[str, ...]:
    """The `KEY=VALUE` strings of an `overrides` argument (None: none); TypeError when it is
    not a list of strings (one string would be read as one override per character)."""
    if overrides is None:
        return ()
    wanted = "a list of KEY=VALUE strings, e.g. ['quant.scheme=bf16']"
    if isinstance(overrides, (str, bytes)):
        raise TypeError(f"{call}: overrides must be {wanted}, not one string: {_show(overrides)}")
    try:
        items = tuple(overrides)
    except TypeError:
        raise TypeError(
            f"{call}: overrides must be {wanted}, got {type(overrides).__name__}"
        ) from None
    for index, item in enumerate(items):
        if not isinstance(item, str):
            raise TypeError(
                f"{call}: overrides[{index}] must be a KEY=VALUE string, got {type(item).__name__}"
            )
    return items
