"""What each GEMM backend reads: the scale layouts it accepts on its activation input; and the
facts of DeepGEMM as moec drives it: which weights and GPUs, which of its functions, of which
version.

The convert pass compares these with what producers write and inserts converters; nothing
here converts anything.
"""

from __future__ import annotations

from dataclasses import replace

from moec.plan.types import DType, ScaleType
from moec.vocab import Arch, Backend, GemmLayout, ScaleMajor, Scheme


def accepted_scale(
    backend: Backend, arch: Arch | None, produced: ScaleType | None
) -> ScaleType | None:
    """Scale type `backend` needs on its activation input, given what the producer writes.

    torch reads scales in any layout. Triton reads [rows, K/group] fp32 rows with one row
    stride: K-major (MN-major scales, e.g. DeepEP's low-latency dispatch's, are made K-major
    first). DeepGEMM reads MN-major, TMA-aligned scales: fp32 on sm90, UE8M0 packed four per
    int32 on sm100.
    """
    if produced is None or produced.granularity == "per-tensor" or backend == Backend.torch:
        return produced
    if backend == Backend.triton:
        return replace(produced, major=ScaleMajor.K, tma_aligned=False)
    if arch in (Arch.sm100, Arch.sm120):
        return replace(
            produced, dtype=DType.ue8m0x4, major=ScaleMajor.MN, tma_aligned=True, pow2_scales=True
        )
    return replace(produced, major=ScaleMajor.MN, tma_aligned=True)


DEEP_GEMM_API = "2.6.1"
"""The DeepGEMM release whose signatures and alignment (M rows per expert padded to 128 on sm90,
`get_mk_alignment_for_contiguous_layout()`) moec/runtime/deep_gemm_grouped.py follows."""


def deep_gemm_function(quantized: bool, layout: GemmLayout) -> str:
    """The DeepGEMM function a deep_gemm GEMM stage calls (deep_gemm_grouped.<kind>_<layout>)."""
    return f"m_grouped_{'fp8' if quantized else 'bf16'}_gemm_nt_{layout}"


def deep_gemm_gemm(scheme: str, arch: str | None) -> str | None:
    """Why moec does not drive DeepGEMM's grouped GEMMs for weights of `scheme` on `arch`, or
    None: its Hopper (sm90) fp8_block and bf16 kernels, and bf16 on sm100, each in both layouts
    (deep_gemm_function: m_grouped_{fp8,bf16}_gemm_nt_{contiguous,masked}). The sm100 fp8 path
    (UE8M0 scales packed four per int32) is planned, not rendered (docs/backends.md). The plan's
    support table (moec/plan/support.py) and auto's choice (resolve) ask this."""
    if scheme not in (Scheme.fp8_block, Scheme.bf16):
        return f"moec drives DeepGEMM's fp8_block and bf16 grouped GEMMs, not {scheme}"
    if arch not in (Arch.sm90, Arch.sm100):
        return f"moec drives DeepGEMM's grouped GEMMs on sm90 and sm100, not {arch}"
    if scheme == Scheme.fp8_block and arch != Arch.sm90:
        return "moec drives DeepGEMM's fp8 grouped GEMMs on sm90 (its Hopper kernels) only"
    return None
