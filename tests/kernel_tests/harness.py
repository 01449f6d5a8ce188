"""The Triton kernels of moec/runtime/ as the tests call them: one namespace of launchers, with
`act_quant` bound to an activation lowered from moec/plan/activations.py, as a package binds it.

Kernels run where MOEC_KERNEL_DEVICE says: "cpu" (the interpreter) or "cuda" (compiled; run the
suite with MOEC_KERNEL_DEVICE=cuda TRITON_INTERPRET=0). The tests build CPU tensors either way.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import torch

os.environ.setdefault("TRITON_INTERPRET", "1")
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

from moec.runtime import (  # noqa: E402  (after TRITON_INTERPRET is set)
    triton_act,
    triton_combine,
    triton_dispatch,
    triton_gate,
    triton_gemm,
    triton_permute,
    triton_route,
    triton_router,
    triton_select,
)

_TMP = Path(tempfile.mkdtemp(prefix="moec_activation_"))
LAUNCHERS = {
    "grouped_gemm": triton_gemm.grouped_gemm,
    "permute_quant": triton_permute.permute_quant,
    "permute_rows": triton_permute.permute_rows,
    "select_topk": triton_select.select_topk,
    "route_layout": triton_route.route_layout,
    "dispatch": triton_dispatch.dispatch,
    "combine": triton_combine.combine,
    "router_logits": triton_router.router_logits,
    "gate": triton_gate.gate,
}


def activation_lines(kind: str, params: dict[str, float] | None = None) -> tuple[str, ...]:
    return lower(kind, params or {}, "triton").lines


@functools.cache
def activation_function(lines: tuple[str, ...]):
    """A `@triton.jit` (gate, up) -> out from lowered lines (a file: Triton reads its source)."""
    body = "\n".join(f"    {line}" for line in lines)
    source = (
        "import triton\nimport triton.language as tl\n\n\n@triton.jit\n"
        f"def triton_gated(gate, up):\n{body}\n    return out\n"
    )
    name = f"moec_activation_{abs(hash(source)):x}"
    path = _TMP / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module.triton_gated


def load(kind: str = "silu", params: dict[str, float] | None = None):
    """The launchers, with act_quant bound to activation `kind`."""
    return load_lines(activation_lines(kind, params))


def load_lines(lines: tuple[str, ...]):
    """The launchers, with act_quant bound to the activation these lowered lines compute."""
    activation = activation_function(lines)
    launchers = dict(
        LAUNCHERS, act_quant=functools.partial(triton_act.act_quant, activation=activation)
    )
    if DEVICE != "cpu":
        launchers = {name: on_device(launcher) for name, launcher in launchers.items()}
    return SimpleNamespace(**launchers)


def on_device(launcher):
    """`launcher` run on DEVICE: tensor arguments are copied there and, since launchers write
    their outputs in place, copied back into the caller's tensors; returned tensors come back
    to the CPU."""

    def call(*args, **kwargs):
        copies = []

        def there(value):
            if isinstance(value, torch.Tensor):
                copies.append((value, value.to(DEVICE)))
                return copies[-1][1]
            if isinstance(value, tuple) and hasattr(value, "_fields"):  # a routing's tensors
                return type(value)(*map(there, value))
            return value

        result = launcher(*map(there, args), **{k: there(v) for k, v in kwargs.items()})
        for here, copy in copies:
            here.copy_(copy.cpu())
        if isinstance(result, tuple):
            return tuple(r.cpu() if isinstance(r, torch.Tensor) else r for r in result)
        return result.cpu() if isinstance(result, torch.Tensor) else result

    return call
