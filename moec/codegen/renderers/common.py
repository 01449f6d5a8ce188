"""What a renderer's fill function returns, and the pieces several renderers share.

Values reach templates already turned into Python source: numbers and strings through
`literal`, names from the plan's validated identifiers; templates only place them. A call a
renderer builds is a `Call` value (function, the tensors it passes by position, every other
argument by keyword), never a string of pieces; templates pass literals by keyword too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from moec.codegen.render import literal
from moec.plan.layer import QuantFormat
from moec.vocab import GemmLayout, Scheme


@dataclass(frozen=True)
class StageCode:
    """A stage's function, as its renderer fills it."""

    doc: str
    """The function's docstring (plan-derived text only)."""
    fields: dict[str, Any] = field(default_factory=dict)
    """The template's named fields (plus `returns`, which codegen adds from the signature)."""
    bindings: tuple[tuple[str, str], ...] = ()
    """Module-level `name = expression` lines the body uses (shared by name across stages)."""
    imports: tuple[str, ...] = ()
    """Import statements the body needs beyond torch and the runtime modules."""


def call_kwargs(**values: Any) -> str:
    """`key=literal, ...` of plain values, for a call in a template."""
    return ", ".join(f"{key}={_argument(value)}" for key, value in values.items())


@dataclass(frozen=True)
class Code:
    """Source the generated code evaluates as written: a variable in scope, an attribute, a
    call (`Call` and `call_kwargs` write every other value as its Python literal)."""

    text: str


@dataclass(frozen=True)
class Call:
    """A call of the generated code, as a value. Its positional arguments are the tensors in
    scope it reads (their names); every other argument goes by keyword, as a literal or `Code`:
    no number, flag or None is passed by position."""

    function: str
    args: tuple[str, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        keywords = [f"{key}={_argument(value)}" for key, value in self.kwargs.items()]
        return f"{self.function}({', '.join([*self.args, *keywords])})"


DTYPE = Code("DTYPE")
"""The package's model dtype, a module constant of stages.py."""
PDL = Code("tiles.PDL")
"""Whether the layer's Triton kernels launch with programmatic dependent launch (tiles.py)."""


def _argument(value: Any) -> str:
    return value.text if isinstance(value, Code) else literal(value)


def matmul_binding(fmt: QuantFormat) -> tuple[str, str]:
    """The torch matmul of one format with its block sizes bound, named for the format: the
    routed and the shared experts share one binding where their formats agree."""
    if fmt.scheme == Scheme.bf16:
        name, function, extra = "matmul_bf16", "matmul_bf16", ""
    elif fmt.scheme == Scheme.fp8_per_tensor:
        name, function, extra = "matmul_fp8", "matmul_fp8_per_tensor", ""
    elif fmt.scheme == Scheme.mxfp4:
        name, function, extra = "matmul_mxfp4", "matmul_mxfp4", ""
    else:
        assert fmt.weight_block is not None, "a block-scaled format has weight blocks"
        rows, cols = fmt.weight_block
        name, function = f"matmul_blocks_{rows}x{cols}", "matmul_block_scaled"
        extra = f"group={fmt.group}, block={literal(tuple(fmt.weight_block))}, "
    return name, f"functools.partial(torch_matmul.{function}, {extra}out_dtype=DTYPE)"


def quantizer_binding(fmt: QuantFormat) -> tuple[str, str]:
    """The torch activation quantizer of one format, named for the format (shared like the
    matmul's binding)."""
    if fmt.static:
        return "quantize_static", "torch_matmul.quantize_static"
    if fmt.group is None:
        return "quantize_per_tensor", "torch_matmul.quantize_per_tensor"
    pow2 = "_pow2" if fmt.pow2_scales else ""
    return (
        f"quantize_1x{fmt.group}{pow2}",
        f"functools.partial(torch_matmul.quantize_groups, group={fmt.group}, "
        f"pow2_scales={literal(fmt.pow2_scales)})",
    )


def kernel_quant(fmt: QuantFormat | None) -> dict[str, Any]:
    """How a Triton kernel quantizes activations of `fmt`: quant mode, group size, power-of-two scales."""
    if fmt is None or not fmt.quantized:
        return {"quant": "none"}
    if fmt.group is None:
        return {"quant": "tensor", "pow2_scales": False}
    return {"quant": "group", "group_size": fmt.group, "pow2_scales": fmt.pow2_scales}


def shape_doc(stage) -> str:
    """`[rows, n]`-style shape words of a grouped tensor for docstrings."""
    return "E, max_m" if stage.layout == GemmLayout.masked else "M"


def bucket_function(plan) -> str:
    """The tiles function that picks a token bucket from a routing's row count: `bucket` (rows
    are tokens), or `received_bucket` where the rows were received from other ranks."""
    received = plan.tiles is not None and plan.tiles.received_per_token is not None
    return "received_bucket" if received else "bucket"
