"""The Jinja environment: strict, no autoescape, and filters that keep spec values inert.

Spec strings reach generated code only through `lit` (a Python literal of a plain value) or
`ident` (an ASCII identifier that is not a keyword); anything else is a build error. Text in a
docstring goes through `prose`, which leaves it no way to end or change the string: it can
name a path from the environment (the tuned table a layer's tiles came from).
"""

from __future__ import annotations

import keyword
import math
import re
import textwrap
from typing import Any

import jinja2

from moec.resources import templates_dir

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def literal(value: Any) -> str:
    """Python source of a plain value: None, bool, int, float, str, or lists/tuples/dicts of them."""
    if value is None or isinstance(value, bool):
        return repr(value)
    if isinstance(value, int):
        return repr(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return f'float("{value}")'
        return repr(value)
    if isinstance(value, str):  # a vocabulary member (moec/vocab.py) as its plain string
        return repr(str.__str__(value))
    if isinstance(value, (list, tuple)):
        items = ", ".join(literal(v) for v in value)
        if isinstance(value, tuple):
            return f"({items},)" if len(value) == 1 else f"({items})"
        return f"[{items}]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{literal(k)}: {literal(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"not a plain value for generated code: {type(value).__name__}")


def identifier(value: Any) -> str:
    if not isinstance(value, str) or not _IDENTIFIER.match(value) or keyword.iskeyword(value):
        raise ValueError(f"not a safe identifier for generated code: {value!r}")
    return value


def prose(value: Any) -> str:
    """Text for the inside of a triple-quoted docstring: double quotes become single ones (no
    run of them can close the string), backslashes are escaped, control characters other than
    newline and tab become "?"."""
    if not isinstance(value, str):
        raise TypeError(f"not text for a docstring: {type(value).__name__}")
    text = value.replace("\\", "\\\\").replace('"', "'")
    return "".join(c if c >= " " or c in "\n\t" else "?" for c in text)


WIDTH = 96
"""Columns of the generated prose (ruff's line length, less a little)."""


def wrap(text: str, width: int, first: str = "", then: str = "") -> list[str]:
    """`text` in lines of at most `width` columns (a longer word stays whole), starting with
    `first` and `then`; a shape such as [T, H] is never split."""
    kept = re.sub(r"\[[^\]]*\]", lambda m: m.group(0).replace(" ", "\0"), text)
    lines = textwrap.wrap(
        kept,
        width,
        initial_indent=first,
        subsequent_indent=then,
        break_long_words=False,
        break_on_hyphens=False,
    )
    return [line.replace("\0", " ") for line in lines]


def wrapped(value: str, indent: int = 4) -> str:
    """One paragraph of docstring text at `indent` spaces, wrapped at WIDTH: the first line
    after the opening quotes, the others at the indent."""
    lines = wrap(value, WIDTH - indent, first="   ")
    return f"\n{' ' * indent}".join([lines[0][3:], *lines[1:]]) if lines else ""


def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    env.filters["lit"] = literal
    env.filters["ident"] = identifier
    env.filters["prose"] = prose
    env.filters["wrapped"] = wrapped
    return env


def render(env: jinja2.Environment, template: str, context: dict[str, Any]) -> str:
    return env.get_template(template).render(**context)
