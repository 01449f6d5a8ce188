"""Typed reads of a HF config.json: each value checked against the type its key takes.

A read returns the value as written, or None when the key is absent; a value of the wrong type
is recorded as a problem naming the config key, never coerced (no "false" taken for true, no 0
for 1). A null is the key left out only where transformers reads it so (hf_nulls: a key whose
default is None, or one transformers' configuration does not define); elsewhere it is
recorded as a problem too, since transformers refuses it or keeps None (a None
norm_topk_prob is falsy, where the default is true). Where a --set key overrides the spec key
a config key becomes, a wrong value there is dropped instead: the override replaces it.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Any

from moec.errors import MoecError, Problem, problem


@dataclass(frozen=True)
class _Type:
    noun: str
    """What a key of this type holds: "an integer"."""
    hint: str
    """How to write one."""


_INTEGER = _Type("an integer", "a JSON integer without quotes, e.g. 8")
_NUMBER = _Type("a finite number", "a JSON number without quotes, e.g. 2.5")
_BOOLEAN = _Type("a boolean", "true or false, without quotes")
_STRING = _Type("a string", "a JSON string, in double quotes")
_INTEGERS = _Type("a list of integers", "e.g. [128, 128]")
_OBJECT = _Type("a JSON object", 'e.g. {"quant_method": "fp8", "weight_block_size": [128, 128]}')


NULL_MESSAGE = (
    "null is not this key left out: transformers' configuration refuses it here, or keeps "
    "None where its default is another value"
)
"""What a refused null is told (the problem's value shows `null`)."""


class _JsonNull:
    """A problem's value that shows as JSON's null (Problem.format shows None as `None`)."""

    def __repr__(self) -> str:
        return "null"

    __str__ = __repr__


JSON_NULL = _JsonNull()


class ConfigReader:
    """Reads the keys of one JSON object (the config, or a table inside it)."""

    def __init__(
        self,
        config: dict[str, Any],
        set_keys: set[str] | frozenset[str] = frozenset(),
        prefix: str = "",
        problems: list[Problem] | None = None,
        absent_nulls: frozenset[str] = frozenset(),
    ) -> None:
        self.config = config
        self.set_keys = set_keys
        self.prefix = prefix
        """Dotted path of this object in the config ("" at the top)."""
        self.problems: list[Problem] = [] if problems is None else problems
        self.absent_nulls = absent_nulls
        """The keys whose null is the key left out (hf_nulls); any other null is refused."""

    def integer(self, key: str, spec_key: str, required: bool = False) -> int | None:
        """An integer (not a bool, not a float)."""
        return self._read(key, spec_key, required, _is_integer, _INTEGER)

    def number(self, key: str, spec_key: str, required: bool = False) -> int | float | None:
        """A finite number (not a bool)."""
        return self._read(key, spec_key, required, _is_number, _NUMBER)

    def boolean(self, key: str, spec_key: str, required: bool = False) -> bool | None:
        """true or false (not "false", not 0)."""
        return self._read(key, spec_key, required, _is_bool, _BOOLEAN)

    def text(self, key: str, spec_key: str, required: bool = False) -> str | None:
        """A string."""
        return self._read(key, spec_key, required, _is_text, _STRING)

    def integers(self, key: str, spec_key: str, required: bool = False) -> list[int] | None:
        """A list of integers."""
        return self._read(key, spec_key, required, _is_integers, _INTEGERS)

    def table(self, key: str, spec_key: str, required: bool = False) -> dict[str, Any] | None:
        """A JSON object."""
        return self._read(key, spec_key, required, _is_table, _OBJECT)

    def get(self, key: str, default: Any = None, hint: str = "a value") -> Any:
        """The value of `key` as written, unchecked; `default` when it is left out, or null
        where that is the key left out (a null refused is recorded, `hint` saying what the key
        takes, and `default` returned)."""
        value = self.config.get(key)
        if value is None:
            if key in self.config:
                self.refuse_null(key, hint)
            return default
        return value

    def refuse_null(self, key: str, hint: str) -> None:
        """Record that `key` is null, unless its null is the key left out (or is recorded)."""
        path = self.prefix + key
        if key in self.absent_nulls or any(
            p.path == path and p.message == NULL_MESSAGE for p in self.problems
        ):
            return
        self.problems.append(
            problem(path, NULL_MESSAGE, f"{hint}, or leave the key out", value=JSON_NULL)
        )

    def report(self, key: str, value: Any, message: str, hint: str) -> None:
        """Record a problem with the value of `key`."""
        self.problems.append(problem(self.prefix + key, message, hint, value=value))

    def raise_problems(self) -> None:
        """Raise one MoecError with every problem recorded, if any: a key whose null is refused
        is that one problem (not also what its value left out would have been)."""
        nulls = {p.path for p in self.problems if p.message == NULL_MESSAGE}
        found = [p for p in self.problems if p.path not in nulls or p.message == NULL_MESSAGE]
        if found:
            raise MoecError(list(dict.fromkeys(found)), kind="usage")

    def _read(self, key: str, spec_key: str, required: bool, fits, expected: _Type) -> Any:
        value = self.config.get(key)
        overridden = self.overridden(spec_key)
        if value is None and key in self.config and not required and not overridden:
            self.refuse_null(key, expected.hint)
            return None
        if value is None:
            if required and not overridden:
                state = "is missing from config.json" + (" (null)" if key in self.config else "")
                self.problems.append(problem(self.prefix + key, state, expected.hint))
            return None
        if fits(value):
            return value
        if not overridden:
            message = f"is a {_json_type(value)}, not {expected.noun}"
            self.report(key, value, message, expected.hint)
        return None

    def overridden(self, spec_key: str) -> bool:
        """Whether a --set key sets `spec_key`, a key inside it, or the table holding it."""
        return any(
            key == spec_key or key.startswith(spec_key + ".") or spec_key.startswith(key + ".")
            for key in self.set_keys
        )


def _is_integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (_is_integer(value) or isinstance(value, float)) and _finite(value)


def _finite(value: int | float) -> bool:
    """A finite float, or an integer a float can hold (a larger one is no number a config
    means, and math.isfinite cannot take it)."""
    return abs(value) <= sys.float_info.max if isinstance(value, int) else math.isfinite(value)


def _is_bool(value: Any) -> bool:
    return isinstance(value, bool)


def _is_text(value: Any) -> bool:
    return isinstance(value, str)


def _is_integers(value: Any) -> bool:
    return isinstance(value, list) and all(_is_integer(item) for item in value)


def _is_table(value: Any) -> bool:
    return isinstance(value, dict)


def _json_type(value: Any) -> str:
    """The JSON name of a parsed value's type."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        if _finite(value):
            return "number"
        return "number too large for a float" if isinstance(value, int) else "non-finite number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list" if not value or not _is_integers(value) else "list of integers"
    if isinstance(value, dict):
        return "JSON object"
    return type(value).__name__
