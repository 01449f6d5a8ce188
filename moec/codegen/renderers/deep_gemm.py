"""Renderers of DeepGEMM (the expert GEMMs on sm90 / sm100) and of the scale-layout converters
between the layouts producers write and GEMMs read (DeepGEMM's MN-major where no quantizer
writes it directly; K-major for Triton after DeepEP's low-latency dispatch)."""

from __future__ import annotations

from moec.codegen.registry import register
from moec.codegen.renderers.common import StageCode, shape_doc
from moec.plan.fuse import LAYOUT_STEPS
from moec.plan.stages import Convert, Gemm
from moec.vocab import Arch, Scheme

DEEP_GEMM = ("deep_gemm",)


def _fp8_block_or_bf16(plan, stage: Gemm) -> str | None:
    scheme = stage.format.scheme
    if scheme not in (Scheme.fp8_block, Scheme.bf16):
        return f"moec drives DeepGEMM's fp8_block and bf16 grouped GEMMs, not {scheme}"
    if scheme == Scheme.fp8_block and plan.layer.arch != Arch.sm90:
        return "moec drives DeepGEMM's fp8 grouped GEMMs on sm90 (its Hopper kernels) only"
    return None


@register(
    "gemm",
    "deep_gemm",
    "stages/deep_gemm/gemm.py.j2",
    runtime=("deep_gemm_grouped",),
    requires=DEEP_GEMM,
    refuses=_fp8_block_or_bf16,
)
def gemm(plan, stage: Gemm) -> StageCode:
    quantized = stage.format.quantized
    scaled = f"{stage.weight}_scale" in stage.weights
    kind = "fp8" if quantized else "bf16"
    function = f"deep_gemm_grouped.{kind}_{stage.layout}"
    psum = stage.psum_from is not None
    fields = {
        "function": f"{function}_psum" if psum else function,
        "few_tokens": function if stage.psum_branch else "",
        "psum_from": stage.psum_from,
        "a_scale": "a_scale" if quantized else "None",
        "weight": stage.weight,
        "weight_scale": f"{stage.weight}_scale" if scaled else "None",
    }
    rows = shape_doc(stage)
    told = ""
    if psum:
        told = " (the layout told by each expert's end row"
        told += f" from {stage.psum_from} tokens)" if fields["few_tokens"] else ")"
    return StageCode(
        f"[{rows}, {stage.k}] x [E, {stage.n}, {stage.k}] -> [{rows}, {stage.n}] through "
        f"DeepGEMM's m-grouped {kind} NT {stage.layout} GEMM{told}.",
        fields,
    )


TO_K_MAJOR = "transpose scales to K-major"


def _transpose_and_pad_only(plan, stage: Convert) -> str | None:
    other = [step for step in stage.steps if step not in (*LAYOUT_STEPS, TO_K_MAJOR)]
    if other:
        return f"moec's scale converter transposes and pads (sm90), it does not {other[0]}"
    return None


@register(
    "convert",
    "torch",
    "stages/torch/convert.py.j2",
    runtime=("scale_layout",),
    refuses=_transpose_and_pad_only,
)
def convert(plan, stage: Convert) -> StageCode:
    function = "to_k_major" if TO_K_MAJOR in stage.steps else "to_mn_major"
    return StageCode(f"The same values; scales: {'; '.join(stage.steps)}.", {"function": function})
