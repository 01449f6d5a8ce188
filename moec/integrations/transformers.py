"""moec's layer inside a transformers DeepSeek model, in place of its MoE blocks.

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
    patch_model(model, "spec.toml")   # a spec path, a LoadedSpec, or None: a spec from model.config
    model.generate(...)

`patch_model` replaces every `DeepseekV3MoE` / `DeepseekV2Moe` block with a `MoecMoE`. The spec
is built once; each block's weights (transformers' own state-dict names) go into that block's
own `MoELayer`, quantized on load when the spec asks for fp8, and the transformers block is
dropped at once: the model never holds two copies of more than one layer's experts.

Supported: transformers >= 5.13, < 6 (tested with 5.13.0, 5.17.0 and 5.24.0; before 5.13
transformers' own DeepseekV2 routing fails), one rank, inference (the layer runs under
`torch.no_grad`; router logits are not recorded).
"""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path
from typing import get_args

import torch
from torch import nn

import moec
from moec.errors import MoecError, Problem, problem
from moec.spec import LoadedSpec, check_raw, load_spec
from moec.spec.hf import spec_data_from_config
from moec.spec.loader import apply_overrides
from moec.spec.models import Arch

SUPPORTED = ((5, 13), (6, 0))
"""transformers versions [from, to): fused experts (`experts.gate_up_proj`) and a router module
that returns (logits, weights, ids); the range tested."""
INSTALL_HINT = 'pip install "transformers>=5.13,<6"'
MOE_BLOCKS = (
    ("deepseek_v3.modeling_deepseek_v3", "DeepseekV3MoE"),
    ("deepseek_v2.modeling_deepseek_v2", "DeepseekV2Moe"),
)
"""(module under transformers.models, class) of every block patch_model replaces."""
WEIGHT_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


class MoecMoE(nn.Module):
    """A transformers DeepSeek MoE block's drop-in: hidden states [B, S, H] -> [B, S, H]
    through a moec `MoELayer` (which takes tokens [T, H])."""

    def __init__(self, layer: nn.Module, replaces: str) -> None:
        super().__init__()
        self.layer = layer
        self.replaces = replaces
        """Class name of the transformers block this module took the place of."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        shape = hidden_states.shape  # [B, S, H]
        out = self.layer(hidden_states.reshape(-1, shape[-1]))  # [T, H], T = B * S
        return out.view(shape)

    def extra_repr(self) -> str:
        return f"replaces {self.replaces}"


def patch_model(
    model: nn.Module,
    spec: str | Path | LoadedSpec | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    cache_dir: str | Path | None = None,
) -> nn.Module:
    """Replace every DeepSeek MoE block of the transformers `model` with moec's layer; return
    the model (patched in place).

    `spec`: a spec file (with `overrides`, `--set`-style "KEY=VALUE"), a `LoadedSpec`, or None
    for the spec `moec init --from-hf` writes from `model.config`, on the model's device and
    dtype, quantizing float weights on load (`overrides` apply on top, e.g.
    "quant.scheme=fp8_block"). Raises MoecError when this transformers version is not supported,
    the model has no such block, or the spec does not describe the model's MoE layers."""
    blocks = moe_block_classes()
    names = [name for name, module in model.named_modules() if isinstance(module, blocks)]
    if not names:
        raise MoecError(
            [
                problem(
                    "model",
                    f"has no DeepSeek MoE block to replace (a {type(model).__name__})",
                    "a transformers DeepseekV3 / DeepseekV2 model",
                )
            ],
            kind="usage",
        )
    dtype, device = _expert_weights_format(model.get_submodule(names[0]), names[0])
    loaded = _resolve_spec(spec, overrides, model.config, dtype, device)
    check_spec_fits(loaded, model.config, dtype, device)
    package = moec.load(loaded, cache_dir=cache_dir)
    for name in names:
        _replace_block(model, name, package)
    return model


def moe_block_classes() -> tuple[type, ...]:
    """The transformers classes patch_model replaces; MoecError unless a supported transformers
    is installed."""
    try:
        import transformers
    except ImportError:
        raise MoecError(
            [problem("transformers", "is not installed", INSTALL_HINT)], kind="backend"
        ) from None
    check_version(transformers.__version__)
    return tuple(
        getattr(importlib.import_module(f"transformers.models.{module}"), name)
        for module, name in MOE_BLOCKS
    )


def check_version(version: str) -> None:
    """MoecError unless `version` is a transformers release patch_model supports."""
    numbers = re.match(r"(\d+)\.(\d+)", version)
    release = (int(numbers.group(1)), int(numbers.group(2))) if numbers else None
    if release is None or not SUPPORTED[0] <= release < SUPPORTED[1]:
        raise MoecError(
            [
                problem(
                    "transformers",
                    "is not a version moec's drop-in supports (its MoE blocks change between "
                    "releases)",
                    INSTALL_HINT,
                    value=version,
                )
            ],
            kind="backend",
        )


def _expert_weights_format(block: nn.Module, name: str) -> tuple[torch.dtype, torch.device]:
    """dtype and device of a block's fused expert weights; MoecError unless plain floats."""
    weight = getattr(getattr(block, "experts", None), "gate_up_proj", None)
    if not isinstance(weight, torch.Tensor) or weight.dtype not in WEIGHT_DTYPES:
        held = weight.dtype if isinstance(weight, torch.Tensor) else type(weight).__name__
        raise MoecError(
            [
                problem(
                    f"{name}.experts.gate_up_proj",
                    f"is not a float tensor ({held}): moec reads transformers' unquantized experts",
                    "load the model in bfloat16 or float32; the spec's quant.scheme quantizes",
                )
            ],
            kind="usage",
        )
    return weight.dtype, weight.device


def _resolve_spec(spec, overrides, config, dtype: torch.dtype, device: torch.device) -> LoadedSpec:
    """The LoadedSpec patch_model builds: as given, read from a path, or from the config."""
    if isinstance(spec, LoadedSpec):
        if overrides:
            raise MoecError(
                [
                    problem(
                        "overrides",
                        "apply to a spec path or to the model's config, not to a LoadedSpec",
                        "load_spec(path, overrides), or pass the path",
                        value=list(overrides),
                    )
                ],
                kind="usage",
            )
        return spec
    if spec is not None:
        return load_spec(spec, overrides)
    return spec_for_model(config, dtype, device, overrides)


def spec_for_model(config, dtype: torch.dtype, device: torch.device, overrides=()) -> LoadedSpec:
    """The spec of `moec init --from-hf` for a loaded model's config, targeting the device and
    dtype its MoE weights are in, quantizing them on load; `overrides` on top."""
    source = f"<{config.model_type} config>"
    try:
        raw = spec_data_from_config(config.to_dict())
    except MoecError as error:
        raise MoecError(error.problems, source, kind=error.kind) from None
    raw["target"] = {"device": device.type, "dtype": WEIGHT_DTYPES[dtype], **_arch_of(device)}
    raw["quant"]["checkpoint"] = "bf16"  # the model holds float weights: quantize on load
    raw, set_paths = apply_overrides(raw, overrides, source)
    return check_raw(raw, source, set_paths=set_paths, overrides=tuple(overrides))


def _arch_of(device: torch.device) -> dict[str, str]:
    """{"arch": the newest architecture moec knows that this CUDA device has, e.g. "sm80" for
    an sm86 GPU}; {} for a CPU; MoecError for a GPU older than any moec targets."""
    if device.type != "cuda":
        return {}
    major, minor = torch.cuda.get_device_capability(device)
    known = [name for name in get_args(Arch) if int(name[2:]) <= major * 10 + minor]
    if not known:
        raise MoecError(
            [
                problem(
                    "target.arch",
                    f"the model's GPU is sm{major}{minor}, older than any moec targets",
                    f"a GPU of {', '.join(get_args(Arch))}",
                )
            ],
            kind="usage",
        )
    return {"arch": max(known, key=lambda name: int(name[2:]))}


def check_spec_fits(loaded: LoadedSpec, config, dtype: torch.dtype, device: torch.device) -> None:
    """MoecError naming every key of the spec that does not describe the model's MoE layers:
    dims, router and activation against the config; dtype and device against the weights."""
    expected = spec_data_from_config(config.to_dict())
    spec = loaded.normalized
    found = [
        _differs(f"{table}.{key}", spec[table][key], want)
        for table in ("model", "router")
        for key, want in expected[table].items()
        if spec[table][key] != want
    ]
    activation = expected.get("activation", {"kind": "silu"})
    if spec["activation"] != activation:
        found.append(_differs("activation.kind", spec["activation"]["kind"], activation["kind"]))
    found += _runtime_problems(spec, dtype, device)
    if found:
        raise MoecError(loaded.located(found), loaded.source)


def _differs(path: str, have, want) -> Problem:
    key = path.split(".")[-1]
    return problem(
        path, "does not match the model", f"its config has {key} = {json.dumps(want)}", value=have
    )


def _runtime_problems(spec: dict, dtype: torch.dtype, device: torch.device) -> list[Problem]:
    """Where the spec's target, parallelism or checkpoint format cannot run in this model."""
    found = []
    target, quant, parallel = spec["target"], spec["quant"], spec["parallel"]
    if target["dtype"] != WEIGHT_DTYPES[dtype]:
        found.append(
            problem(
                "target.dtype",
                f"the model's MoE weights are {WEIGHT_DTYPES[dtype]}",
                f'"{WEIGHT_DTYPES[dtype]}"',
                value=target["dtype"],
            )
        )
    if target["device"] != device.type:
        found.append(
            problem(
                "target.device",
                f"the model's MoE weights are on {device}",
                f'"{device.type}"',
                value=target["device"],
            )
        )
    if parallel["tp_size"] * parallel["ep_size"] > 1:
        found.append(
            problem(
                "parallel",
                "patch_model runs each layer on one rank",
                "tp_size = 1 and ep_size = 1",
                value={"tp_size": parallel["tp_size"], "ep_size": parallel["ep_size"]},
            )
        )
    if quant["scheme"] == "mxfp4":
        found.append(
            problem(
                "quant.scheme",
                "mxfp4 experts load only from an mxfp4 checkpoint; the model holds float ones",
                '"fp8_block", "mxfp8" or "bf16"',
                value="mxfp4",
            )
        )
    elif quant["scheme"] != "bf16" and quant["checkpoint"] == "quantized":
        found.append(
            problem(
                "quant.checkpoint",
                f"the model holds {WEIGHT_DTYPES[dtype]} experts: the layer quantizes them to "
                f"{quant['scheme']} on load",
                '"bf16"',
                value="quantized",
            )
        )
    return found


def _replace_block(model: nn.Module, name: str, package) -> None:
    """Move the block's weights into a new MoELayer and put a MoecMoE in the block's place."""
    block = model.get_submodule(name)
    layer = package.MoELayer(device=block.experts.gate_up_proj.device)
    try:
        layer.load_weights(block.state_dict())
    except ValueError as error:  # the package's WeightError lists every tensor
        raise MoecError([problem(name, str(error))], kind="usage") from None
    parent, _, attribute = name.rpartition(".")
    setattr(model.get_submodule(parent), attribute, MoecMoE(layer, type(block).__name__))
