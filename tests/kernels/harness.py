"""Render `templates/kernels/*.py.j2` into one module and import it, as the codegen does.

The module is the imports the codegen writes, one blank line, then every kernel template rendered
with the same Jinja settings, in file-name order, separated by two blank lines (what `ruff format`
and isort expect, so the result passes `ruff check` and `ruff format --check` as it is). The only template variable is
`activation_lines`, the Triton lowering of one activation from `moec/plan/activations.py`.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
import tempfile
from pathlib import Path

import jinja2
import torch

os.environ.setdefault("TRITON_INTERPRET", "1")
# Where the launchers run: "cpu" (the interpreter) or "cuda" (compiled; run the suite with
# MOEC_KERNEL_DEVICE=cuda TRITON_INTERPRET=0). The tests build CPU tensors either way.
DEVICE = os.environ.get("MOEC_KERNEL_DEVICE", "cpu")

ROOT = Path(__file__).resolve().parents[2]
try:
    from moec.plan.activations import lower
except ImportError:  # the GPU image lacks the spec layer's packages; activations.py needs none
    _spec = importlib.util.spec_from_file_location(
        "moec_activations", ROOT / "moec" / "plan" / "activations.py"
    )
    _activations = importlib.util.module_from_spec(_spec)
    sys.modules[_spec.name] = _activations  # dataclasses looks the module up while it runs
    _spec.loader.exec_module(_activations)
    lower = _activations.lower

TEMPLATES = ROOT / "templates" / "kernels"
HEADER = "import torch\nimport triton\nimport triton.language as tl\n"
_TMP = Path(tempfile.mkdtemp(prefix="moec_kernels_"))


def environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )


def render(activation_lines: tuple[str, ...]) -> str:
    """Source of the kernels module: header, then each template rendered."""
    env = environment()
    parts = [
        env.get_template(path.name).render(activation_lines=list(activation_lines))
        for path in sorted(TEMPLATES.glob("*.py.j2"))
    ]
    return HEADER + "\n" + "\n\n".join(parts)


def activation_lines(kind: str, params: dict[str, float] | None = None) -> tuple[str, ...]:
    return lower(kind, params or {}, "triton").lines


@functools.cache
def load_lines(lines: tuple[str, ...]):
    """Import the module rendered with these activation lines (one file per distinct source)."""
    source = render(lines)
    name = f"moec_kernels_{abs(hash(source)):x}"
    path = _TMP / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module if DEVICE == "cpu" else OnDevice(module)


def load(kind: str = "silu", params: dict[str, float] | None = None):
    """The kernels module for one activation."""
    return load_lines(activation_lines(kind, params))


class OnDevice:
    """The kernels module with each launcher run on DEVICE: tensor arguments are copied there and,
    since launchers write their outputs in place, copied back into the caller's tensors."""

    def __init__(self, module):
        self._module = module

    def __getattr__(self, name):
        launcher = getattr(self._module, name)
        if name.startswith("_") or not callable(launcher):
            return launcher

        def call(*args, **kwargs):
            copies = []

            def there(value):
                if isinstance(value, torch.Tensor):
                    copies.append((value, value.to(DEVICE)))
                    return copies[-1][1]
                return value

            launcher(*map(there, args), **{k: there(v) for k, v in kwargs.items()})
            for here, copy in copies:
                here.copy_(copy.cpu())

        return call
