"""Write a generated package atomically: into a temporary folder, then swapped into place.

On Linux the swap is one renameat2(RENAME_EXCHANGE), so readers see the old package or the new
one, never a mix; elsewhere two renames leave a window of one rename. An interrupted build
leaves the previous package untouched.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import shutil
import tempfile
from pathlib import Path

_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(first: Path, second: Path) -> bool:
    """Atomically swap two paths (Linux renameat2); False where unavailable."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_uint,
    ]
    result = renameat2(_AT_FDCWD, bytes(first), _AT_FDCWD, bytes(second), _RENAME_EXCHANGE)
    return result == 0


def write_package(target: Path, files: dict[str, bytes]) -> bool:
    """Make `target` hold exactly `files`; return False when it already did (nothing written)."""
    target = Path(target)
    if target.is_dir() and _same(target, files):
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        for name, data in sorted(files.items()):
            (staging / name).write_bytes(data)
        if not target.exists():
            os.rename(staging, target)
            return True
        if _exchange(staging.resolve(), target.resolve()):
            shutil.rmtree(staging)  # now holds the previous package
            return True
        previous = target.with_name(f".{target.name}.previous")
        shutil.rmtree(previous, ignore_errors=True)
        os.rename(target, previous)
        os.rename(staging, target)
        shutil.rmtree(previous)
        return True
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def _same(target: Path, files: dict[str, bytes]) -> bool:
    present = {p.name for p in target.iterdir() if p.is_file() and p.name != "__pycache__"}
    if present != set(files):
        return False
    return all((target / name).read_bytes() == data for name, data in files.items())
