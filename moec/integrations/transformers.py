"""moec's layer inside a transformers DeepSeek model, in place of its MoE blocks.

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
    patch_model(model, "spec.toml")   # a spec path, a LoadedSpec, or None: a spec from model.config
    model.generate(...)

`patch_model` replaces every DeepSeek-style MoE block (`DeepseekV3MoE`, also in Kimi-K2,
Kimi-K2.5 and Sarvam; `DeepseekV2Moe`, `DeepseekV32MoE`, `Glm4MoeMoE`, DeepSeek-V4's routed
`DeepseekV4SparseMoeBlock`, and the copies of them in dots1, GLM-4.7-Flash, GLM-5, Solar-Open,
GLM-4.5V / 4.6V, GLM-5-Next, Kimi-Linear, Ling, EXAONE-MoE, MiMo-V2-Flash, DeepSeek-OCR-2,
AFMoE, MiniMax-M2, Hunyuan, HY-V3, A.X-K2, Mistral-4, Mistral-Large-4 and Unlimited-OCR,
MiniCPM-5 and Beam, the softmax top-k blocks of Mixtral, MiniMax, Qwen3-MoE, OLMoE, FlexOlmo,
Mellum, Jamba, the four Granite MoE models, Qwen3-VL-MoE and Qwen3-Omni-MoE's thinker,
LFM2-MoE's sigmoid one, and the top-k blocks with a shared expert of Cohere2-MoE, Flint and
Lara-Mini, Inkling-2's and MiniMax-M3's:
hf_blocks.BLOCKS) with a `MoecMoE`. The spec is built once; each block's weights (transformers' own state-dict names) go into that block's
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
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any, get_args

import torch
from torch import nn

import moec
from moec.errors import MoecError, Problem, override_list, path_argument, problem
from moec.integrations import hf_blocks
from moec.integrations.hf_blocks import ROUTER_KEYS, Block
from moec.spec import LoadedSpec, check_raw, hf_refused, load_spec
from moec.spec.hf import drop_unused_shared_scheme, spec_data_from_config
from moec.spec.loader import apply_overrides
from moec.spec.models import Arch

SUPPORTED = ((5, 13), (6, 0))
"""transformers versions [from, to): fused experts (`experts.gate_up_proj`) and a router module
that returns (logits, weights, ids); the range tested."""
INSTALL_HINT = 'pip install "transformers>=5.13,<6"'
MOE_BLOCKS = tuple((block.module, block.name) for block in hf_blocks.BLOCKS)
"""(module under transformers.models, class) of every block patch_model replaces."""
WEIGHT_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


class MoecMoE(nn.Module):
    """A transformers DeepSeek MoE block's drop-in: hidden states [B, S, H] -> [B, S, H]
    through a moec `MoELayer` (which takes tokens [T, H])."""

    def __init__(self, layer: nn.Module, replaces: str, hashed: bool = False) -> None:
        super().__init__()
        self.layer = layer
        self.replaces = replaces
        """Class name of the transformers block this module took the place of."""
        self.hashed = hashed
        """A hash-routed layer (DeepSeek-V4's hash_moe): its experts come from the token ids."""

    def forward(
        self, hidden_states: torch.Tensor, input_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        """`input_ids` [B, S]: what DeepSeek-V4's decoder layers pass every MoE block; a hash
        layer's experts are tid2eid[input_ids], a routed layer's choice does not read them."""
        shape = hidden_states.shape  # [B, S, H]
        x = hidden_states.reshape(-1, shape[-1])  # [T, H], T = B * S
        if self.hashed:  # the layer refuses missing ids, naming them
            out = self.layer(x, None if input_ids is None else input_ids.reshape(-1))
        else:
            out = self.layer(x)
        return out.view(shape)

    def extra_repr(self) -> str:
        return f"replaces {self.replaces}"


def patch_model(
    model: nn.Module,
    spec: str | Path | LoadedSpec | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    cache_dir: str | Path | None = None,
    router_keys: str = "transformers",
    keep_hash_layers: bool = False,
) -> nn.Module:
    """Replace every DeepSeek MoE block of the transformers `model` with moec's layer; return
    the model (patched in place).

    `spec`: a spec file (with `overrides`, `--set`-style "KEY=VALUE"), a `LoadedSpec`, or None
    for the spec `moec init --from-hf` writes from `model.config`, on the model's device and
    dtype, quantizing float weights on load (`overrides` apply on top, e.g.
    "quant.scheme=fp8_block"). Raises MoecError when this transformers version is not supported,
    the model has no such block, or the spec does not describe the model's MoE layers.

    `router_keys`: "transformers" (the default) makes the patched blocks compute what the
    transformers blocks did, also where their router ignores a routing key of the config
    (DeepSeek-V2's `norm_topk_prob` and `scoring_func`, ...; a spec from the config follows
    the block, with one warning naming each such key; a spec file that follows the config is
    refused); "config" follows the config's keys, as DeepSeek's and SGLang's code do.

    DeepSeek-V4 has two MoE layer types, routed (`moe`) and hash-routed (`hash_moe`, whose
    experts are `tid2eid[input_ids]`): `spec` is then None (a spec per type from the config) or
    {"moe": spec, "hash_moe": spec}; `keep_hash_layers=True` leaves the hash_moe blocks
    transformers' own."""
    if router_keys not in ROUTER_KEYS:
        raise MoecError(
            [
                problem(
                    "router_keys", "is not a choice", " or ".join(ROUTER_KEYS), value=router_keys
                )
            ],
            kind="usage",
        )
    if not isinstance(model, nn.Module):
        raise TypeError(
            f"patch_model: model must be a transformers model (a torch nn.Module), "
            f"got {type(model).__name__}"
        )
    if not isinstance(keep_hash_layers, bool):
        raise TypeError(
            f"patch_model: keep_hash_layers must be True or False, got "
            f"{type(keep_hash_layers).__name__}"
        )
    overrides = override_list(overrides, "patch_model")
    cache_dir = path_argument(cache_dir, "cache_dir", "patch_model", optional=True)
    groups, block = _blocks_of(model, keep_hash_layers)
    # The text config (Kimi-K2.5: its DeepSeek-V3 text model's). nn.Module types an attribute
    # it does not declare as Tensor | Module; a transformers model's config is a PretrainedConfig.
    config = model.config.get_text_config()  # type: ignore[union-attr, operator]
    _check_no_router_logits(model.config, config)
    dtype, device = _one_weights_format(model, groups)
    follow = block if router_keys == "transformers" else None
    if follow is not None:
        _check_clamp_limit(follow, config)
    specs = hf_blocks.spec_per_layer_type(spec, groups)
    loaded = {}  # every spec checked before any is built
    for kind in groups:
        loaded[kind] = _resolve_spec(specs[kind], overrides, config, dtype, device, follow, kind)
        check_spec_fits(loaded[kind], config, dtype, device, follow, kind)
    replaced: list[str] = []  # one block at a time, so that each one's old weights are freed
    for kind, names in groups.items():
        package = moec.load(loaded[kind], cache_dir=cache_dir)
        for name in names:
            try:
                _replace_block(model, name, package, kind == "hash_moe")
            except MoecError as error:
                raise _partly_patched(error, replaced) from None
            replaced.append(name)
    return model


def _check_clamp_limit(block: Block, config) -> None:
    """MoecError for a block that clamps at a swiglu_limit of 0 (every expert's SwiGLU then
    outputs 0), which moec, as DeepSeek's code, reads as no clamp."""
    if block.clamps and getattr(config, "swiglu_limit", None) == 0:
        raise MoecError(
            [
                problem(
                    "model.config.swiglu_limit",
                    f"makes transformers' {block.name} clamp its experts' SwiGLU at 0, so that "
                    "they output 0; moec reads 0 as no clamp, as DeepSeek's code does",
                    'a positive swiglu_limit, or router_keys="config" for no clamp',
                    value=config.swiglu_limit,
                )
            ],
            kind="usage",
        )


def _check_no_router_logits(*configs) -> None:
    """MoecError when a config asks the model to return its router logits: moec's layer
    records none, and transformers' auxiliary loss over them would fail on an empty tuple."""
    for config in configs:
        if getattr(config, "output_router_logits", False) is True:
            raise MoecError(
                [
                    problem(
                        "model.config.output_router_logits",
                        "asks for the router logits of every MoE block, which moec's layer does "
                        "not record (patch_model is for inference)",
                        "model.config.output_router_logits = False before patch_model",
                        value=True,
                    )
                ],
                kind="usage",
            )


def _partly_patched(error: MoecError, replaced: list[str]) -> MoecError:
    """The error of a block that did not load, saying which blocks before it were replaced:
    they compute what transformers' blocks did, so the model still runs, half moec's."""
    if not replaced:
        return MoecError(
            [*error.problems, problem("model", "is unchanged: no block was replaced")], kind="usage"
        )
    shown = ", ".join(replaced[:4]) + (
        f" and {len(replaced) - 4} more" if len(replaced) > 4 else ""
    )
    return MoecError(
        [
            *error.problems,
            problem(
                "model",
                f"has {len(replaced)} block(s) replaced before this one ({shown}); they compute "
                "what the transformers blocks did and the model still runs, the later blocks "
                "are transformers' own",
            ),
        ],
        kind="usage",
    )


def _blocks_of(model: nn.Module, keep_hash_layers: bool) -> tuple[dict[str, list[str]], Block]:
    """{layer type ("moe", "hash_moe"): the names of the model's MoE blocks of that type to
    replace}, and their kind; MoecError when it has none. `keep_hash_layers` leaves
    DeepSeek-V4's hash_moe blocks out."""
    classes = moe_block_classes()
    found = [
        (name, module) for name, module in model.named_modules() if isinstance(module, classes)
    ]
    patched = sum(isinstance(module, MoecMoE) for module in model.modules())
    if not found and patched:
        raise MoecError(
            [
                problem(
                    "model",
                    f"is already patched: its {patched} MoE block(s) are moec's (MoecMoE)",
                    "patch_model once per model, or a fresh model",
                )
            ],
            kind="usage",
        )
    refused = _refused_type(model)
    if not found and refused is not None:
        raise MoecError(
            [
                problem(
                    "model",
                    f"is of model type {refused}, {hf_refused.refused_type(refused)}",
                    "a transformers model of a DeepSeek-style MoE (moec init --from-hf lists "
                    "the model types)",
                )
            ],
            kind="usage",
        )
    if not found:
        raise MoecError(
            [
                problem(
                    "model",
                    f"has no DeepSeek MoE block to replace (a {type(model).__name__})",
                    "a transformers model of a DeepSeek-style MoE (moec init --from-hf lists "
                    "the model types)",
                ),
                *_why_no_block(model),
            ],
            kind="usage",
        )
    block = hf_blocks.block_of(type(found[0][1]).__name__)
    groups: dict[str, list[str]] = {}
    for name, module in found:
        layer_type = "hash_moe" if getattr(module, "is_hash", False) else "moe"
        if layer_type == "moe" or not keep_hash_layers:
            groups.setdefault(layer_type, []).append(name)
    if not groups:
        raise MoecError(
            [
                problem(
                    "keep_hash_layers",
                    "keeps every MoE block of this model (all are hash_moe): nothing to replace",
                    "keep_hash_layers=False",
                    value=True,
                )
            ],
            kind="usage",
        )
    return groups, block


def _why_no_block(model: nn.Module) -> list[Problem]:
    """The problems init --from-hf finds in the model's (text) config, under
    "model.config.": a model type moec computes whose config leaves it no MoE layer
    (first_k_dense_replace = num_hidden_layers) says so by key; empty when init finds none."""
    config: Any = getattr(model, "config", None)
    if not hasattr(config, "get_text_config"):
        return []
    try:
        spec_data_from_config(config.get_text_config().to_dict(), clamp_as="config")
    except MoecError as error:
        return [replace(found, path=f"model.config.{found.path}") for found in error.problems]
    return []


def _refused_type(model: nn.Module) -> str | None:
    """The refused model type (hf_refused) the model's (text) config names, if any."""
    config: Any = getattr(model, "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    for holder in (config, text):
        model_type = getattr(holder, "model_type", None)
        if hf_refused.refused_type(model_type) is not None:
            return model_type
    return None


def moe_block_classes() -> tuple[type, ...]:
    """The transformers classes patch_model replaces (those this transformers has); MoecError
    unless a supported transformers is installed."""
    try:
        import transformers
    except ImportError:
        raise MoecError(
            [problem("transformers", "is not installed", INSTALL_HINT)], kind="backend"
        ) from None
    check_version(transformers.__version__)
    classes = []
    for module, name in MOE_BLOCKS:
        try:  # a model newer than this transformers: it cannot have loaded one either
            classes.append(getattr(importlib.import_module(f"transformers.models.{module}"), name))
        except (ImportError, AttributeError):
            continue
    return tuple(classes)


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


def _one_weights_format(model: nn.Module, groups) -> tuple[torch.dtype, torch.device]:
    """The dtype and device of the first block's expert weights, which every block's must
    share (the layers are built for one spec: a block in another dtype would be rounded to it
    and then refuse its own input); each block may sit on a CUDA device of its own."""
    names = [name for members in groups.values() for name in members]
    formats = {name: _expert_weights_format(model.get_submodule(name), name) for name in names}
    dtype, device = formats[names[0]]
    others = [
        problem(
            f"{name}.experts.gate_up_proj",
            f"is {held} on {place.type}, and {names[0]}'s is {dtype} on {device.type}: the "
            "MoE blocks are replaced by layers of one spec, for one dtype and device kind",
            "every MoE block's weights in one dtype (model.to(dtype))",
            value=str(held),
        )
        for name, (held, place) in formats.items()
        if held != dtype or place.type != device.type
    ]
    if others:
        raise MoecError(others, kind="usage")
    return dtype, device


def _expert_weights_format(block: nn.Module, name: str) -> tuple[torch.dtype, torch.device]:
    """dtype and device of a block's fused expert weights; MoecError unless plain floats."""
    weight = getattr(getattr(block, "experts", None), "gate_up_proj", None)
    if not isinstance(weight, torch.Tensor) or weight.dtype not in WEIGHT_DTYPES:
        held = (
            f"a {weight.dtype} tensor"
            if isinstance(weight, torch.Tensor)
            else type(weight).__name__
        )
        raise MoecError(
            [
                problem(
                    f"{name}.experts.gate_up_proj",
                    f"is {held}: moec reads transformers' unquantized experts in "
                    f"{', '.join(WEIGHT_DTYPES.values())}",
                    "load the model in bfloat16 or float32; the spec's quant.scheme quantizes",
                )
            ],
            kind="usage",
        )
    if weight.device.type not in ("cpu", "cuda"):
        raise MoecError(
            [
                problem(
                    f"{name}.experts.gate_up_proj",
                    f"is on {weight.device}: moec copies the model's expert weights into its "
                    "layer, from the CPU or a CUDA device",
                    "load the model's weights (on cpu or cuda) before patch_model",
                )
            ],
            kind="usage",
        )
    return weight.dtype, weight.device


def _resolve_spec(spec, overrides, config, dtype, device, follow, layer_type) -> LoadedSpec:
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
        return load_spec(path_argument(spec, "spec", "patch_model"), overrides)
    return spec_for_model(config, dtype, device, overrides, follow, layer_type)


def spec_for_model(
    config,
    dtype: torch.dtype,
    device: torch.device,
    overrides=(),
    follow: Block | None = None,
    layer_type: str = "moe",
) -> LoadedSpec:
    """The spec of `moec init --from-hf` for a loaded model's (text) config, targeting the
    device and dtype its MoE weights are in, quantizing them on load; `overrides` on top.
    `follow`: the block whose router keys win over the config's, with one warning naming each
    key the config sets otherwise."""
    source = f"<{config.model_type} config>"
    try:
        raw = _config_spec_data(config, layer_type)
    except MoecError as error:
        raise MoecError(error.problems, source, kind=error.kind) from None
    notes = hf_blocks.follow_block(follow, raw) if follow is not None else []
    if follow is not None and notes:
        warnings.warn(
            f"moec patch_model follows transformers' {follow.name}, not the config: "
            + "; ".join(notes)
            + '. The patched model computes what it did before patching; router_keys="config" '
            "follows the config instead, as DeepSeek's and SGLang's code do.",
            RouterKeysIgnored,
            stacklevel=3,
        )
    raw["target"] = {"device": device.type, "dtype": WEIGHT_DTYPES[dtype], **_arch_of(device)}
    raw["quant"]["checkpoint"] = "bf16"  # the model holds float weights: quantize on load
    raw, set_paths = apply_overrides(raw, overrides, source)
    drop_unused_shared_scheme(raw, set_paths)
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


def check_spec_fits(
    loaded: LoadedSpec,
    config,
    dtype: torch.dtype,
    device: torch.device,
    follow: Block | None = None,
    layer_type: str = "moe",
) -> None:
    """MoecError naming every key of the spec that does not describe the model's MoE layers:
    dims, router and activation against the config (and, with `follow`, against what that
    transformers block computes where it ignores the config); dtype and device against the
    weights."""
    expected = _config_spec_data(config, layer_type)
    ignored = {} if follow is None else _ignored_keys(follow, expected)
    if follow is not None:
        hf_blocks.follow_block(follow, expected)
    spec = loaded.normalized
    expected["router"].pop("rounding", None)  # the spec's precision, not the model's structure
    found = [
        _differs(f"{table}.{key}", spec[table][key], want, follow, ignored)
        for table in ("model", "router")
        for key, want in expected[table].items()
        if spec[table][key] != want
    ]
    activation = expected.get("activation", {"kind": "silu"})
    if spec["activation"] != activation:
        kind = spec["activation"]["kind"]
        found.append(_differs("activation.kind", kind, activation["kind"], follow, ignored))
    found += _runtime_problems(spec, dtype, device)
    if found:
        raise MoecError(loaded.located(found), loaded.source)


def _ignored_keys(follow: Block, expected: dict) -> dict[str, tuple[str, Any]]:
    """{spec key the block fixes: (the config's key, its value)} where the config says
    otherwise (a clamp: the config's swiglu_limit)."""
    ignored = {}
    for fixed, value in hf_blocks.ignored_keys(follow, expected):
        table, key = fixed.path.split(".")
        if table == "activation":
            key, value = "swiglu_limit", expected["activation"]["swiglu_limit"]
        ignored[fixed.path] = (key, value)
    return ignored


def _differs(path: str, have, want, follow: Block | None = None, ignored=None) -> Problem:
    key = path.split(".")[-1]
    if follow is not None and ignored and path in ignored:
        fixed = next(f for f in follow.computes if f.path == path)
        config_key, config_value = ignored[path]
        holder = follow.name if path.startswith("activation.") else follow.router
        return problem(
            path,
            f"does not match the model: config.json has {config_key} = "
            f"{json.dumps(config_value)}, but transformers' {holder} ignores it and {fixed.does}",
            f'{key} = {json.dumps(want)}, or patch_model(..., router_keys="config") to follow '
            "the config instead",
            value=have,
        )
    return problem(
        path, "does not match the model", f"its config has {key} = {json.dumps(want)}", value=have
    )


class RouterKeysIgnored(UserWarning):
    """patch_model followed a transformers block that ignores a routing key of its config."""


def _config_spec_data(config, layer_type: str = "moe") -> dict:
    """Spec data from a loaded model's (text) config, for DeepSeek-V4 of its `layer_type`
    layers."""
    kind = layer_type if config.model_type == "deepseek_v4" else None
    # the config's reading: the block's (follow_block) is applied on top, with its warning
    return spec_data_from_config(config.to_dict(), layer_type=kind, clamp_as="config")


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


def _replace_block(model: nn.Module, name: str, package, hashed: bool) -> None:
    """Move the block's weights into a new MoELayer and put a MoecMoE in the block's place."""
    block = model.get_submodule(name)
    # transformers' experts module (nn.Module types it Tensor | Module), checked to hold a
    # gate_up_proj tensor by _expert_weights_format
    layer = package.MoELayer(device=block.experts.gate_up_proj.device)  # type: ignore[union-attr]
    try:
        layer.load_weights(block.state_dict())
    except ValueError as error:  # the package's WeightError lists every tensor
        raise MoecError([problem(name, str(error))], kind="usage") from None
    parent, _, attribute = name.rpartition(".")
    setattr(model.get_submodule(parent), attribute, MoecMoE(layer, type(block).__name__, hashed))
