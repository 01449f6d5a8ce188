"""Tensor types carried by the plan's edges: dtype, symbolic shape, layout and scale type.

A stage declares the types it accepts on each input; where a producer's type differs from what
its consumer accepts, the planner inserts a converter (passes/convert.py). Scale layout is part
of the type, so no backend hides a layout conversion inside itself.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum

from moec.vocab import ScaleMajor


class DType(str, Enum):
    """Element types, with one lookup table per target below."""

    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"
    e4m3 = "e4m3"
    e2m1x2 = "e2m1x2"
    ue8m0 = "ue8m0"
    ue8m0x4 = "ue8m0x4"
    int32 = "int32"
    int64 = "int64"

    @property
    def bytes(self) -> int:
        return _BYTES[self]

    @property
    def torch(self) -> str:
        """Attribute of `torch` naming this dtype in generated code."""
        return _TORCH[self]

    @property
    def short(self) -> str:
        return _SHORT[self]

    @property
    def pickled_as_bytes(self) -> bool:
        """Whether a pickled layer carries a tensor of this dtype as uint8 bytes: pickle.dumps
        writes torch's legacy storages, which have no class for float8 to rebuild it from."""
        return self in _PICKLED_AS_BYTES


_BYTES = {
    DType.float32: 4,
    DType.bfloat16: 2,
    DType.float16: 2,
    DType.e4m3: 1,
    DType.e2m1x2: 1,
    DType.ue8m0: 1,
    DType.ue8m0x4: 4,
    DType.int32: 4,
    DType.int64: 8,
}
_TORCH = {
    DType.float32: "float32",
    DType.bfloat16: "bfloat16",
    DType.float16: "float16",
    DType.e4m3: "float8_e4m3fn",
    DType.e2m1x2: "uint8",
    DType.ue8m0: "uint8",
    DType.ue8m0x4: "int32",
    DType.int32: "int32",
    DType.int64: "int64",
}
_SHORT = {
    DType.float32: "fp32",
    DType.bfloat16: "bf16",
    DType.float16: "fp16",
    DType.e4m3: "e4m3",
    DType.e2m1x2: "e2m1x2",
    DType.ue8m0: "ue8m0",
    DType.ue8m0x4: "ue8m0x4(int32)",
    DType.int32: "i32",
    DType.int64: "i64",
}
_PICKLED_AS_BYTES = frozenset({DType.e4m3})


class Layout(str, Enum):
    row_major = "row-major"
    contiguous = "contiguous-grouped"
    """Rows grouped by expert, padded per expert; `m_indices` per row (-1 = padding)."""
    masked = "masked-grouped"
    """[E, max_m, cols] with `masked_m[E]` valid rows per expert."""


@dataclass(frozen=True)
class ScaleType:
    """How a quantized tensor's scales are stored."""

    granularity: str
    """"per-tensor", "per-expert", "1x128", "1x32", "128x128"."""
    dtype: DType
    """fp32, or UE8M0 (fp32 powers of two, or packed four per int32)."""
    major: ScaleMajor = ScaleMajor.K
    tma_aligned: bool = False
    """MN-major scales padded so each group's column starts 16-byte aligned (TMA)."""
    pow2_scales: bool = False
    """Values are powers of two (UE8M0 semantics) even when stored as fp32."""

    def label(self) -> str:
        parts = [self.granularity, self.dtype.short]
        if self.pow2_scales and self.dtype is DType.float32:
            parts.append("pow2")
        parts.append(f"{self.major}-major")
        if self.tma_aligned:
            parts.append("TMA-aligned")
        return " ".join(parts)


@dataclass(frozen=True)
class TensorType:
    """Type of one tensor flowing along an edge."""

    dtype: DType
    shape: tuple[str, ...]
    layout: Layout = Layout.row_major
    scale: ScaleType | None = None
    record: str | None = None
    """For index metadata passed as one record (the grouped layout's routing, an all2all's
    exchange): the record's class in the generated package; `dtype` and `shape` describe its
    largest index tensor."""
    in_use: str | None = None
    """For a weight read only in part: the layer attribute (counted when its weights are set)
    saying how many of its leading entries the stage reads; None: all of it."""

    def label(self) -> str:
        text = f"{self.dtype.short}[{', '.join(self.shape)}]"
        if self.record:
            text = f"{self.record}({text})"
        if self.layout is not Layout.row_major:
            text += f" {self.layout.value}"
        if self.scale is not None:
            text += f" + scale({self.scale.label()})"
        return text

    def brief(self) -> str:
        """The type in a few words, for a comment beside the code: `e4m3[T, H] + 1x128 scales`,
        a record by its class."""
        if self.record:
            return self.record
        text = f"{self.dtype.short}[{', '.join(self.shape)}]"
        if self.scale is not None:
            text += f" + {self.scale.granularity} scales"
        return text

    def with_scale(self, scale: ScaleType | None) -> TensorType:
        return replace(self, scale=scale)

    def as_dict(self) -> dict[str, object]:
        data: dict[str, object] = {
            "dtype": self.dtype.value,
            "shape": list(self.shape),
            "layout": self.layout.value,
        }
        if self.record:
            data["record"] = self.record
        if self.scale is not None:
            data["scale"] = {
                "granularity": self.scale.granularity,
                "dtype": self.scale.dtype.value,
                "major": self.scale.major,
                "tma_aligned": self.scale.tma_aligned,
                "pow2_scales": self.scale.pow2_scales,
            }
        return data
