"""The load file a layer's `write_expert_load` writes for `moec eplb`: how many tokens it routed
to each expert, as {"format": "moec-load", "layer": ..., "load": [...]}.

Written as moec writes every file: it replaces only a load file (one this module wrote, by its
format), never another file, a folder or a symbolic link, and the new file takes the old one's
place at once (written beside it, then renamed), so that a reader never sees half a file.
"""

from __future__ import annotations

import json
import os
import tempfile

FORMAT = "moec-load"
"""The `format` of every load file (moec eplb reads only these)."""


def write(path, layer: str, load: list[int]) -> None:
    """Write the load of the layer named `layer` to `path` (a str or os.PathLike); ValueError
    naming the path where it is no file moec may write, TypeError for another kind of path."""
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
    folder = os.path.dirname(os.path.abspath(path))
    text = json.dumps({"format": FORMAT, "layer": layer, "load": load}) + "\n"
    handle, temporary = tempfile.mkstemp(prefix=".moec-load-", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            file.write(text)
        os.chmod(temporary, 0o644)  # as open() would make it (mkstemp's is 0o600)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def _refusal(path: str) -> str:
    """Why `path` may not be written ("" when it may: nothing is there, or a load file)."""
    if os.path.islink(path):
        return "is a symbolic link: write to the file itself, or to a new path"
    if not os.path.lexists(path):
        folder = os.path.dirname(os.path.abspath(path))
        return "" if os.path.isdir(folder) else f"is in no folder ({folder} does not exist)"
    if os.path.isdir(path):
        return "is a folder: give a file path, e.g. load.json inside it"
    if not os.path.isfile(path):
        return "is not a regular file"
    if not _is_load_file(path):
        return "exists and is no load file moec wrote: choose another path or move it"
    return ""


def _is_load_file(path: str) -> bool:
    """Whether the file at `path` is a load file (its JSON's format FORMAT)."""
    try:
        with open(path, encoding="utf-8") as file:
            data = json.loads(file.read(1 << 24))
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(data, dict) and data.get("format") == FORMAT
