"""Write what moec generates without ever destroying what moec did not make.

`write_package` (moec build, moec.load) makes `out/<name>/` hold exactly the package's files.
It replaces that folder only when it holds a previous moec build (`ownership.foreign_reason`
says how that is recognized); anything else there (a user's folder, a file, a symbolic link,
a fifo) is refused, naming the path. The package is written into a staging folder beside the
target (`.<name>.moec-<random>`, the marker written first so that a killed build's leftover is
recognizable) and swapped into place: on Linux one renameat2(RENAME_EXCHANGE), so readers see
the old package or the new one, never a mix; elsewhere two renames. An interrupted build
leaves the previous package whole; the next build removes the leftovers of killed ones.

Builds into one folder take an exclusive flock on it, so two racing builds run one after the
other and both end with a whole package. Folders and files are created with the user's umask.

`write_text` and `write_bytes` (`-o` of init, explain, schema, eplb, tune) replace one file
atomically, and only a file moec wrote; explain, schema and eplb keep a record of what they
wrote beside it (`records`), so that a file edited since is left alone too. Every OS failure
becomes a MoecError of kind "io" naming the path and the OS reason; names are checked against
the file system's NAME_MAX and PATH_MAX before anything is written.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import secrets
import shutil
import stat
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from moec.codegen import records
from moec.codegen.ownership import (
    MARKER,
    foreign_reason,
    is_leftover_name,
    kind_of,
    marker_bytes,
    package_holding,
)
from moec.errors import MoecError, os_error, problem

_RENAME_EXCHANGE = 2
_AT_FDCWD = -100
_STAGING_TAG = ".moec-"
_RANDOM_CHARS = 8


def write_package(target: Path, files: dict[str, bytes]) -> bool:
    """Make `target` hold exactly `files`; return False when it already did (nothing written).
    Raise MoecError when `target` is not moec's to replace, or the OS refuses."""
    target = Path(target)
    check_limits(target, [*files, MARKER, _staging_name(target, "x" * _RANDOM_CHARS)])
    inside = package_holding(target.parent)
    if inside is not None:  # a package in a package: rebuilding the outer one would refuse
        raise MoecError(
            [problem("-o", f"is inside {inside}, a package moec built", "an -o outside it")],
            str(target.parent),
            kind="usage",
        )
    try:
        parent = make_folder(target.parent)
        with _folder_lock(parent):
            if _holds_exactly(target, files):
                return False
            _refuse_unless_moec_build(target)
            _remove_leftovers(target)
            _swap_in(_stage(target, files), target)
            return True
    except OSError as error:
        raise _named(error, target) from None


def _named(error: OSError, target: Path) -> MoecError:
    """The MoecError of an OS failure, naming the user's path rather than moec's staging."""
    if error.filename is not None and _STAGING_TAG in os.fspath(error.filename):
        error.filename = str(target)
    return os_error(error, target)


def _holds_exactly(target: Path, files: dict[str, bytes]) -> bool:
    """Whether `target` is a real folder holding `files` and the marker (and __pycache__), each
    a regular file (not a link to one). A folder it cannot read does not (foreign_reason says
    why)."""
    if not target.is_dir() or target.is_symlink():
        return False
    expected = {**files, MARKER: marker_bytes(files)}
    try:
        present = {entry.name for entry in os.scandir(target) if entry.name != "__pycache__"}
        if present != set(expected):
            return False
        return all(
            stat.S_ISREG(os.lstat(target / name).st_mode) and (target / name).read_bytes() == data
            for name, data in expected.items()
        )
    except OSError:
        return False


def _refuse_unless_moec_build(target: Path) -> None:
    if not os.path.lexists(target):
        return
    reason = foreign_reason(target)
    if reason:
        raise MoecError(
            [
                problem(
                    "",
                    f"not replaced: {reason}; moec build replaces only a folder it wrote",
                    "move it away, or build into another folder with -o",
                )
            ],
            str(target),
            kind="usage",
        )


def _staging_name(target: Path, tag: str) -> str:
    return f".{target.name}{_STAGING_TAG}{tag}"


def _stage(target: Path, files: dict[str, bytes]) -> Path:
    """A new staging folder beside `target` holding the marker and `files`."""
    while True:
        staging = target.with_name(_staging_name(target, secrets.token_hex(_RANDOM_CHARS // 2)))
        try:
            os.mkdir(staging, 0o777)  # the umask applies, unlike tempfile.mkdtemp's 0700
            break
        except FileExistsError:
            continue
    try:
        (staging / MARKER).write_bytes(marker_bytes(files))
        for name, data in sorted(files.items()):
            (staging / name).write_bytes(data)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return staging


def _swap_in(staging: Path, target: Path) -> None:
    """Put the staging folder at `target`; remove the previous build it replaces (moec's,
    so its folders are made writable where they were made read-only). Once the new build is
    in place the build has succeeded: a previous build that still cannot be removed (another
    user's) stays as a leftover, which later builds try to remove again. The new
    folder takes the permissions of the one it replaces (an empty folder of the user's, or a
    previous build): a private folder stays private."""
    try:
        if not os.path.lexists(target):
            os.rename(staging, target)
            return
        os.chmod(staging, stat.S_IMODE(os.lstat(target).st_mode))
        if _exchange(staging, target):
            _remove_build(staging)  # now holds the previous package
        else:
            previous = target.with_name(_staging_name(target, "previous"))
            os.rename(target, previous)
            os.rename(staging, target)
            _remove_build(previous)
    finally:
        if os.path.lexists(staging):
            shutil.rmtree(staging, ignore_errors=True)


def _remove_build(folder: Path) -> None:
    """Remove a folder of moec's making (a previous build or a killed build's leftover), making
    each of its folders writable and searchable first where a user made it read-only. Best
    effort: what still cannot be removed stays."""

    def writable(path: str) -> None:
        with contextlib.suppress(OSError):
            if stat.S_ISDIR(os.lstat(path).st_mode):
                os.chmod(path, stat.S_IMODE(os.lstat(path).st_mode) | stat.S_IRWXU)

    writable(str(folder))
    for root, folders, _ in os.walk(folder):
        for name in folders:  # os.walk does not follow links: a link's target is left alone
            writable(os.path.join(root, name))
    shutil.rmtree(folder, ignore_errors=True)


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
    # as given, as os.rename takes them: os.path.abspath would make `link/..` link's folder
    paths = (os.fsencode(first), os.fsencode(second))
    return renameat2(_AT_FDCWD, paths[0], _AT_FDCWD, paths[1], _RENAME_EXCHANGE) == 0


def _remove_leftovers(target: Path) -> None:
    """Remove the staging folders of earlier builds of `target` that were killed (the caller
    holds the folder lock, so no live build owns one): those holding moec's marker
    (foreign_reason with leftover). Any other folder of such a name is left alone, even an
    empty one that a build killed before it wrote its marker leaves. Best effort: a failure
    is no error."""
    for entry in os.scandir(target.parent):
        if not is_leftover_name(entry.name, target.name):
            continue
        if entry.is_dir(follow_symlinks=False) and foreign_reason(Path(entry.path), True) is None:
            _remove_build(Path(entry.path))


@contextlib.contextmanager
def _folder_lock(folder: Path) -> Iterator[None]:
    """An exclusive flock on `folder` while the block runs (nothing where flock is missing)."""
    try:
        import fcntl
    except ImportError:  # not POSIX: builds are not serialized
        yield
        return
    try:
        descriptor = os.open(folder, os.O_RDONLY)
    except OSError:  # a folder one may write but not read: unserialized
        yield
        return
    try:
        with contextlib.suppress(OSError):  # file systems without locks: unserialized
            fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)  # releases the lock


# --- paths --------------------------------------------------------------------------------


def make_folder(folder: Path) -> Path:
    """Create `folder` and its parents as needed; raise MoecError when a part is no folder."""
    existing = _nearest_existing(Path(folder))
    if not existing.is_dir():
        raise _not_a_folder(existing)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _not_a_folder(path: Path) -> MoecError:
    what = f"is {kind_of(path)}, not a folder"
    hint = "an output folder that is a folder, or that does not exist yet"
    return MoecError([problem("", what, hint)], str(path), kind="io")


def _nearest_existing(path: Path) -> Path:
    while not os.path.lexists(path) and path != path.parent:
        path = path.parent
    return path


def check_limits(path: Path, children: Sequence[str] = ()) -> None:
    """Raise MoecError when a name in `path` (or a child name to be written in it) is longer
    than NAME_MAX, or the longest path is longer than PATH_MAX, of the file system there."""
    absolute = Path(os.path.abspath(path))
    existing = _nearest_existing(absolute)
    name_max = _pathconf(existing, "PC_NAME_MAX", 255)
    path_max = _pathconf(existing, "PC_PATH_MAX", 4096)
    for name in [*absolute.parts[1:], *children]:
        size = len(os.fsencode(name))
        if size > name_max:
            raise MoecError(
                [
                    problem(
                        "",
                        f"a name of {size} bytes is longer than the file system allows "
                        f"({name_max} bytes)",
                        "a shorter name",
                    )
                ],
                str(path),
                kind="io",
            )
    longest = max((len(os.fsencode(child)) for child in children), default=0)
    size = len(os.fsencode(str(absolute))) + 1 + longest
    if size >= path_max:
        raise MoecError(
            [
                problem(
                    "",
                    f"the path is {size} bytes, longer than the file system allows ({path_max})",
                    "a shorter path",
                )
            ],
            str(path),
            kind="io",
        )


def _pathconf(path: Path, name: str, default: int) -> int:
    try:
        return int(os.pathconf(path, name))
    except (OSError, ValueError, AttributeError):
        return default


# --- single files -------------------------------------------------------------------------


def write_text(
    path: Path,
    text: str,
    written_by_moec: Callable[[bytes], bool],
    make_parents: bool = False,
    recorded: bool = False,
) -> None:
    """Write `text` (UTF-8) to the file `path` as write_bytes does."""
    write_bytes(path, text.encode("utf-8"), written_by_moec, make_parents, recorded)


def write_bytes(
    path: Path,
    data: bytes,
    written_by_moec: Callable[[bytes], bool],
    make_parents: bool = False,
    recorded: bool = False,
) -> None:
    """Write `data` to the file `path` atomically (a temporary file beside it, renamed over
    it). An existing file is replaced only when `written_by_moec(its bytes)`; a folder, a
    link or a special file there is refused. `recorded`: the digest of `data` is kept beside
    the file (records.record_path), and an existing file is replaced only when its record
    holds the digest of its bytes too. Raise MoecError when refused or the OS refuses."""
    path = Path(path)
    _refuse_a_folders_name(path)
    names = [path.name, f".{path.name}{_STAGING_TAG}xxxxxxxx", records.record_path(path).name]
    check_limits(path.parent, names)
    try:
        parent = make_folder(path.parent) if make_parents else _existing_folder(path.parent)
        refuse_unless_moec_file(path, written_by_moec, recorded)
        _replace(parent, path, data)
        if recorded:  # after the file: a write cut short between the two is refused next time
            _replace(parent, records.record_path(path), records.record_bytes(data))
    except OSError as error:
        raise _named(error, path) from None


def _replace(parent: Path, path: Path, data: bytes) -> None:
    """Put `data` at `path` in one rename, from a temporary file beside it in `parent`."""
    temporary = parent / f".{path.name}{_STAGING_TAG}{secrets.token_hex(4)}"
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
        os.replace(temporary, path)
    finally:
        if os.path.lexists(temporary):
            os.unlink(temporary)


def _existing_folder(folder: Path) -> Path:
    folder = folder if str(folder) else Path(".")
    if not os.path.lexists(folder):
        raise MoecError(
            [problem("", "no such folder", "create it first, or write elsewhere")],
            str(folder),
            kind="io",
        )
    if not folder.is_dir():
        raise _not_a_folder(folder)
    return folder


def _refuse_a_folders_name(path: Path) -> None:
    """MoecError (usage) where `path` has no file name (".", "/"): it names a folder."""
    if not Path(path).name:
        hint = "the path of a file to write, not a folder"
        raise MoecError([problem("", "is a folder", hint)], str(path), kind="usage")


def refuse_unless_moec_file(
    path: Path, written_by_moec: Callable[[bytes], bool], recorded: bool = False
) -> None:
    """MoecError (usage) unless `path` is absent or a regular file that `written_by_moec`
    recognizes (and, `recorded`, whose record holds its digest): what write_bytes may replace.
    Callers that work long before they write ask first."""
    _refuse_a_folders_name(path)
    record = records.record_path(path)
    if recorded and not records.is_replaceable(record):
        reason = f"is {kind_of(record)}, not the record moec keeps of {path.name}"
        hint = "move it away, or write to another path"
        raise MoecError([problem("", reason, hint)], str(record), kind="usage")
    hint = "remove it first, or write to another path"
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISDIR(mode):
        reason, hint = "is a folder", "the path of a file to write, not a folder"
    elif stat.S_ISLNK(mode):
        reason, hint = "is a symbolic link; moec does not write through it", "another path"
    elif not stat.S_ISREG(mode):
        reason, hint = f"is {kind_of(path)}, not a regular file", "another path"
    elif not written_by_moec(_head(path)):
        reason = "exists and was not written by moec; it is left as it is"
    elif recorded and (unrecorded := records.unrecorded_reason(path)):
        reason = f"{unrecorded}; it is left as it is"
    else:
        return
    raise MoecError([problem("", reason, hint)], str(path), kind="usage")


def _head(path: Path, size: int = 1 << 20) -> bytes:
    """The first `size` bytes of a file (a file moec writes is smaller)."""
    with open(path, "rb") as handle:
        return handle.read(size)
