"""`moec init --from-hf`: a spec from a HF `config.json` (DeepSeek-V2, V2-Lite, V3/R1, Kimi-K2).

The spec is written as TOML with the HF keys it came from, then checked like any other spec,
so an imported config that moec cannot run is reported the same way.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from moec.errors import MoecError, problem
from moec.resources import shipped_schema_path
from moec.spec.loader import apply_overrides, check_raw

_KNOWN_TYPES = ("deepseek_v2", "deepseek_v3", "kimi_k2")
_TABLE_ORDER = ("model", "router", "quant", "activation", "experts", "parallel", "target")


def spec_from_hf(
    config_path: str | Path,
    name: str | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    schema_relative_to: str | Path | None = None,
) -> str:
    """TOML text of a spec for the MoE layer described by the HF config at `config_path`."""
    config_path = Path(config_path)
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except OSError as error:
        raise MoecError(
            [problem("--from-hf", f"cannot read: {error.strerror}", "a config.json path")],
            str(config_path),
            kind="usage",
        ) from None
    except UnicodeDecodeError as error:
        raise MoecError(
            [problem("--from-hf", f"not UTF-8 text: {error.reason}", "a config.json")],
            str(config_path),
            kind="usage",
        ) from None
    except json.JSONDecodeError as error:
        raise MoecError(
            [
                problem(
                    "--from-hf", f"not JSON: {error.msg} at line {error.lineno}", "a config.json"
                )
            ],
            str(config_path),
            kind="usage",
        ) from None
    try:
        raw = spec_data_from_config(config, name)
    except MoecError as error:
        raise MoecError(error.problems, str(config_path), kind=error.kind) from None
    raw, set_paths = apply_overrides(raw, overrides, str(config_path))
    # raises with every problem if moec cannot run it
    check_raw(raw, str(config_path), set_paths=set_paths, overrides=tuple(overrides))
    schema = os.path.relpath(
        shipped_schema_path(),
        Path(schema_relative_to).resolve().parent if schema_relative_to else Path.cwd(),
    )
    return _to_toml(raw, config_path.name, config.get("model_type", "?"), schema)


def spec_data_from_config(config: dict[str, Any], name: str | None = None) -> dict[str, Any]:
    """Spec data (as parsed from TOML) for a HF DeepSeek-family config dict."""
    if not isinstance(config, dict):
        raise MoecError(
            [problem("--from-hf", "is not a JSON object", "a HF config.json")], kind="usage"
        )
    model_type = config.get("model_type")
    if model_type not in _KNOWN_TYPES:
        raise MoecError(
            [
                problem(
                    "model_type",
                    "is not a DeepSeek-family MoE config",
                    f"one of {', '.join(_KNOWN_TYPES)}",
                    value=model_type,
                )
            ],
            kind="usage",
        )
    is_v2 = model_type == "deepseek_v2"
    missing = [
        key
        for key in (
            "hidden_size",
            "moe_intermediate_size",
            "n_routed_experts",
            "num_experts_per_tok",
        )
        if config.get(key) is None
    ]
    if missing:
        raise MoecError(
            [problem(key, "is missing from config.json", "a MoE config") for key in missing],
            kind="usage",
        )
    raw: dict[str, Any] = {"name": name or _name_from(config)}
    raw["model"] = {
        "hidden_size": config["hidden_size"],
        "moe_intermediate_size": config["moe_intermediate_size"],
        "n_routed_experts": config["n_routed_experts"],
        "num_experts_per_tok": config["num_experts_per_tok"],
        "n_shared_experts": config.get("n_shared_experts") or 0,
    }
    default_scoring = "softmax" if is_v2 else "sigmoid"
    default_method = "greedy" if is_v2 else "noaux_tc"
    raw["router"] = {
        "scoring_func": config.get("scoring_func") or default_scoring,
        "topk_method": config.get("topk_method") or default_method,
        "n_group": config.get("n_group") or 1,
        "topk_group": config.get("topk_group") or 1,
        "norm_topk_prob": bool(config.get("norm_topk_prob", not is_v2)),
        "routed_scaling_factor": float(config.get("routed_scaling_factor") or 1.0),
    }
    raw["quant"] = _quant_from(config.get("quantization_config"))
    if config.get("swiglu_limit"):
        raw["activation"] = {"kind": "silu_clamped", "swiglu_limit": float(config["swiglu_limit"])}
    elif config.get("hidden_act", "silu") != "silu":
        raise MoecError(
            [
                problem(
                    "hidden_act",
                    "is not a gated activation moec knows",
                    '"silu"',
                    value=config["hidden_act"],
                )
            ],
            kind="usage",
        )
    dtype = config.get("torch_dtype") or config.get("dtype") or "bfloat16"
    raw["target"] = {
        "device": "cuda",
        "dtype": dtype if dtype in ("bfloat16", "float16", "float32") else "bfloat16",
    }
    return raw


def _quant_from(quantization: dict[str, Any] | None) -> dict[str, Any]:
    if not quantization:
        return {"scheme": "bf16"}
    if not isinstance(quantization, dict):
        raise MoecError(
            [
                problem(
                    "quantization_config",
                    "is not a JSON object",
                    '{"quant_method": "fp8", ...}',
                    value=quantization,
                )
            ],
            kind="usage",
        )
    method = str(quantization.get("quant_method", ""))
    block = quantization.get("weight_block_size")
    if "mxfp8" in method:
        return {"scheme": "mxfp8", "checkpoint": "quantized"}
    if method == "fp8":
        if block:
            return {"scheme": "fp8_block", "weight_block": list(block), "checkpoint": "quantized"}
        return {
            "scheme": "fp8_per_tensor",
            "activation_scheme": quantization.get("activation_scheme", "dynamic"),
            "checkpoint": "quantized",
        }
    raise MoecError(
        [
            problem(
                "quantization_config.quant_method",
                "is not a scheme moec runs",
                '"fp8" or "mxfp8"',
                value=method,
            )
        ],
        kind="usage",
    )


def _name_from(config: dict[str, Any]) -> str:
    source = str(config.get("_name_or_path") or config.get("model_type") or "moe")
    name = re.sub(r"[^A-Za-z0-9_]", "_", source.rstrip("/").split("/")[-1]).strip("_").lower()
    if not name or name[0].isdigit():
        name = f"moe_{name}"
    return name


def _to_toml(raw: dict[str, Any], config_name: str, model_type: str, schema: str) -> str:
    out = [
        f"#:schema {schema}",
        f"# Written by `moec init --from-hf` from {json.dumps(config_name)} (model_type {model_type}).",
        f"name = {_value(raw['name'])}",
    ]
    out.extend(  # top-level keys other than name and the tables: from --set (description)
        f"{key} = {_value(value)}"
        for key, value in raw.items()
        if key != "name" and not isinstance(value, dict)
    )
    for table in _TABLE_ORDER:
        if table in raw:
            out.append("")
            out.append(f"[{table}]")
            out.extend(f"{key} = {_value(value)}" for key, value in raw[table].items())
    return "\n".join(out) + "\n"


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    # JSON string escapes are TOML's, except that TOML has no surrogate pairs: keep non-ASCII
    # as it is, and escape the one control character JSON leaves raw.
    return json.dumps(str(value), ensure_ascii=False).replace("\x7f", "\\u007f")
