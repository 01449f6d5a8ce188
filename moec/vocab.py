"""One vocabulary: every closed set of names the spec, the plan and codegen share, defined once.

Each set is a `StrEnum` (a member equals its string: `GemmLayout.masked == "masked"`, and is
written as that string by f-strings, `str`, JSON and the `lit` filter), used by the plan's
records and the renderers. Beside it, where the spec takes the set as a TOML value, the
`Literal` its pydantic field is typed with (the JSON Schema lists those strings); the spec's
extra choices (`auto`) are its own. tests/test_vocab.py checks each `Literal` against its enum.

This module imports nothing of moec: the spec, the plan and codegen all import it.
"""

from __future__ import annotations

import sys
from typing import Literal

if sys.version_info >= (3, 11):
    from enum import StrEnum
else:  # pragma: no cover  (Python 3.10: the same behaviour, spelled out)
    from enum import Enum

    class StrEnum(str, Enum):
        """A str whose `str()` and format are its value, as 3.11's enum.StrEnum."""

        def __str__(self) -> str:
            return str.__str__(self)

        def __format__(self, spec: str) -> str:
            return str.__format__(self, spec)


class Scheme(StrEnum):
    """Number format of the expert weights and the activations entering their GEMMs."""

    bf16 = "bf16"
    fp8_per_tensor = "fp8_per_tensor"
    fp8_block = "fp8_block"
    mxfp8 = "mxfp8"
    mxfp4 = "mxfp4"


SchemeName = Literal["bf16", "fp8_per_tensor", "fp8_block", "mxfp8", "mxfp4"]
"""quant.scheme, quant.shared_scheme."""


class ScaleDtype(StrEnum):
    """How quantization scales are stored: fp32, or UE8M0 (powers of two). The plan carries the
    choice as one flag under one name, `pow2_scales`, from the plan (QuantFormat, ScaleType,
    plan.json's scale types) to the runtime's arguments (quant, torch_matmul, deepep, the Triton
    launchers; the kernels' constexpr POW2_SCALES). UE8M0 names the stored byte format only."""

    fp32 = "fp32"
    ue8m0 = "ue8m0"


ScaleDtypeName = Literal["fp32", "ue8m0"]
"""quant.scale_dtype."""


class ScaleMajor(StrEnum):
    """Which way a quantized tensor's scales are contiguous."""

    K = "K"
    """The scales of one row (as quantizers write them)."""
    MN = "MN"
    """The scales of one K group, over the rows (as DeepGEMM and DeepEP read and write them)."""


class ActivationScheme(StrEnum):
    dynamic = "dynamic"
    static = "static"


ActivationSchemeName = Literal["dynamic", "static"]
"""quant.activation_scheme."""


class CheckpointFormat(StrEnum):
    """What the checkpoint that load_weights reads holds: bf16, or the scheme's own values."""

    bf16 = "bf16"
    quantized = "quantized"


CheckpointFormatName = Literal["bf16", "quantized"]
"""quant.checkpoint."""


class GemmLayout(StrEnum):
    """How the grouped GEMMs see the routed tokens (seed 000's two layouts)."""

    contiguous = "contiguous"
    """Rows grouped by expert, each expert's padded to a tile multiple."""
    masked = "masked"
    """[E, max_m, cols] with each expert's count of valid rows."""


LayoutChoice = Literal["auto", "contiguous", "masked"]
"""experts.layout: a GemmLayout, or auto."""


class Backend(StrEnum):
    """Who runs a stage."""

    torch = "torch"
    triton = "triton"
    deep_gemm = "deep_gemm"
    torch_distributed = "torch.distributed"
    deep_ep = "deep_ep"
    none = "-"
    """The graph's input and output, which run nothing."""


class StageKind(StrEnum):
    """What a stage of the plan does: one record class per kind (moec/plan/stages.py), and one
    renderer per (kind, backend) (moec/codegen/renderers)."""

    input = "input"
    output = "output"
    router = "router"
    select = "select"
    place = "place"
    quantize = "quantize"
    dispatch = "dispatch"
    gemm = "gemm"
    activation = "activation"
    combine = "combine"
    shared_expert = "shared_expert"
    finalize = "finalize"
    convert = "convert"


class ConvertStep(StrEnum):
    """One step of a scale-layout converter stage (moec/plan/convert.py), as `moec explain`
    shows it."""

    round_pow2 = "round scales up to powers of two"
    to_mn_major = "transpose scales to MN-major"
    to_k_major = "transpose scales to K-major"
    pad_tma = "pad scale columns to 16-byte TMA alignment"
    pack_ue8m0 = "pack UE8M0 exponents four per int32"


ENDPOINTS = (StageKind.input, StageKind.output)
"""The graph's two ends: they run nothing and have no renderer."""


GEMM_BACKENDS = (Backend.torch, Backend.triton, Backend.deep_gemm)
"""Backends of the expert GEMMs (experts.gemm_backend)."""
DISPATCH_BACKENDS = (Backend.torch, Backend.torch_distributed, Backend.deep_ep)
"""Backends of the exchange between ranks (Backends.dispatch)."""

GemmBackendChoice = Literal["auto", "torch", "triton", "deep_gemm"]
"""experts.gemm_backend: one of GEMM_BACKENDS, or auto."""


class DispatchMode(StrEnum):
    """How tokens reach their experts' ranks."""

    local = "local"
    all2all = "all2all"
    deepep_normal = "deepep_normal"
    deepep_low_latency = "deepep_low_latency"


DispatchModeName = Literal["local", "all2all", "deepep_normal", "deepep_low_latency"]
"""parallel.dispatch."""


class GemmRole(StrEnum):
    """Which of a routed expert's two grouped GEMMs."""

    gate_up = "gate_up"
    down = "down"


class TorchKernel(StrEnum):
    """How the torch backend runs a grouped GEMM."""

    loop = "loop"
    grouped_mm = "grouped_mm"
    bmm = "bmm"


class RouterPrecision(StrEnum):
    """How the router's fp32 GEMM runs."""

    fp32 = "fp32"
    """One fp32 GEMM."""
    bf16x3 = "bf16x3"
    """The fp32 weight as three bf16 parts on bf16 tensor cores, fp32 sums."""


class ScoringFunc(StrEnum):
    softmax = "softmax"
    sigmoid = "sigmoid"
    sqrtsoftplus = "sqrtsoftplus"


ScoringFuncName = Literal["softmax", "sigmoid", "sqrtsoftplus"]
"""router.scoring_func."""


class RouterRounding(StrEnum):
    """What the router rounds to the model dtype (target.dtype), as a router computing in that
    dtype does; every other value stays fp32."""

    none = "none"
    """Logits, scores and weights in fp32 (DeepSeek-V3's reference router)."""
    logits = "logits"
    """The logits, then scores and weights in fp32 from them (a gate GEMM whose output is in
    the model dtype: Mixtral's, Qwen3-MoE's routers in transformers)."""
    all = "all"
    """The logits, each step of the scoring, and the weights' sum, division and scaling; the
    bias-corrected choice in fp32 (transformers' DeepSeek-V4 and Mistral-4 routers)."""


RouterRoundingName = Literal["none", "logits", "all"]
"""router.rounding."""


class TopkMethod(StrEnum):
    greedy = "greedy"
    group_limited_greedy = "group_limited_greedy"
    noaux_tc = "noaux_tc"
    hash = "hash"


TopkMethodName = Literal["greedy", "group_limited_greedy", "noaux_tc", "hash"]
"""router.topk_method."""


class SharedExperts(StrEnum):
    """How the shared experts run beside the routed ones."""

    separate = "separate"
    fused = "fused"
    overlapped = "overlapped"


SharedExpertsChoice = Literal["auto", "separate", "fused", "overlapped"]
"""experts.shared_experts: a SharedExperts, or auto."""


class ReplicaChoice(StrEnum):
    """Which replica of an expert a token goes to."""

    static = "static"
    random = "random"


ReplicaChoiceName = Literal["static", "random"]
"""parallel.replica_choice."""


class DeviceKind(StrEnum):
    cpu = "cpu"
    cuda = "cuda"


DeviceKindName = Literal["cpu", "cuda"]
"""target.device."""


class Arch(StrEnum):
    """CUDA architectures moec targets."""

    sm80 = "sm80"
    sm89 = "sm89"
    sm90 = "sm90"
    sm100 = "sm100"
    sm120 = "sm120"


ArchName = Literal["sm80", "sm89", "sm90", "sm100", "sm120"]
"""target.arch."""


class ActivationKind(StrEnum):
    """Gated activations (moec/plan/activations.py defines each)."""

    silu = "silu"
    silu_clamped = "silu_clamped"
    oai_swiglu = "oai_swiglu"
    situ = "situ"
