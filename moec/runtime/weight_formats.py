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
    pow2_scales: bool
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
    def scale_block(self) -> tuple[int, int]:
        """`block`, for the schemes that scale blocks of values (the others have none)."""
        if self.block is None:
            raise ValueError(f"{self.scheme} weights have no scale blocks")
        return self.block

    @property
    def pack(self) -> int:
        """Values per stored element along K."""
        return 2 if self.scheme == "mxfp4" else 1

    def from_float(self, w: torch.Tensor) -> Pair:
        """Quantize a float weight [N, K] into this format."""
        if self.source == "mxfp4":  # the mxfp4 values, exactly, as e4m3 blocks
            return quant.e2m1_to_e4m3_blocks(*quant.quantize_e2m1(w), self.scale_block[0])
        if self.scheme == "bf16":
            return w.to(self.dtype), None
        if self.scheme == "fp8_per_tensor":
            return quant.quantize_tensor(w)
        if self.scheme == "mxfp4":
            return quant.quantize_e2m1(w)
        return quant.quantize_blocks(w, *self.scale_block, pow2_scales=self.pow2_scales)

    def from_checkpoint(
        self,
        value,
        scale,
        shape: tuple[int, int],
        name: str,
        problems: list[str],
        names: tuple[str | None, str | None] = (None, None),
    ) -> Pair | None:
        """Check a checkpoint weight of logical shape [N, K] and its scale; convert them.
        Problems are appended to `problems` (None is returned then), naming the checkpoint
        tensors: `names` (weight, scale) as the checkpoint spells them, else `name`.weight and
        `name`.weight_scale_inv."""
        if self.source == "mxfp4":
            return self._from_mxfp4(value, scale, shape, name, problems, names)
        wname = names[0] or f"{name}.weight"
        sname = names[1] or f"{name}.weight_scale_inv"
        if value is None:
            problems.append(f"{wname}: missing")
            return None
        packed = self.checkpoint_quantized and self.scheme == "mxfp4"
        if not packed and not value.dtype.is_floating_point:
            problems.append(
                f"{wname}: {value.dtype} {list(value.shape)}: expected floating-point "
                "values (integer bytes are weights only in a packed mxfp4 checkpoint)"
            )
            return None
        if not self.checkpoint_quantized or self.scheme == "bf16":
            if tuple(value.shape) != tuple(shape):
                problems.append(f"{wname}: shape {list(value.shape)}, expected {list(shape)}")
                return None
            if scale is not None:
                problems.append(
                    f"{sname}: unexpected for a {self.scheme} checkpoint of float weights "
                    + (
                        "(bf16 weights take no scales)"
                        if self.scheme == "bf16"
                        else '(quant.checkpoint = "bf16"; a checkpoint quantized in this '
                        'scheme, with its scales: quant.checkpoint = "quantized")'
                    )
                )
                return None
            return self._from_wide(value, wname, problems)
        if self.scheme == "mxfp4":
            stored = (shape[0], shape[1] // 2)
            if value.dtype not in (torch.uint8, torch.int8) or tuple(value.shape) != stored:
                problems.append(
                    f"{wname}: {value.dtype} {list(value.shape)}, expected packed uint8 "
                    f"{list(stored)}"
                )
                return None
            value = value.view(torch.uint8)
        else:
            if tuple(value.shape) != tuple(shape):
                problems.append(f"{wname}: shape {list(value.shape)}, expected {list(shape)}")
                return None
            if value.element_size() != 1:
                # A float weight where fp8 is expected: quantize it, as a bf16 checkpoint is;
                # beside a scale it may be fp8 values widened without it (wrong by the scale).
                if scale is not None:
                    problems.append(
                        f"{sname}: beside a {value.dtype} weight {wname}: a scale goes with "
                        "e4m3 values; give the float weight without its scale (quantized on "
                        "load), or its e4m3 values with it"
                    )
                    return None
                return self._from_wide(value, wname, problems)
            if value.dtype != torch.float8_e4m3fn and value.dtype not in _OTHER_FP8:
                problems.append(
                    f"{wname}: {value.dtype} values: expected float8_e4m3fn (or float8_e5m2 / "
                    "float8_e4m3fnuz, converted exactly) with its scale, or bf16 / fp16 / fp32 "
                    "weights (quantized on load)"
                )
                return None
        return self._checkpoint_scale(value, scale, shape, wname, sname, problems)

    def _from_wide(self, value, wname: str, problems: list[str]) -> Pair | None:
        """A bf16 / fp16 / fp32 / fp64 weight in this format, its values within bf16's range
        (non-finite values are reported by read_tensors)."""
        values = value.float()
        beyond = int((values.abs() > BF16_MAX).sum())
        if beyond and bool(torch.isfinite(value).all()):
            problems.append(
                f"{wname}: {beyond} of its {value.numel()} values are beyond what bf16 holds "
                f"({BF16_MAX:.4g})"
            )
        return None if beyond else self.from_float(values)

    def _from_mxfp4(self, value, scale, shape, name, problems, names) -> Pair | None:
        """An mxfp4 checkpoint pair (or a float weight, quantized to mxfp4 first), checked as
        mxfp4 weights are, stored as e4m3 blocks."""
        mxfp4 = WeightFormat("mxfp4", (1, 32), True, self.checkpoint_quantized, False, self.dtype)
        pair = mxfp4.from_checkpoint(value, scale, shape, name, problems, names)
        if pair is None:
            return None
        value, scale = pair
        assert scale is not None  # an mxfp4 pair holds its scales
        try:
            return quant.e2m1_to_e4m3_blocks(value, scale, self.scale_block[0])
        except ValueError as error:
            problems.append(f"{names[0] or name + '.weight'}: mxfp4 to e4m3: {error}")
            return None

    def _checkpoint_scale(self, value, scale, shape, wname, sname, problems) -> Pair | None:
        expected: tuple[int, ...]
        if self.block is None:
            expected = (1,)
        else:
            expected = (math.ceil(shape[0] / self.block[0]), math.ceil(shape[1] / self.block[1]))
        if scale is None:
            problems.append(f"{sname}: missing")
            return None
        if not scale.dtype.is_floating_point and scale.dtype != torch.uint8:
            problems.append(
                f"{sname}: {scale.dtype}: expected floating-point scales, or "
                "UE8M0 exponents as uint8"
            )
            return None
        exponents = scale.dtype == torch.uint8
        stored, scale = scale, _scale_values(scale)
        if scale.numel() == 1 and math.prod(expected) == 1:  # [], [1] or [1, 1]: one scale
            scale = scale.reshape(expected)
        if tuple(scale.shape) != expected:
            problems.append(f"{sname}: shape {list(scale.shape)}, expected {list(expected)}")
            return None
        if not bool(torch.isfinite(scale).all()):
            if exponents:
                problems.append(f"{sname}: UE8M0 exponent 255 (nan): not a scale")
            elif bool(torch.isfinite(stored).all()):  # read_tensors reports the others
                problems.append(f"{sname}: scales beyond fp32 (the scales of this layer)")
            return None
        nonpositive = (scale <= 0).flatten().nonzero()
        if len(nonpositive):
            problems.append(
                f"{sname}: {len(nonpositive)} of its {scale.numel()} scales are zero or negative "
                f"(the first: block {_block_index(int(nonpositive[0]), scale)}); a scale is > 0"
            )
            return None
        if value.dtype in _OTHER_FP8:
            converted = _to_e4m3(value, scale, self.block)
            if converted is None:
                problems.append(
                    f"{wname}: {value.dtype} values that float8_e4m3fn cannot hold exactly (a "
                    "block spans more powers of two than e4m3 holds); expected float8_e4m3fn, "
                    "or bf16 / fp16 / fp32 weights (quantized on load)"
                )
                return None
            value, scale = converted
        overflow = overflowing_block(value, scale, self.block, self.scheme == "mxfp4")
        if overflow is not None:
            problems.append(overflow_message(sname, f"block {overflow}", f"this weight ({wname})"))
            return None
        # frexp's mantissa is 1/2 for every power of two, 2**-127 (UE8M0's exponent 0) included
        odd = (torch.frexp(scale.float())[0] != 0.5).flatten().nonzero()
        if self.pow2_scales and len(odd) and self.scheme == "mxfp4":
            problems.append(
                f"{sname}: {len(odd)} of its {scale.numel()} scales are no power of two (the "
                f"first: block {_block_index(int(odd[0]), scale)}); mxfp4 scales are UE8M0, and "
                "e2m1 values cannot be requantized to other scales without loss"
            )
            return None
        if self.pow2_scales and len(odd):
            # fp32 scales where UE8M0 is needed: requantize with power-of-two scales.
            dequantized = quant.dequantize_blocks(value, scale, *self.scale_block)
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
            assert a_scale is not None and b_scale is not None  # one scale per tensor
            scale = torch.maximum(a_scale, b_scale)
            a = quant.quantize_with_scale(a.float() * a_scale, scale)
            b = quant.quantize_with_scale(b.float() * b_scale, scale)
            return torch.cat((a, b)), scale
        if a_scale is None:  # bf16: no scales
            return torch.cat((a, b)), None
        assert b_scale is not None  # both weights are of this format
        return torch.cat((a, b)), torch.cat((a_scale, b_scale))


BF16_MAX = torch.finfo(torch.bfloat16).max
_OTHER_FP8 = tuple(
    getattr(torch, name)
    for name in ("float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
    if hasattr(torch, name)
)
"""One-byte float formats of a checkpoint's weight values converted exactly to e4m3fn, where
each block's values fit (the scale absorbing the exponent range)."""
_E4M3_MAX = 448.0


def _block_index(flat: int, scale: torch.Tensor) -> str:
    """A scale's position by its flat index: "(row, col)" of the block grid, or "0"."""
    if scale.dim() < 2:
        return str(flat)
    return str(tuple(divmod(flat, scale.shape[1])))


def _block_amax(value: torch.Tensor, block, packed: bool) -> torch.Tensor:
    """The largest magnitude of each block's values, in the shape of its scales."""
    values = (quant.unpack_e2m1(value) if packed else value.float()).abs()
    if block is None:
        return values.amax().reshape(1)
    return quant._blocked(values, *block).amax(dim=(1, 3))


def overflowing_block(value, scale, block, packed: bool) -> str | None:
    """The first block whose largest value times its scale is beyond bf16 (None: none is)."""
    product = _block_amax(value, block, packed) * scale.reshape(
        -1 if block is None else scale.shape
    )
    bad = (~(product <= BF16_MAX)).flatten().nonzero()
    return _block_index(int(bad[0]), scale) if len(bad) else None


def overflow_message(scale_name: str, where: str, weight: str) -> str:
    """The refusal of a scale that takes a block of its weight past bf16 (overflowing_block),
    for a checkpoint's tensors and for a state dict's alike."""
    return (
        f"{scale_name}: {where}: its largest weight times its scale exceeds what bf16 holds "
        f"({BF16_MAX:.4g}): not a scale of {weight}"
    )


def _to_e4m3(value: torch.Tensor, scale: torch.Tensor, block) -> Pair | None:
    """Another one-byte float format's values as e4m3fn, exactly: each block shifted by a power
    of two that brings its largest value within e4m3's range, the scale multiplied by it. None
    when a block's values do not all survive (too wide a range of exponents)."""
    values = value.float()
    amax = _block_amax(value, block, False)
    shift = torch.ceil(torch.log2(amax / _E4M3_MAX))
    shift = torch.where(amax > 0, shift, torch.zeros_like(shift))
    shift = shift + (amax * torch.exp2(-shift) > _E4M3_MAX).float()  # log2 rounded down
    factor = torch.exp2(shift)
    if block is None:
        full = factor.reshape(())
    else:
        full = quant.dequantize_blocks(torch.ones_like(values), factor, *block)
    e4m3 = (values / full).to(torch.float8_e4m3fn)
    if not torch.equal(e4m3.float() * full, values):
        return None
    return e4m3, scale * factor.reshape(scale.shape)


def _scale_values(scale: torch.Tensor) -> torch.Tensor:
    """fp32 scales from fp32 / bf16 values or UE8M0 exponents stored as uint8."""
    if scale.dtype == torch.uint8:
        return torch.exp2(scale.float() - 127.0)
    return scale.float()
