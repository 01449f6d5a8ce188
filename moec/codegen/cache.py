"""`moec.load(spec)`: build into a cache folder keyed by the spec's content hash and import.

The package is imported under a procedural name (`<name>_<hash12>`), so two builds of specs
that share a name, or one spec built with different overrides, live side by side in a process.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

from moec.spec import LoadedSpec, load_spec


def cache_root() -> Path:
    base = os.environ.get("MOEC_CACHE_DIR") or os.environ.get("XDG_CACHE_HOME")
    return Path(base) / "moec" if base else Path.home() / ".cache" / "moec"


def load(spec, overrides=(), cache_dir: str | Path | None = None) -> ModuleType:
    """Build `spec` (path or LoadedSpec) unless the cache has it, import it, return the module."""
    from moec.codegen import build

    loaded = spec if isinstance(spec, LoadedSpec) else load_spec(spec, overrides)
    key = f"{loaded.spec.name}_{loaded.content_hash[:12]}"
    if key in sys.modules:
        return sys.modules[key]
    folder = Path(cache_dir) if cache_dir else cache_root()
    result = build(loaded, folder / key)
    init = result.package_dir / "__init__.py"
    module_spec = importlib.util.spec_from_file_location(
        key, init, submodule_search_locations=[str(result.package_dir)]
    )
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[key] = module
    try:
        module_spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[key]
        raise
    return module
