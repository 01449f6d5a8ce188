"""Fill the defaults that depend on other keys, so the normalized spec says everything.

A key the user left out (None) gets its scheme- or target-dependent default here; a key the
user wrote is kept as written, right or wrong, for the rules to judge.
"""

from __future__ import annotations

from moec.spec.models import Spec

BLOCK_DEFAULTS = {"fp8_block": [128, 128], "mxfp8": [1, 32], "mxfp4": [1, 32]}
"""Weight block per block-scaled scheme."""

MX_SCHEMES = ("mxfp8", "mxfp4")


def scheme_defaults(scheme: str) -> tuple[list[int] | None, str | None]:
    """The weight block and scale dtype a scheme has where no key says otherwise: the routed
    scheme's (quant.weight_block, quant.scale_dtype) when left out, and always the shared
    scheme's, which has no keys of its own. bf16 has neither; fp8_per_tensor one fp32 scale."""
    if scheme == "bf16":
        return None, None
    return BLOCK_DEFAULTS.get(scheme), "ue8m0" if scheme in MX_SCHEMES else "fp32"


def normalize(spec: Spec) -> Spec:
    """Return `spec` with every dependent default made explicit."""
    quant = spec.quant
    quant_update: dict[str, object] = {}
    block, scale_dtype = scheme_defaults(quant.scheme)
    if quant.weight_block is None and block is not None:
        quant_update["weight_block"] = list(block)
    if quant.scale_dtype is None and scale_dtype is not None:
        quant_update["scale_dtype"] = "ue8m0" if _deep_gemm_blackwell(spec) else scale_dtype
    if quant.shared_scheme is None and spec.model.n_shared_experts:  # none: nothing to quantize
        quant_update["shared_scheme"] = "fp8_block" if quant.scheme == "mxfp4" else quant.scheme
    if quant.scheme == "bf16" and quant.checkpoint != "bf16":
        quant_update["checkpoint"] = "bf16"

    target = spec.target
    target_update: dict[str, object] = {}
    if target.device == "cuda" and target.arch is None:
        target_update["arch"] = "sm90"

    update: dict[str, object] = {}
    if quant_update:
        update["quant"] = quant.model_copy(update=quant_update)
    if target_update:
        update["target"] = target.model_copy(update=target_update)
    return spec.model_copy(update=update) if update else spec


def _deep_gemm_blackwell(spec: Spec) -> bool:
    """fp8_block on DeepGEMM for sm100 and newer (its Blackwell recipe) has UE8M0 scales, where
    fp32 scales are rejected."""
    return (
        spec.quant.scheme == "fp8_block"
        and spec.experts.gemm_backend == "deep_gemm"
        and spec.target.device == "cuda"
        and spec.target.arch in ("sm100", "sm120")
    )
