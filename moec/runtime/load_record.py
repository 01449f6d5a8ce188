"""The load file a layer's `write_expert_load` writes for `moec eplb`: how many tokens it routed
to each expert, as {"format": "moec-load", "layer": ..., "load": [...]}.

Written as moec writes every file: it replaces only a load file this module wrote and nobody
has edited since (its `sha256`, of the rest, still matches), never another file, a folder, a
symbolic link or a file inside a package moec built, and the new file takes the old one's place
at once (written beside it, then renamed), so that a reader never sees half a file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import tempfile

FORMAT = "moec-load"
"""The `format` of every load file (moec eplb reads only these)."""
KEYS = ("format", "layer", "load", "sha256")
"""The keys `write` writes, in its order (moec eplb refuses a file with any other)."""
BUILD_MARKER = ".moec-build"
"""The file every package moec builds holds (moec/codegen/ownership.py reads its name here: a
built package's layer cannot import moec): a file written into one would be one the next build
of it did not write."""


def write(path, layer: str, load: list[int]) -> None:
    """Write the load of the layer named `layer` to `path` (a str or os.PathLike); ValueError
    naming the path where it is no file moec may write or the OS refuses to write it (never
    the temporary file beside it), TypeError for another kind of path."""
    if isinstance(path, bool) or not isinstance(path, (str, os.PathLike)):
        kind = type(path).__name__
        raise TypeError(
            f"{layer}: write_expert_load(path): path must be a str or os.PathLike, got {kind}"
        )
    path = os.fspath(path)
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    if not path or "\x00" in path:
        raise ValueError(f"{layer}: write_expert_load: {path!r} is no path")
    problem = _refusal(path)
    if problem:
        raise ValueError(f"{layer}: write_expert_load: {path!r} {problem}")
    folder = _folder_of(path)
    record = {"format": FORMAT, "layer": layer, "load": load}
    text = json.dumps({**record, "sha256": _digest(record)}) + "\n"
    try:
        _replace(folder, path, text)
    except OSError as error:  # its filename may be the temporary file's: the path given instead
        reason = error.strerror or type(error).__name__
        raise ValueError(
            f"{layer}: write_expert_load: {path!r} cannot be written: {reason}"
        ) from None


def _replace(folder: str, path: str, text: str) -> None:
    """Put `text` at `path` in one rename, from a temporary file beside it in `folder`."""
    handle, temporary = tempfile.mkstemp(prefix=".moec-load-", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            file.write(text)
        os.chmod(temporary, 0o644)  # as open() would make it (mkstemp's is 0o600)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def _refusal(path: str) -> str:
    """Why `path` may not be written ("" when it may: nothing is there, or a load file)."""
    if not os.path.basename(path):  # "x/": the OS takes it for a folder
        if os.path.isdir(path):
            return "is a folder: give a file path, e.g. load.json inside it"
        return "ends in a path separator, as a folder's path does: give a file path, without it"
    if os.path.islink(path):
        return "is a symbolic link: write to the file itself, or to a new path"
    folder = _folder_of(path)
    package = _package_holding(folder)
    if package:
        return f"is inside {package}, a package moec built: write the load file elsewhere"
    if not os.path.lexists(path):
        return _folder_problem(folder) or _name_problem(folder, os.path.basename(path))
    if os.path.isdir(path):
        return "is a folder: give a file path, e.g. load.json inside it"
    if not os.path.isfile(path):
        return "is not a regular file"
    if not _written_here(path):
        return "exists and is no load file moec wrote (or it was edited): choose another path"
    return ""


def _folder_of(path: str) -> str:
    """The folder the OS writes `path` in, its links and `..` resolved (`link/../x` is in the
    folder above link's target, where os.path.abspath would say link's own folder)."""
    return os.path.realpath(os.path.dirname(path) or os.curdir)


def _folder_problem(folder: str) -> str:
    """Why the absolute path `folder` can hold no new file ("" when it is a folder)."""
    if os.path.isdir(folder):
        return ""
    part = folder
    while True:  # the nearest part of `folder` that is there, and what it is
        try:
            mode = os.stat(part).st_mode
            break
        except (FileNotFoundError, NotADirectoryError):  # not there, or under a file
            if os.path.dirname(part) == part:
                return f"is in no folder ({folder} does not exist)"
            part = os.path.dirname(part)
        except OSError as error:
            return f"is in no folder it may reach ({part}: {error.strerror or error})"
    if stat.S_ISDIR(mode):
        return f"is in no folder ({folder} does not exist)"
    what = "a file" if stat.S_ISREG(mode) else "a special file"
    if os.path.islink(part):
        what = f"a symbolic link to {what}"
    return f"is in no folder ({part} is {what}, not a folder)"


def _name_problem(folder: str, name: str) -> str:
    """Why the file system of `folder` takes no file named `name` ("" when it does)."""
    try:
        limit = os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):  # no limit told (or no pathconf)
        return ""
    size = len(os.fsencode(name))
    if limit <= 0 or size <= limit:
        return ""
    return (
        f"has a name of {size} bytes, longer than the file system allows ({limit} bytes): "
        "a shorter name"
    )


def _digest(record: dict) -> str:
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()[:16]


def _written_here(path: str) -> bool:
    """Whether the file at `path` is a load file this module wrote, unedited since."""
    try:
        with open(path, encoding="utf-8") as file:
            data = json.loads(file.read(1 << 24))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return False
    if not isinstance(data, dict) or set(data) != {"format", "layer", "load", "sha256"}:
        return False
    digest = data.pop("sha256")
    return data["format"] == FORMAT and digest == _digest(data)


def _package_holding(folder: str) -> str:
    """The package moec built that `folder` is or lies in ("" when none)."""
    while True:
        if os.path.isfile(os.path.join(folder, BUILD_MARKER)):
            return folder
        parent = os.path.dirname(folder)
        if parent == folder:
            return ""
        folder = parent
