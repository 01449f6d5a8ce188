"""The spec layer: TOML in, a validated and normalized `Spec` out. Knows no torch, no graphs."""

from moec.spec.loader import LoadedSpec, check_raw, load_spec, parse_override, parse_spec, spec_hash
from moec.spec.models import Spec

__all__ = [
    "LoadedSpec",
    "Spec",
    "check_raw",
    "load_spec",
    "parse_override",
    "parse_spec",
    "spec_hash",
]
