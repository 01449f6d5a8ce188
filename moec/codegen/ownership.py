"""Recognize a folder moec wrote, so that a build replaces only that.

Every package moec writes holds a marker file, `.moec-build`, listing each file written with
its sha256. A folder is a previous moec build when it holds the marker and nothing but the
files listed there, unchanged, and `__pycache__` (what importing the package adds). An empty
folder is taken too (replacing it loses nothing). Anything else makes the folder someone else's:
a build refuses to replace it. So does a folder holding files but no marker, even when every
file starts as moec's do (a copy of a package by `cp pkg/* dest/`, which leaves the dotfile
behind, then edited): without the marker's digests moec cannot tell its files from edited
ones. So does a marker that is not exactly as moec writes it (cut short, edited, a link, a
folder, a fifo, unreadable): moec then cannot tell its files from anyone else's, and says so.

Leftovers of killed builds (`.<name>.moec-<hex>` staging folders, `.<name>.moec-previous`)
are recognized by the marker, which a build writes into its staging folder before anything
else: a leftover holds the marker and only files it lists (one may be cut short: it was being
written). A folder of such a name without the marker is left alone, whatever it holds, even
nothing: a name alone never makes a folder moec's.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from pathlib import Path

from moec.runtime.load_record import BUILD_MARKER as MARKER

_MARKER_TITLE = (
    b"# Written by `moec build`. The next build replaces this folder while it holds only the\n"
    b"# files below, unchanged (and __pycache__); anything else makes moec leave it alone.\n"
)
_LEFTOVER = re.compile(r"moec-(?:[0-9a-f]+|previous)")
_MARKER_LINE = re.compile(r"[0-9a-f]{64} [^/\x00\n]+")
_MARKER_MAX = 1 << 20
"""Largest marker read (one of moec's lists a few dozen files in a few kB)."""


def marker_bytes(files: dict[str, bytes]) -> bytes:
    """The marker of a package of `files`: one `<sha256> <name>` line per file."""
    lines = [f"{hashlib.sha256(data).hexdigest()} {name}\n" for name, data in sorted(files.items())]
    return _MARKER_TITLE + "".join(lines).encode()


def kind_of(path: Path) -> str:
    """What is at `path`, in words: "a file", "a folder", "a symbolic link to X", "a fifo",
    "a socket", "a device", "nothing" (or why it cannot be looked at)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return "nothing"
    except OSError as error:
        return f"unreadable ({error.strerror or error})"
    if stat.S_ISLNK(mode):
        try:
            return f"a symbolic link to {os.readlink(path)}"
        except OSError:
            return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISREG(mode):
        return "a file"
    if stat.S_ISFIFO(mode):
        return "a fifo"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a device"


def _listed(folder: Path) -> tuple[dict[str, str] | None, str | None]:
    """({name: sha256} of the marker in `folder`, None) when it holds moec's marker; (None,
    None) when there is no marker; (None, why) when the marker is there but not one moec wrote
    whole: cut short, edited, not a file, unreadable."""
    path = folder / MARKER
    kind = kind_of(path)
    if kind == "nothing":
        return None, None
    if kind != "a file":
        return None, f"its build marker {path} is {kind}, not the file moec writes"
    try:
        with open(path, "rb") as handle:
            text = handle.read(_MARKER_MAX + 1)
    except OSError as error:
        return None, f"its build marker {path} cannot be read: {error.strerror or error}"
    state = _marker_damage(text)
    if state:
        return (
            None,
            f"its build marker {path} {state}, so moec cannot tell its files from anyone else's",
        )
    listed = {}
    for line in text[len(_MARKER_TITLE) :].decode().splitlines():
        digest, _, name = line.partition(" ")
        listed[name] = digest
    return listed, None


def _marker_damage(text: bytes) -> str:
    """How the bytes of a marker differ from one moec writes ("" when they do not)."""
    if not text:
        return "is empty"
    if len(text) > _MARKER_MAX:
        return f"is larger than moec's markers ({_MARKER_MAX} bytes at most)"
    if not text.startswith(_MARKER_TITLE):
        if _MARKER_TITLE.startswith(text):
            return f"is cut short ({len(text)} bytes)"
        return "does not start as moec's markers do"
    body = text[len(_MARKER_TITLE) :]
    if body and not body.endswith(b"\n"):
        return f"is cut short ({len(text)} bytes, in the middle of a line)"
    try:
        lines = body.decode().splitlines()
    except UnicodeDecodeError:
        return "holds bytes that are not UTF-8"
    for number, line in enumerate(lines, start=_MARKER_TITLE.count(b"\n") + 1):
        if not _MARKER_LINE.fullmatch(line):
            return f"has a line moec does not write (line {number})"
    return ""


def holds_marker(folder: Path) -> bool:
    """Whether `folder` holds a build marker as moec starts one (a regular file; its list may
    be damaged): the folder is a package moec built. A fifo or a user's file of that name is
    not."""
    path = folder / MARKER
    return kind_of(path) == "a file" and _starts_with(path, _MARKER_TITLE)


def package_holding(folder: Path) -> Path | None:
    """The package moec built that `folder` is, or lies in (a file written there would be one
    the build did not write), or None. `folder` is judged where the OS finds it, links and `..`
    resolved (`pk/tiny_cpu/..` is `pk`; `link/x` is inside the package link points to); the
    package is named as `folder` spells it where it can be (`/abs/link`), else by its real
    path."""
    real = Path(os.path.realpath(folder))
    found = next((p for p in [real, *real.parents] if holds_marker(p)), None)
    if found is None:
        return None
    written = Path(os.path.abspath(folder))
    spelled = (p for p in [written, *written.parents] if Path(os.path.realpath(p)) == found)
    return next(spelled, found)


def foreign_reason(folder: Path, leftover: bool = False) -> str | None:
    """Why `folder` is not a previous moec build (None when it is one). With `leftover`, a
    killed build's staging folder: files may be cut short, and the marker must be there."""
    if os.path.islink(folder) or not os.path.isdir(folder):
        return f"it is {kind_of(folder)}, not a folder"
    try:
        entries = sorted(os.scandir(folder), key=lambda entry: entry.name)
    except OSError as error:
        return f"its list of files cannot be read: {error.strerror or error}"
    if not entries and leftover:
        # A build killed between its mkdir and the marker leaves one too, but so may a user:
        # without the marker moec cannot tell, and leaves it (an empty folder costs nothing).
        return "it is empty, with no .moec-build marker"
    if not entries:
        return None  # an empty folder: replacing it loses nothing
    listed, damage = _listed(folder)
    if damage:
        return damage
    if listed is None and leftover:
        return f"it holds no {MARKER} marker"
    if listed is None:  # files that start as moec's may still have been edited since
        return (
            f"it holds no {MARKER} marker, so moec cannot tell its files from edited ones "
            "(a user's folder, or a copy of a package: `cp pkg/*` leaves the marker behind)"
        )
    for entry in entries:
        reason = _foreign_entry(entry, listed, leftover)
        if reason:
            return f"{entry.path} {reason}"
    return None


def _foreign_entry(entry: os.DirEntry, listed: dict[str, str], leftover: bool) -> str:
    """Why one entry of a folder is not moec's ("" when it is)."""
    if entry.name == MARKER:
        return ""
    if entry.name == "__pycache__" and entry.is_dir(follow_symlinks=False):
        try:
            return "" if _only_bytecode(Path(entry.path)) else "holds files that are not bytecode"
        except OSError as error:
            return f"cannot be read: {error.strerror or error}"
    if not entry.is_file(follow_symlinks=False):
        return f"is {kind_of(Path(entry.path))}, which moec never writes there"
    if entry.name not in listed:
        return "was not written by moec"
    if leftover:
        return ""
    try:
        digest = hashlib.sha256(Path(entry.path).read_bytes()).hexdigest()
    except OSError as error:
        return f"cannot be read: {error.strerror or error}"
    return "" if digest == listed[entry.name] else "was changed after moec wrote it"


def _starts_with(path: Path, start: bytes) -> bool:
    """Whether the file at `path` can be read and begins with `start`."""
    try:
        with open(path, "rb") as handle:
            return handle.read(len(start)) == start
    except OSError:
        return False


def _only_bytecode(folder: Path) -> bool:
    return all(
        entry.is_file(follow_symlinks=False) and entry.name.endswith(".pyc")
        for entry in os.scandir(folder)
    )


def is_leftover_name(entry_name: str, package: str) -> bool:
    """Whether `entry_name` is a name moec's staging folders for `package` take."""
    prefix = f".{package}."
    return entry_name.startswith(prefix) and bool(_LEFTOVER.fullmatch(entry_name[len(prefix) :]))
