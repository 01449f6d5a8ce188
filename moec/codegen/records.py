"""The record moec keeps of a single file it writes (`explain -o`, `schema -o`, `eplb -o`), so
that a later command replaces the file only while it is as moec wrote it.

The record is a small file beside the output, `.<name>.moec`: a title and one `sha256 <hex>`
line, the digest of the bytes moec wrote. The output itself is left in its own format (a JSON
file stays plain JSON, a picture a picture). A file is moec's to replace while its record is
there, exactly as moec writes one, and holds the digest of the file's bytes now: a file edited
since, or one without a record (a user's, a copy, one an earlier moec wrote), is left alone.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from moec.codegen.ownership import kind_of

RECORD_TAG = ".moec"
_TITLE = (
    b"# Written by moec: the digest of the file this one is named for, as moec wrote it. moec\n"
    b"# replaces that file only while it still has this digest; else it leaves it alone.\n"
)
_LINE = re.compile(rb"sha256 ([0-9a-f]{64})\n")
_RECORD_MAX = 4096
"""Largest record read (one of moec's is under 300 bytes)."""


def record_path(path: Path) -> Path:
    """Where the record of the file at `path` is kept: `.<name>.moec` beside it."""
    return path.with_name(f".{path.name}{RECORD_TAG}")


def record_bytes(data: bytes) -> bytes:
    """The record of a file moec writes `data` to."""
    return _TITLE + f"sha256 {hashlib.sha256(data).hexdigest()}\n".encode()


def is_replaceable(record: Path) -> bool:
    """Whether moec may write the record at `record`: nothing is there, or one of its records
    (a regular file, not a link to one, starting with the title)."""
    kind = kind_of(record)
    return kind == "nothing" or (kind == "a file" and _read(record).startswith(_TITLE))


def unrecorded_reason(path: Path) -> str:
    """Why the file at `path` is not as moec last wrote it, by its record ("" when it is)."""
    record = record_path(path)
    kind = kind_of(record)
    if kind == "nothing":
        return f"carries no record {record} of what moec wrote, so it may have been edited"
    if kind != "a file":
        return f"its record {record} is {kind}, not the file moec writes"
    text = _read(record)
    found = _LINE.fullmatch(text[len(_TITLE) :]) if text.startswith(_TITLE) else None
    if found is None:
        return f"its record {record} is not as moec writes it"
    if found.group(1).decode() != _digest(path):
        return f"was changed after moec wrote it (its record {record} holds another sha256)"
    return ""


def _read(record: Path) -> bytes:
    try:
        with open(record, "rb") as handle:
            return handle.read(_RECORD_MAX)
    except OSError:
        return b""


def _digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
