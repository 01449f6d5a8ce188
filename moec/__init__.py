"""moec: a declarative compiler for the DeepSeek Mixture-of-Experts layer.

spec.toml -> Spec (pydantic) -> Plan (networkx) -> generated package (Jinja) -> MoELayer
"""

from moec.errors import MoecError, Problem
from moec.version import __version__

__all__ = ["MoecError", "Problem", "__version__", "build", "load", "load_spec"]


def load_spec(path, overrides=()):
    """Read, validate and normalize a spec file; raise MoecError listing every problem."""
    from moec.spec import load_spec as _load_spec

    return _load_spec(path, overrides)


def build(spec, out_dir=None, overrides=()):
    """Generate the layer package for `spec` (a path or a LoadedSpec) under `out_dir`."""
    from moec.codegen import build as _build

    return _build(spec, out_dir, overrides)


def load(spec, overrides=(), cache_dir=None):
    """Build `spec` into a cache folder keyed by its content hash, import it, return the module."""
    from moec.codegen.cache import load as _load

    return _load(spec, overrides, cache_dir)
