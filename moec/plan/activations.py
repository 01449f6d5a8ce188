"""Gated activations, each defined once as data and lowered to torch or Triton source.

A definition is a list of assignments over fp32 tensors. The inputs are `gate` and `up`, the two
halves of the gate/up GEMM output; the last assignment must bind `out`. Right-hand sides use a
tiny expression language: numbers, names, `+ - * /`, unary minus, and the calls below. Parameters
(`L`, `alpha`, ...) are bound to the spec's floats and rendered as literals.

    sigmoid(x)        logistic function
    tanh(x)           hyperbolic tangent
    minimum(x, c)     elementwise min with a scalar
    clamp(x, lo, hi)  elementwise clamp to [lo, hi]

One definition, two lowerings: `lower(kind, params, "torch")` and `lower(..., "triton")` return
source lines for the generated package, so adding an activation is one entry here.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

# Each activation: (parameter names, assignments). `silu(x) = x * sigmoid(x)` is written out.
DEFINITIONS: dict[str, tuple[tuple[str, ...], tuple[tuple[str, str], ...]]] = {
    "silu": (
        (),
        (("out", "gate * sigmoid(gate) * up"),),
    ),
    "silu_clamped": (
        ("swiglu_limit",),
        (
            ("gate", "minimum(gate, swiglu_limit)"),
            ("up", "clamp(up, -swiglu_limit, swiglu_limit)"),
            ("out", "gate * sigmoid(gate) * up"),
        ),
    ),
    "oai_swiglu": (
        ("alpha", "limit"),
        (
            ("gate", "minimum(gate, limit)"),
            ("up", "clamp(up, -limit, limit)"),
            ("out", "(up + 1.0) * gate * sigmoid(alpha * gate)"),
        ),
    ),
    "situ": (
        ("beta", "linear_beta"),
        (
            (
                "out",
                "beta * tanh(gate / beta) * sigmoid(gate) * linear_beta * tanh(up / linear_beta)",
            ),
        ),
    ),
}

# How each call of the expression language is spelled per target. `{0}`, `{1}`, `{2}` are the
# rendered arguments. Triton's tanh is written through sigmoid so it needs no libdevice.
_CALLS = {
    "torch": {
        "sigmoid": "torch.sigmoid({0})",
        "tanh": "torch.tanh({0})",
        "minimum": "torch.clamp({0}, max={1})",
        "clamp": "torch.clamp({0}, min={1}, max={2})",
    },
    "triton": {
        "sigmoid": "tl.sigmoid({0})",
        "tanh": "(2.0 * tl.sigmoid(2.0 * ({0})) - 1.0)",
        "minimum": "tl.minimum({0}, {1})",
        "clamp": "tl.minimum(tl.maximum({0}, {1}), {2})",
    },
}
_ARITY = {"sigmoid": 1, "tanh": 1, "minimum": 2, "clamp": 3}
_BINOPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}


@dataclass(frozen=True)
class Lowered:
    """Source lines computing `out` from fp32 `gate` and `up`, for one target."""

    target: str
    lines: tuple[str, ...]


def lower(kind: str, params: dict[str, float], target: str) -> Lowered:
    """Render activation `kind` with `params` for `target` ("torch" or "triton")."""
    names, assignments = DEFINITIONS[kind]
    missing = set(names) - set(params)
    if missing:
        raise ValueError(f"activation {kind} needs parameters {sorted(missing)}")
    values = {name: float(params[name]) for name in names}
    lines = []
    for target_name, expression in assignments:
        tree = ast.parse(expression, mode="eval").body
        lines.append(f"{target_name} = {_render(tree, values, target)[0]}")
    return Lowered(target, tuple(lines))


# Binding strength of what `_render` returns: atoms and calls bind tightest.
_ATOM, _PRODUCT, _SUM = 3, 2, 1


def _render(node: ast.expr, values: dict[str, float], target: str) -> tuple[str, int]:
    """Source of `node` and its binding strength, with only the parentheses it needs."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return _number(float(node.value))
    if isinstance(node, ast.Name):
        if node.id in values:
            return _number(values[node.id])
        if node.id in ("gate", "up"):
            return node.id, _ATOM
        raise ValueError(f"unknown name {node.id!r} in an activation definition")
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        operand, strength = _render(node.operand, values, target)
        if operand.startswith("-"):
            return operand[1:], _ATOM
        return f"-{_wrap(operand, strength, _ATOM)}", _PRODUCT
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        strength = _SUM if isinstance(node.op, (ast.Add, ast.Sub)) else _PRODUCT
        left, left_strength = _render(node.left, values, target)
        right, right_strength = _render(node.right, values, target)
        # Left-associative: the right operand of - or / needs parentheses at equal strength.
        right_floor = strength + 1 if isinstance(node.op, (ast.Sub, ast.Div)) else strength
        left = _wrap(left, left_strength, strength)
        right = _wrap(right, right_strength, right_floor)
        return f"{left} {_BINOPS[type(node.op)]} {right}", strength
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _ARITY:
        if len(node.args) != _ARITY[node.func.id] or node.keywords:
            raise ValueError(f"{node.func.id} takes {_ARITY[node.func.id]} arguments")
        args = [_render(arg, values, target)[0] for arg in node.args]
        return _CALLS[target][node.func.id].format(*args), _ATOM
    raise ValueError(f"unsupported expression in an activation definition: {ast.dump(node)}")


def _number(value: float) -> tuple[str, int]:
    text = repr(value)
    return text, (_PRODUCT if text.startswith("-") else _ATOM)


def _wrap(text: str, strength: int, needed: int) -> str:
    return text if strength >= needed else f"({text})"
