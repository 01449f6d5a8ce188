"""Renderers of DeepGEMM (the expert GEMMs on sm90 / sm100) and of the scale-layout converters
between the layouts producers write and GEMMs read (DeepGEMM's MN-major where no quantizer
writes it directly; K-major for Triton after DeepEP's low-latency dispatch)."""

from __future__ import annotations

from moec.codegen.registry import register
from moec.codegen.renderers.common import StageCode, shape_doc
from moec.plan.stages import Convert, Gemm
from moec.vocab import Backend, ConvertStep


@register(
    Gemm,
    Backend.deep_gemm,
    "stages/deep_gemm/gemm.py.j2",
    runtime=("deep_gemm_grouped",),
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


@register(
    Convert,
    Backend.torch,
    "stages/torch/convert.py.j2",
    runtime=("scale_layout",),
)
def convert(plan, stage: Convert) -> StageCode:
    function = "to_k_major" if ConvertStep.to_k_major in stage.steps else "to_mn_major"
    return StageCode(f"The same values; scales: {'; '.join(stage.steps)}.", {"function": function})
