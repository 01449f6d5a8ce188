"""The kernel templates render for every activation into a module that passes the lint gates."""

from __future__ import annotations

import ast
import subprocess
import sys

import jinja2.meta
import pytest

from .harness import TEMPLATES, activation_lines, environment, render
from .test_act_quant import ACTIVATIONS

LINE_LENGTH = 100


def ruff(*args: str, source: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args, "--stdin-filename", "kernels.py", "-"],
        input=source,
        capture_output=True,
        text=True,
        cwd=TEMPLATES.parents[1],  # the project root, for pyproject.toml's ruff settings
    )


def test_templates_are_only_holes():
    env = environment()
    for path in TEMPLATES.glob("*.py.j2"):
        names = jinja2.meta.find_undeclared_variables(env.parse(path.read_text()))
        assert names <= {"activation_lines"}, f"{path.name} uses {sorted(names)}"


@pytest.mark.parametrize("kind", list(ACTIVATIONS))
def test_rendered_module_passes_ruff(kind):
    pytest.importorskip("ruff")
    lines = activation_lines(kind, ACTIVATIONS[kind])
    source = render(lines)
    ast.parse(source)
    # A lowered line longer than the line length (situ's is) is wrapped by `ruff format`, which
    # the codegen runs after rendering; every other line is already formatted as it is.
    if max(4 + len(line) for line in lines) <= LINE_LENGTH:
        result = ruff("format", "--check", source=source)
        assert result.returncode == 0, result.stdout + result.stderr
    else:
        result = ruff("format", source=source)
        assert result.returncode == 0, result.stderr
        source = result.stdout
    result = ruff("check", source=source)
    assert result.returncode == 0, result.stdout + result.stderr
