"""What the plan knows of the machine that builds the package, gathered in one place before any
pass runs: the optional packages importable here and the tuned tables of each GPU. The passes
read it from the `Environment` they are given and touch nothing else of their surroundings, so
a plan is a function of (spec, environment). `Environment.detect()` is this machine's;
`Environment(frozenset({...}))` is a machine with those packages and only moec's shipped tables.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moec.errors import MoecError, problem
from moec.plan.tables import SHIPPED_TABLES, TUNED_DIR, table_error
from moec.spec.loader import read_user_json

OPTIONAL_PACKAGES = ("deep_gemm", "deep_ep", "triton")
"""The packages generated code may import beyond torch (moec/plan/support.py: PACKAGE)."""

TUNING_DIR_ENV = "MOEC_TUNING_DIR"

TableFile = tuple[str, dict[str, Any] | None]
"""A tuned table as the plan names it (~/... or moec/plan/tuned/...), and its entries (None
where there is no such file)."""


def user_tuning_dir() -> Path:
    """Where `moec tune` writes tables and the tile pass looks first: $MOEC_TUNING_DIR, else
    ~/.cache/moec/tuned; a MoecError naming MOEC_TUNING_DIR where neither is known."""
    folder = os.environ.get(TUNING_DIR_ENV)
    if folder:
        return Path(folder)
    home = home_folder()
    if home is None:
        raise MoecError(
            [
                problem(
                    TUNING_DIR_ENV,
                    "is not set and this user has no home folder",
                    "set MOEC_TUNING_DIR to a folder for the tuned tables",
                )
            ],
            "moec tune",
            kind="io",
        )
    return home / ".cache" / "moec" / "tuned"


def home_folder() -> Path | None:
    """The user's home folder; None where HOME is unset or not absolute (Path.home() raises
    RuntimeError on "~") and there is no password entry."""
    try:
        return Path.home()
    except (RuntimeError, KeyError):
        return None


def shown(path: Path) -> str:
    """`path` with the home folder written ~, as users see it."""
    home = home_folder()
    if home is None or not path.is_relative_to(home):
        return str(path)
    return f"~/{path.relative_to(home)}"


def read_table(path: Path, where: str) -> dict[str, Any]:
    """The entries of the table at `path` (a JSON object); MoecError when it is not one (a
    fifo or a file over 4 MiB is not read)."""
    try:
        entries = read_user_json(path)
    except (OSError, ValueError) as error:
        raise table_error(where, f"cannot be read: {error}") from None
    if not isinstance(entries, dict):
        raise table_error(where, "is not a JSON object of layer keys")
    return entries


@functools.cache
def shipped_table(gpu: str) -> dict[str, Any]:
    """The entries of the table moec ships for `gpu` (package data: read once)."""
    path = TUNED_DIR / SHIPPED_TABLES[gpu]
    return read_table(path, f"moec/plan/tuned/{SHIPPED_TABLES[gpu]}")


@dataclass(frozen=True)
class Environment:
    """What the machine that builds the package has."""

    importable: frozenset[str]
    """The optional packages importable here."""
    tuning_dir: Path | None = None
    """The user's tuned tables (`moec tune`'s output), looked up before the shipped ones; None:
    the shipped tables only."""
    _read: dict[str, list[TableFile]] = field(
        default_factory=dict, init=False, repr=False, compare=False, hash=False
    )
    """Each GPU's tables as first read: a plan looks them up once per GEMM side and stage, and
    every lookup sees the same file contents."""

    @classmethod
    def detect(cls) -> Environment:
        """This machine: its importable packages and the user's tuning folder."""
        found = frozenset(n for n in OPTIONAL_PACKAGES if importlib.util.find_spec(n) is not None)
        try:
            folder: Path | None = user_tuning_dir()
        except MoecError:  # no home and no MOEC_TUNING_DIR: no user's tables to look up
            folder = None
        return cls(found, folder)

    def has(self, module: str) -> bool:
        return module in self.importable

    def version(self, module: str) -> str:
        """The installed distribution's version, as the plan shows it (not imported)."""
        if not self.has(module):
            return "not installed"
        try:
            return importlib.metadata.version(module)
        except (importlib.metadata.PackageNotFoundError, ValueError):
            return "installed, version unknown"

    def tables(self, gpu: str) -> list[TableFile]:
        """The tuned tables of `gpu` in lookup order: the user's, then the one moec ships."""
        if gpu in self._read:
            return self._read[gpu]
        files: list[TableFile] = []
        if self.tuning_dir is not None:
            path = self.tuning_dir / f"{gpu}.json"
            files.append((shown(path), read_table(path, shown(path)) if path.exists() else None))
        if gpu in SHIPPED_TABLES:
            files.append((f"moec/plan/tuned/{SHIPPED_TABLES[gpu]}", shipped_table(gpu)))
        self._read[gpu] = files
        return files
