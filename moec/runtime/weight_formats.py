"""How one set of experts stores its weights: quantize a float weight, or check and convert a
checkpoint's (weight, weight_scale_inv) pair, and slice or stack converted weights.

A converted weight is a pair (values, scale): bf16 values and no scale; e4m3 values with one
fp32 scale (fp8_per_tensor) or fp32 scales per block of `block` values (fp8_block, mxfp8);
packed e2m1 bytes with 1 x 32 power-of-two scales (mxfp4).
"""

import math
from dataclasses import dataclass

import torch

from . import quant

Pair = tuple[torch.Tensor, torch.Tensor | None]


@dataclass(frozen=True)
class WeightFormat:
    """One quantization scheme as the weights use it."""

    scheme: str
    """bf16 | fp8_per_tensor | fp8_block | mxfp8 | mxfp4."""
    block: tuple[int, int] | None
    """(rows, cols) of values sharing one scale; None: one scale per tensor, or unscaled."""
    pow2: bool
    """Scales are powers of two (UE8M0)."""
    checkpoint_quantized: bool
    """The checkpoint already holds this scheme's values and `weight_scale_inv`."""
    static: bool
    """Static activation scales: the checkpoint holds each projection's `input_scale`."""
    dtype: torch.dtype
    """The model dtype (bf16 weights are stored in it)."""
    source: str | None = None
    """"mxfp4": the weights are mxfp4 (checkpoint, or quantized from floats) stored as this
    fp8_block format, converted exactly at load (quant.e2m1_to_e4m3_blocks)."""

    @property
    def pack(self) -> int:
        """Values per stored element along K."""
        return 2 if self.scheme == "mxfp4" else 1

    def from_float(self, w: torch.Tensor) -> Pair:
        """Quantize a float weight [N, K] into this format."""
        if self.source == "mxfp4":  # the mxfp4 values, exactly, as e4m3 blocks
            return quant.e2m1_to_e4m3_blocks(*quant.quantize_e2m1(w), self.block[0])
        if self.scheme == "bf16":
            return w.to(self.dtype), None
        if self.scheme == "fp8_per_tensor":
            return quant.quantize_tensor(w)
        if self.scheme == "mxfp4":
            return quant.quantize_e2m1(w)
        return quant.quantize_blocks(w, self.block[0], self.block[1], pow2=self.pow2)

    def from_checkpoint(
        self, value, scale, shape: tuple[int, int], name: str, problems: list[str]
    ) -> Pair | None:
        """Check a checkpoint weight of logical shape [N, K] and its scale; convert them.
        Problems are appended to `problems` (None is returned then)."""
        if self.source == "mxfp4":
            return self._from_mxfp4(value, scale, shape, name, problems)
        if value is None:
            problems.append(f"{name}.weight: missing")
            return None
        packed = self.checkpoint_quantized and self.scheme == "mxfp4"
        if not packed and not value.dtype.is_floating_point:
            problems.append(
                f"{name}.weight: {value.dtype} {list(value.shape)}: expected floating-point "
                "values (integer bytes are weights only in a packed mxfp4 checkpoint)"
            )
            return None
        if not self.checkpoint_quantized or self.scheme == "bf16":
            if tuple(value.shape) != tuple(shape):
                problems.append(f"{name}.weight: shape {list(value.shape)}, expected {list(shape)}")
                return None
            if scale is not None:
                problems.append(
                    f"{name}.weight_scale_inv: unexpected for a {self.scheme} checkpoint of "
                    "float weights"
                )
                return None
            return self.from_float(value.float())
        if self.scheme == "mxfp4":
            stored = (shape[0], shape[1] // 2)
            if value.dtype not in (torch.uint8, torch.int8) or tuple(value.shape) != stored:
                problems.append(
                    f"{name}.weight: {value.dtype} {list(value.shape)}, expected packed uint8 "
                    f"{list(stored)}"
                )
                return None
            value = value.view(torch.uint8)
        else:
            if tuple(value.shape) != tuple(shape):
                problems.append(f"{name}.weight: shape {list(value.shape)}, expected {list(shape)}")
                return None
            if value.element_size() != 1:
                # A float weight where fp8 is expected: quantize it, as a bf16 checkpoint is.
                return self.from_float(value.float())
        return self._checkpoint_scale(value, scale, shape, name, problems)

    def _from_mxfp4(self, value, scale, shape, name, problems) -> Pair | None:
        """An mxfp4 checkpoint pair (or a float weight, quantized to mxfp4 first), checked as
        mxfp4 weights are, stored as e4m3 blocks."""
        mxfp4 = WeightFormat("mxfp4", (1, 32), True, self.checkpoint_quantized, False, self.dtype)
        pair = mxfp4.from_checkpoint(value, scale, shape, name, problems)
        if pair is None:
            return None
        try:
            return quant.e2m1_to_e4m3_blocks(pair[0], pair[1], self.block[0])
        except ValueError as error:
            problems.append(f"{name}.weight: mxfp4 to e4m3: {error}")
            return None

    def _checkpoint_scale(self, value, scale, shape, name, problems) -> Pair | None:
        if self.block is None:
            expected = (1,)
        else:
            expected = (math.ceil(shape[0] / self.block[0]), math.ceil(shape[1] / self.block[1]))
        if scale is None:
            problems.append(f"{name}.weight_scale_inv: missing")
            return None
        if not scale.dtype.is_floating_point and scale.dtype != torch.uint8:
            problems.append(
                f"{name}.weight_scale_inv: {scale.dtype}: expected floating-point scales, or "
                "UE8M0 exponents as uint8"
            )
            return None
        scale = _scale_values(scale)
        if scale.numel() == 1 and math.prod(expected) == 1:  # [], [1] or [1, 1]: one scale
            scale = scale.reshape(expected)
        if tuple(scale.shape) != expected:
            problems.append(
                f"{name}.weight_scale_inv: shape {list(scale.shape)}, expected {list(expected)}"
            )
            return None
        needs_pow2 = self.pow2 and self.scheme in ("fp8_block", "mxfp8")
        if needs_pow2 and not torch.equal(scale, quant.round_up_pow2(scale)):
            # fp32 scales where UE8M0 is needed: requantize with power-of-two scales.
            dequantized = quant.dequantize_blocks(value, scale, self.block[0], self.block[1])
            return self.from_float(dequantized)
        return value, scale

    def slice(self, pair: Pair, dim: int, start: int, count: int) -> Pair:
        """Rows (dim 0) or columns (dim 1) [start, start + count) of a weight and its scale."""
        value, scale = pair
        pack = self.pack if dim == 1 else 1
        value = value.narrow(dim, start // pack, count // pack)
        if scale is not None and self.block is not None:
            unit = self.block[dim]
            scale = scale.narrow(dim, start // unit, math.ceil(count / unit))
        return value, scale

    def concat_rows(self, first: Pair, second: Pair) -> Pair:
        """[gate; up] of two converted weights (per-tensor: requantized to the larger scale)."""
        (a, a_scale), (b, b_scale) = first, second
        if self.scheme == "fp8_per_tensor":
            scale = torch.maximum(a_scale, b_scale)
            a = quant.quantize_with_scale(a.float() * a_scale, scale)
            b = quant.quantize_with_scale(b.float() * b_scale, scale)
            return torch.cat((a, b)), scale
        return torch.cat((a, b)), (None if a_scale is None else torch.cat((a_scale, b_scale)))


def _scale_values(scale: torch.Tensor) -> torch.Tensor:
    """fp32 scales from fp32 / bf16 values or UE8M0 exponents stored as uint8."""
    if scale.dtype == torch.uint8:
        return torch.exp2(scale.float() - 127.0)
    return scale.float()
