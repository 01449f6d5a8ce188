"""How much memory one rank of a layer needs at the least, and how much its device has.

A lower bound, from the spec alone: the weights one rank holds (its experts' share of every
routed and shared expert, in the stored format of their scheme, scales included, and the fp32
router), and the activations of a forward of T tokens (input and output [T, H], and the T*K
routed rows through both GEMMs). The rule `layer_fits_device` compares it with the device's
memory at max_num_tokens; `moec run` with the host's memory at --tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

from moec.devices import BY_ARCH
from moec.spec.models import Spec

GIB = 2**30

HOST_MEMORY_GIB = 4096.0
"""A CPU target's ceiling: more than any one host has, so a layer beyond it is a mistake in the
dims. `moec run` checks the memory of the host it runs on."""

_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
_SCALE_BYTES = {"fp32": 4, "ue8m0": 1}


@dataclass(frozen=True)
class LayerBytes:
    weights: float
    """Weights one rank holds (values and scales)."""
    activations: float
    """Activations of one forward at the token count asked for."""

    @property
    def total(self) -> float:
        return self.weights + self.activations


def bytes_per_weight(spec: Spec, scheme: str) -> float:
    """Bytes one weight value takes stored in `scheme`, its share of the scales included."""
    if scheme == "bf16":
        return _DTYPE_BYTES[spec.target.dtype]
    values = 0.5 if scheme == "mxfp4" else 1.0
    if scheme == "fp8_per_tensor":
        return values
    block = spec.quant.weight_block or ([1, 32] if scheme in ("mxfp8", "mxfp4") else [128, 128])
    if len(block) != 2:  # reported by the rule block_shape
        return values
    scale = _SCALE_BYTES.get(spec.quant.scale_dtype or "fp32", 4)
    return values + scale / (block[0] * block[1])


def layer_bytes(spec: Spec, tokens: int) -> LayerBytes:
    """The least memory one rank needs for the weights and a forward of `tokens` tokens."""
    model, parallel = spec.model, spec.parallel
    hidden = model.hidden_size
    intermediate = -(-model.moe_intermediate_size // parallel.tp_size)
    physical = model.n_routed_experts + parallel.redundant_experts
    local_experts = -(-physical // parallel.ep_size)
    routed = local_experts * 3 * hidden * intermediate * bytes_per_weight(spec, spec.quant.scheme)
    shared_scheme = spec.quant.shared_scheme or spec.quant.scheme
    shared = (
        model.n_shared_experts * 3 * hidden * intermediate * bytes_per_weight(spec, shared_scheme)
    )
    router = model.n_routed_experts * hidden * 4
    element = _DTYPE_BYTES[spec.target.dtype]
    rows = tokens * model.num_experts_per_tok
    activations = 2 * tokens * hidden * element + rows * (hidden + 3 * intermediate) * element
    return LayerBytes(routed + shared + router, activations)


def run_bytes(spec: Spec, tokens: int, compared: bool) -> float:
    """What `moec run` needs beside the least forward of layer_bytes, at its peak: the input on
    the host, the output kept while the torch backend's forward runs (`compared`), a forward's
    scratch that layer_bytes leaves out (combine's fp32 sums, the router's fp32 logits, the
    routing's int64 sort of the assignments, the tokens' rows copied into the grouped layout by
    the torch backend), and the fp64 copies of the output the checksum (two) and the comparison
    (three) take."""
    model = spec.model
    values = tokens * model.hidden_size
    element = _DTYPE_BYTES[spec.target.dtype]
    held = values * element * (2 if compared else 1)
    scratch = 4 * values + 4 * tokens * model.n_routed_experts
    rows = tokens * model.num_experts_per_tok
    scratch += rows * (4 * 8 + model.hidden_size * element)
    return held + scratch + 8 * values * (3 if compared else 2)


WEIGHT_COPIES = 2
"""Copies of one rank's weights alive at once while random_ (or load_weights) makes them
(moec/runtime/expert_weights.py): the parameters, and every expert converted to its format (a
list kept until the end, written into the parameters one expert's rows at a time)."""
SCRATCH_PER_VALUE = 40
"""Bytes per value of the widest projection that making the weights takes beside the copies:
the expert being made (its fp32 draw and the draw scaled by 1/sqrt(fan_in), the quantizer's fp32
temporaries, its projections held until they are concatenated: 12 to 16 bytes) and the freed
blocks the allocator keeps; measured 17 to 18 (fp8_block) and 34 to 35 (bf16)."""


def making_bytes(spec: Spec, weights: float) -> float:
    """The peak of making one rank's `weights` bytes of parameters with random_: WEIGHT_COPIES
    copies of them and the scratch of the widest projection (the shared MLP is drawn whole).
    load_weights peaks as high before the checkpoint's tensors, which it holds on top.

    Measured on a CPU (scripts/weights_peak.py: the peak RSS of random_ above the RSS before
    it), 16 experts + 1 shared, top-2: at H=7168, I=2048 2.34x the parameters for fp8_block
    (this estimate 2.79x) and bf16 (2.39x); at H=4096, I=2048 2.35x for fp8_block (2.79x) and
    2.34x for bf16 (2.39x). At DeepSeek-V3's 256 experts the scratch is under 5% of the
    weights. At small dims (under ~200 MB) glibc keeps more freed blocks: up to 5x, a few
    hundred MB.
    """
    model = spec.model
    widest = max(1, model.n_shared_experts) * model.moe_intermediate_size * model.hidden_size
    return WEIGHT_COPIES * weights + SCRATCH_PER_VALUE * widest


def device_memory(spec: Spec) -> tuple[str, float]:
    """(what it is, memory in bytes) of the device one rank of `spec` runs on."""
    if spec.target.device == "cpu":
        return (
            f"the {show_bytes(HOST_MEMORY_GIB * GIB)} a CPU target may take",
            HOST_MEMORY_GIB * GIB,
        )
    arch = spec.target.arch or "sm90"
    device = BY_ARCH[arch]
    available = device.memory_gib * GIB
    return f"the {device.name}'s {show_bytes(available)} ({arch})", available


def show_bytes(value: float) -> str:
    """1536 -> "1.5 KiB": binary units up to EiB, then powers of ten of EiB."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if value < 1024:
            return f"{value:.1f} {unit}" if unit != "B" else f"{value:.0f} B"
        value /= 1024
    return f"{value:.3g} EiB"
