"""The support matrix: every combination of the main choices, checked as `moec build` checks a
spec (the rules, then the plan and its renderer registry) on a machine where every optional
package is installed; so the table shows what builds, and is never kept by hand.
"""

from __future__ import annotations

import itertools
from typing import Any

from moec.errors import MoecError
from moec.plan.environment import Environment
from moec.spec import rules
from moec.spec.models import Spec
from moec.spec.normalize import normalize
from moec.spec.presets import PRESETS

TARGETS = ("cpu", "sm80", "sm89", "sm90", "sm100")
SCHEMES = ("bf16", "fp8_per_tensor", "fp8_block", "mxfp8", "mxfp4")
BACKENDS = ("torch", "triton", "deep_gemm")
ACTIVATIONS = {
    "silu": {"kind": "silu"},
    "silu_clamped": {"kind": "silu_clamped", "swiglu_limit": 10.0},
    "oai_swiglu": {"kind": "oai_swiglu"},
    "situ": {"kind": "situ", "beta": 1.0, "linear_beta": 1.0},
}
DISPATCHES = ("local", "all2all", "deepep_normal", "deepep_low_latency")
LAYOUTS = ("contiguous", "masked", "auto")


def _base(target: str) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "matrix",
        "model": dict(PRESETS["deepseek-v3"]["model"]),
        "router": {
            "scoring_func": "sigmoid",
            "topk_method": "noaux_tc",
            "n_group": 8,
            "topk_group": 4,
        },
        "target": {"device": "cpu", "max_num_tokens": 128}
        if target == "cpu"
        else {"device": "cuda", "arch": target, "max_num_tokens": 128},
    }
    return data


EVERYTHING = Environment(frozenset({"triton", "deep_gemm", "deep_ep"}))
"""A machine with every optional package: the matrix says what moec can build, anywhere."""


def rejecting_rules(data: dict[str, Any]) -> list[str]:
    """Names of the rules that reject spec `data` ([] if it builds): a spec rule, or "renderer"
    where the plan needs a stage no renderer takes."""
    from moec.plan import make_plan

    spec = normalize(Spec.model_validate(data))
    found = sorted({problem.rule for problem in rules.check(spec)})
    if found:
        return found
    try:
        make_plan(spec, EVERYTHING)
    except MoecError as error:
        return sorted({problem.rule for problem in error.problems})
    return []


def support_matrix() -> dict[str, list[dict[str, Any]]]:
    kernels = []
    for backend, scheme, activation in itertools.product(BACKENDS, SCHEMES, ACTIVATIONS):
        row: dict[str, Any] = {
            "gemm_backend": backend,
            "scheme": scheme,
            "activation": activation,
            "targets": {},
        }
        for target in TARGETS:
            data = _base(target)
            data["quant"] = {"scheme": scheme}
            if scheme == "mxfp4":
                data["quant"]["checkpoint"] = "quantized"
            data["activation"] = ACTIVATIONS[activation]
            data["experts"] = {"gemm_backend": backend}
            row["targets"][target] = rejecting_rules(data)
        kernels.append(row)
    dispatch = []
    for kind, layout in itertools.product(DISPATCHES, LAYOUTS):
        row = {"dispatch": kind, "layout": layout, "targets": {}}
        for target in TARGETS:
            data = _base(target)
            data["quant"] = {"scheme": "fp8_block"}
            data["experts"] = {"layout": layout}
            data["parallel"] = {"dispatch": kind, "ep_size": 1 if kind == "local" else 8}
            if kind == "deepep_low_latency":
                data["parallel"]["max_tokens_per_rank"] = 128
            row["targets"][target] = rejecting_rules(data)
        dispatch.append(row)
    return {"kernels": kernels, "dispatch": dispatch}
