"""Which decoder layers of a DeepSeek-style model type hold an MoE block, as transformers builds
them: a config whose model has none (first_k_dense_replace at or past num_hidden_layers, every
mlp_layer_types entry "dense", num_dense_layers covering every layer) is refused by that key,
since a spec of its MoE layer describes nothing the model computes.

transformers' rule per model type: the layers from `first_k_dense_replace` on (DeepSeek-V2 and
V3, Kimi-K2, GLM-4.5 and GLM-4.5V's text model, dots1, Sarvam, Mistral-4, Param2; DeepSeek-V2
ignores `moe_layer_freq`), or `mlp_layer_types[i] == "sparse"`, that list derived from
`first_k_dense_replace` when a config leaves it out (DeepSeek-V3.2, GLM-5, ...) or from a count
of the model type's own, whatever first_k_dense_replace says (GLM-4.7-Flash, GLM-5-Next, Beam,
MiMo-V2-Flash, HY-V3, Laguna: the first 1 or 3 layers dense; Mellum, MiniMax-M3: none), or the layers
after the first `num_dense_layers` (AFMoE, LFM2-MoE). A key left out takes transformers'
default for the model type (FIRST_K_DENSE).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from moec.errors import problem
from moec.spec.hf_values import ConfigReader


@dataclass(frozen=True)
class DenseFirst:
    """How one model type says which layers are dense, and transformers' defaults."""

    key: str
    """The count of dense layers first: first_k_dense_replace, or num_dense_layers."""
    dense: int | None
    """transformers' value of `key` when the config leaves it out (None: no such default, the
    rule applies only to a config that writes it)."""
    layers: int
    """transformers' num_hidden_layers when the config leaves it out."""
    layer_types: bool = False
    """Whether the model reads `mlp_layer_types` ("dense" / "sparse" per layer) first."""
    fixed: bool = False
    """Whether transformers, when the config leaves `mlp_layer_types` out, makes the first
    `dense` layers dense whatever the config's `key` says (it reads no such key: GLM-4.7-Flash,
    GLM-5-Next, Beam, ...), so that a config's `key` is not followed."""


def _first_k(dense: int | None, layers: int, layer_types: bool = False) -> DenseFirst:
    return DenseFirst("first_k_dense_replace", dense, layers, layer_types)


def _fixed(dense: int, layers: int) -> DenseFirst:
    """A model type whose mlp_layer_types, left out, is `dense` dense layers, then sparse."""
    return DenseFirst("first_k_dense_replace", dense, layers, True, fixed=True)


FIRST_K_DENSE = {
    "deepseek_v2": _first_k(0, 32),
    "deepseek_v3": _first_k(3, 61),
    "kimi_k2": _first_k(3, 61),
    "glm4_moe": _first_k(1, 46),
    "glm4v_moe_text": _first_k(1, 46),
    "dots1": _first_k(0, 62),
    "sarvam_mla": _first_k(1, 32),
    "sarvam_moe": _first_k(1, 19),
    "mistral4": _first_k(0, 36),
    "param2moe": _first_k(1, 21),
    "deepseek_v32": _first_k(3, 61, True),
    "glm_moe_dsa": _first_k(3, 78, True),
    "exaone_moe": _first_k(1, 32, True),
    "bailing_hybrid": _first_k(2, 42, True),
    "mistral_large4_text": _first_k(1, 72, True),
    "kimi_linear": _first_k(1, 27, True),
    "axk2": _first_k(1, 48, True),
    "unlimited_ocr_text": _first_k(1, 12, True),
    "minicpm5_moe": _first_k(1, 28, True),
    "glm4_moe_lite": _fixed(1, 47),
    "glm5_next_text": _fixed(3, 45),
    "mimo_v2_flash": _fixed(1, 48),
    "hy_v3": _fixed(1, 80),
    "beam": _fixed(3, 52),
    "mellum": _fixed(0, 28),
    "deepseek_ocr2_text": _first_k(None, 32, True),
    "cohere2_moe": _first_k(None, 40, True),
    "minimax_m3_vl_text": _fixed(0, 60),
    "laguna": _fixed(1, 40),
    "dots3_note_text": _first_k(1, 46, True),
    "afmoe": DenseFirst("num_dense_layers", 1, 32),
    "lfm2_moe": DenseFirst("num_dense_layers", 2, 32),
}
"""model_type -> its rule for the dense layers (transformers' configuration defaults)."""
SPARSE_STEP = {
    "qwen3_moe": ((), 24),
    "qwen3_vl_moe_text": ((), 24),
    "qwen3_omni_moe_text": ((), 48),
    "flint": ((0, 1), 49),
}
"""model_type -> (transformers' default mlp_only_layers, num_hidden_layers) where layer i is
MoE unless listed in mlp_only_layers, and only where (i + 1) % decoder_sparse_step == 0 (its
default 1)."""
HINT = "a config whose model has MoE layers"
_INTEGER = "a JSON integer without quotes"
_TYPES = 'a list of "dense" and "sparse"'


def _bad_layer_types(reader: ConfigReader, types: object, layers: int, shown: str) -> bool:
    """Record a problem where transformers' validate_layer_type refuses the list: not a list,
    an entry other than "dense" or "sparse", or not one entry per layer."""
    if not isinstance(types, list):
        reader.report("mlp_layer_types", types, "is not a list", _TYPES)
        return True
    bad = next((kind for kind in types if kind not in ("dense", "sparse")), None)
    if bad is not None:
        reader.report(
            "mlp_layer_types", types, f"has the entry {json.dumps(bad)}, which transformers refuses",
            _TYPES,
        )  # fmt: skip
        return True
    if len(types) != layers:
        reader.report(
            "mlp_layer_types",
            types,
            f"has {len(types)} entries and the model {shown}: transformers takes one per layer",
            f"{_TYPES}, one per layer",
        )
        return True
    return False


def check_moe_layers(reader: ConfigReader, model_type: str) -> None:
    """Record a problem, naming the key, when the config leaves the model no MoE layer (or
    writes a count of layers that is no count)."""
    layers = _count(reader, "num_hidden_layers")
    if layers == 0:
        reader.report("num_hidden_layers", 0, "leaves the model no MoE layer: it has none", HINT)
    if layers == 0 or layers is _NO_COUNT:
        return
    if model_type in SPARSE_STEP:
        _check_sparse_step(reader, *SPARSE_STEP[model_type])
    rule = FIRST_K_DENSE.get(model_type)
    if rule is None:
        return
    shown_layers = f"num_hidden_layers = {layers}"
    if layers is None:
        layers, shown_layers = rule.layers, f"num_hidden_layers (absent: {rule.layers})"
    types = reader.get("mlp_layer_types", hint=_TYPES)
    if rule.layer_types and types is not None:
        if _bad_layer_types(reader, types, layers, shown_layers):
            return
        if all(kind == "dense" for kind in types[:layers]):
            reader.report(
                "mlp_layer_types",
                types,
                'leaves the model no MoE layer: no layer is "sparse"',
                HINT,
            )
        return
    if rule.fixed:
        first = min(rule.dense or 0, layers)
        if first >= layers:
            message = (
                "absent, so transformers' default, which leaves the model no MoE layer: the "
                f"first {first} layers are dense (it reads no {rule.key}), and the model has "
                f"{shown_layers}"
            )
            reader.problems.append(problem(reader.prefix + "mlp_layer_types", message, HINT))
        return
    written = reader.get(rule.key, hint=_INTEGER)
    dense = _count(reader, rule.key)
    if dense is _NO_COUNT:
        return
    if written is None:
        dense = rule.dense
    if dense is None or dense < layers:
        return
    why = f"the first {dense} layers are dense, and the model has {shown_layers}"
    if written is None:  # transformers' default
        message = f"absent, so transformers' default {dense}, which leaves the model no MoE layer"
        reader.problems.append(problem(reader.prefix + rule.key, f"{message}: {why}", HINT))
    else:
        reader.report(rule.key, written, f"leaves the model no MoE layer: {why}", HINT)


_NO_COUNT = -1
"""What _count returns for a value that is no count of layers (recorded as a problem)."""


def _count(reader: ConfigReader, key: str) -> int | None:
    """A count of layers as written: an integer >= 0 (None: left out or null; _NO_COUNT, with
    a problem recorded, for another type or a negative integer, which transformers' strict
    config classes refuse)."""
    value = reader.config.get(key)
    if value is None:
        return None
    if reader.integer(key, key) is None:  # the type's problem recorded
        return _NO_COUNT
    if value < 0:
        reader.report(key, value, "is negative, not a count of layers", "an integer >= 0")
        return _NO_COUNT
    return value


def _check_sparse_step(reader: ConfigReader, dense: tuple[int, ...], default_layers: int) -> None:
    """Qwen3-MoE's rule: a problem when mlp_only_layers and decoder_sparse_step leave no layer
    MoE (each key as written, or transformers' default)."""
    config = reader.config
    layers = _count(reader, "num_hidden_layers")
    layers = default_layers if layers is None else layers
    only = reader.get("mlp_only_layers", list(dense), hint="a list of layer indices")
    step = reader.get("decoder_sparse_step", 1, hint=_INTEGER)
    if not isinstance(only, list) or type(step) is not int or step <= 0 or layers <= 0:
        return  # not this check's to report
    if any(index not in only and (index + 1) % step == 0 for index in range(layers)):
        return
    why = f"leaves the model no MoE layer: with {layers} layers, mlp_only_layers = {only}"
    why += f" and decoder_sparse_step = {step}"
    key = "decoder_sparse_step" if config.get("decoder_sparse_step") is not None else None
    if all(index in only for index in range(layers)):
        key = "mlp_only_layers"
    if key is not None and config.get(key) is not None:
        reader.report(key, config[key], why, HINT)
    else:
        name = key or "mlp_only_layers"
        message = f"absent, so transformers' default, which {why}"
        reader.problems.append(problem(reader.prefix + name, message, HINT))
