"""Where the templates and schemas are: inside the wheel, or in the source tree.

A wheel carries the top-level `templates/` and `schemas/` as `moec/_data/...`; an editable
install maps neither, so the source tree beside the package is the fallback.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def _data_dir(name: str) -> Path:
    for candidate in (_PACKAGE / "_data" / name, _PACKAGE.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"moec's {name}/ folder is missing from this installation")


def templates_dir() -> Path:
    return _data_dir("templates")


def schema_path() -> Path:
    """Where `moec schema` writes by default: ./schemas/ of the current folder."""
    return Path("schemas") / "moec-spec.schema.json"


def shipped_schema_path() -> Path:
    return _data_dir("schemas") / "moec-spec.schema.json"
