"""What each GEMM backend reads: the scale layouts it accepts on its activation input.

The convert pass compares these with what producers write and inserts converters; nothing
here converts anything.
"""

from __future__ import annotations

from dataclasses import replace

from moec.plan.types import DType, ScaleType


def accepted_scale(backend: str, arch: str | None, produced: ScaleType | None) -> ScaleType | None:
    """Scale type `backend` needs on its activation input, given what the producer writes.

    torch reads scales in any layout. Triton reads [rows, K/group] fp32 rows with one row
    stride: K-major (MN-major scales, e.g. DeepEP's low-latency dispatch's, are made K-major
    first). DeepGEMM reads MN-major, TMA-aligned scales: fp32 on sm90, UE8M0 packed four per
    int32 on sm100.
    """
    if produced is None or produced.granularity == "per-tensor" or backend == "torch":
        return produced
    if backend == "triton":
        return replace(produced, major="K", tma_aligned=False)
    if arch in ("sm100", "sm120"):
        return replace(
            produced, dtype=DType.ue8m0x4, major="MN", tma_aligned=True, power_of_two=True
        )
    return replace(produced, major="MN", tma_aligned=True)
