"""`moec.load(spec)`: build into a cache folder keyed by the spec's content hash and import.

The package is imported under a procedural name (`<name>_<hash12>`), so two builds of specs
that share a name, or one spec built with different overrides, live side by side in a process.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import replace
from pathlib import Path
from types import ModuleType

from moec.errors import MoecError, path_argument, problem
from moec.plan.environment import home_folder
from moec.spec import LoadedSpec

_CACHE_HINT = "set MOEC_CACHE_DIR (or pass cache_dir=) to a folder you may write to"


def cache_root() -> Path:
    """$MOEC_CACHE_DIR/moec, else $XDG_CACHE_HOME/moec, else ~/.cache/moec."""
    base = os.environ.get("MOEC_CACHE_DIR") or os.environ.get("XDG_CACHE_HOME")
    if base:
        return Path(base) / "moec"
    home = home_folder()
    if home is None:
        raise MoecError(
            [problem("MOEC_CACHE_DIR", "is not set and this user has no home folder", _CACHE_HINT)],
            "moec.load",
            kind="io",
        )
    return home / ".cache" / "moec"


def _build_cached(loaded: LoadedSpec, folder: Path):
    """Build into the cache; an OS failure names the cache folder and how to choose another."""
    from moec.codegen import build

    try:
        return build(loaded, folder)
    except MoecError as error:
        if error.kind not in ("io", "usage") or not _on_the_way(Path(error.source), folder):
            raise  # not about the cache folder (the temporary folder, say): its own hint
        problems = [
            replace(each, hint=f"{each.hint}; or {_CACHE_HINT}" if each.hint else _CACHE_HINT)
            for each in error.problems
        ]
        raise MoecError(problems, error.source, kind=error.kind) from None


def _on_the_way(path: Path, folder: Path) -> bool:
    """Whether `path` is `folder`, a folder above it or a path in it."""
    path, folder = Path(os.path.abspath(path)), Path(os.path.abspath(folder))
    return path == folder or path in folder.parents or folder in path.parents


def load(spec, overrides=(), cache_dir: str | Path | None = None) -> ModuleType:
    """Build `spec` (path or LoadedSpec) unless the cache has it, import it, return the module."""
    from moec.codegen import api_spec

    loaded = api_spec(spec, overrides, "moec.load")
    cache_dir = path_argument(cache_dir, "cache_dir", "moec.load", optional=True)
    key = f"{loaded.spec.name}_{loaded.content_hash[:12]}"
    if key in sys.modules:
        return sys.modules[key]
    folder = Path(cache_dir) if cache_dir else cache_root()
    result = _build_cached(loaded, folder / key)
    init = result.package_dir / "__init__.py"
    module_spec = importlib.util.spec_from_file_location(
        key, init, submodule_search_locations=[str(result.package_dir)]
    )
    assert module_spec is not None and module_spec.loader is not None  # a .py file has both
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[key] = module
    try:
        module_spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[key]
        raise
    return module
