"""`moec init --from-hf`: a spec from a HF `config.json` of a DeepSeek-style MoE model
(DeepSeek-V2, V2-Lite, V3/R1, V3.2, V4, Kimi-K2, Kimi-K2.5, GLM-4.5 and the other model types of
hf_families.FAMILIES and WRAPPERS, softmax top-k ones such as Mixtral, Qwen3-MoE, OLMoE, Jamba
and Granite among them; those of hf_refused.REFUSED_TYPES are refused by name).

The spec describes what the model type's transformers MoE block computes: a config key that
the block never reads (a DeepSeek-V3 config's swiglu_limit), or one of a module beside the
block (Granite's shared_mlp), is not followed, and a comment above the spec's keys says so.

The spec is written as TOML with the HF keys it came from, then checked like any other spec,
so an imported config that moec cannot run is reported the same way.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

from moec.errors import MoecError, problem
from moec.integrations import hf_blocks
from moec.resources import shipped_schema_path
from moec.spec import hf_families, hf_layers, hf_nulls, hf_refused
from moec.spec.hf_family import Family
from moec.spec.hf_values import ConfigReader
from moec.spec.loader import (
    RepeatedKey,
    apply_overrides,
    check_raw,
    read_user_text,
    refuse_standard_input,
    unique_keys,
)
from moec.spec.locate import long_number
from moec.vocab import ScoringFunc, TopkMethod

_KNOWN_TYPES = hf_families.KNOWN_TYPES
_SHOWN_TYPES = 12
_KNOWN_SHOWN = (
    f"{', '.join(_KNOWN_TYPES[:_SHOWN_TYPES])} and {len(_KNOWN_TYPES) - _SHOWN_TYPES} more "
    "(README.md, init --from-hf, lists them all)"
)
"""The model types a refusal's hint names: the first ones (DeepSeek's), then how many more, so
that the message stays one readable line."""
INIT_MARK = "# Written by `moec init --from-hf`"
"""The start of the second line of every spec `moec init` writes (the first is the #:schema
line); the line ends with the digest of the lines below it, so that an edited spec is the
user's."""
_DTYPES = ("bfloat16", "float16", "float32")
_TABLE_ORDER = ("model", "router", "quant", "activation", "experts", "parallel", "target")


def spec_from_hf(
    config_path: str | Path,
    name: str | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    schema_relative_to: str | Path | None = None,
    layer_type: str | None = None,
) -> str:
    """TOML text of a spec for the MoE layer described by the HF config at `config_path` (a
    config.json, or the folder holding one); `layer_type` picks one of DeepSeek-V4's MoE layer
    types ("moe", "hash_moe")."""
    config_path = _config_file(Path(config_path))
    config = _read_json(config_path)
    set_keys = {item.partition("=")[0].strip() for item in overrides}
    notes: list[str] = []  # config keys the spec does not follow, and why
    try:
        raw = spec_data_from_config(config, name, set_keys, layer_type, notes=notes)
    except MoecError as error:
        raise MoecError(error.problems, str(config_path), kind=error.kind) from None
    raw, set_paths = apply_overrides(raw, overrides, str(config_path))
    drop_unused_shared_scheme(raw, set_paths)
    # raises with every problem if moec cannot run it
    check_raw(raw, str(config_path), set_paths=set_paths, overrides=tuple(overrides))
    schema = os.path.relpath(
        shipped_schema_path(),
        Path(schema_relative_to).resolve().parent if schema_relative_to else Path.cwd(),
    )
    return _to_toml(raw, config_path.name, config.get("model_type", "?"), schema, notes)


def drop_unused_shared_scheme(raw: dict[str, Any], set_paths: set[str]) -> None:
    """The config's shared scheme (fp4 experts' fp8_block shared ones), unless --set wrote it,
    goes where --set leaves no shared experts (model.n_shared_experts = 0, the config's value
    of a DeepSeek-V4 block that always holds one): there is none to quantize."""
    if raw.get("model", {}).get("n_shared_experts") != 0 or "quant.shared_scheme" in set_paths:
        return
    quant = raw.get("quant")
    if isinstance(quant, dict):
        quant.pop("shared_scheme", None)


def written_by_init(data: bytes) -> bool:
    """Whether a file's bytes are a spec `moec init` wrote and nobody has edited since (which
    `init -o` may replace): its second line is INIT_MARK's, ending with the digest of the lines
    after it, and they still have that digest."""
    lines = data.split(b"\n", 2)
    if len(lines) < 3 or not lines[1].startswith(INIT_MARK.encode()):
        return False
    found = re.search(rb"lines below: sha256 ([0-9a-f]{16})\.$", lines[1])
    return found is not None and found.group(1).decode() == _digest(lines[2])


def _digest(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()[:16]


def _config_file(path: Path) -> Path:
    """`path`, or `path`/config.json when `path` is a folder."""
    refuse_standard_input(path, "--from-hf", "the path of a HF config.json, or of its folder")
    if not path.is_dir():
        return path
    if (path / "config.json").exists():
        return path / "config.json"
    raise MoecError(
        [problem("--from-hf", "is a folder without a config.json", "a HF config.json")],
        str(path),
        kind="usage",
    )


def _read_json(config_path: Path) -> Any:
    """The parsed config.json; a MoecError for a file that is not UTF-8 JSON."""

    def fail(message: str) -> MoecError:
        return MoecError(
            [problem("--from-hf", message, "a HF config.json")], str(config_path), kind="usage"
        )

    try:
        text = read_user_text(config_path)
    except OSError as error:
        raise fail(f"cannot read: {error.strerror or error}") from None
    except UnicodeDecodeError as error:
        raise fail(f"not UTF-8 text: {error.reason}") from None
    except ValueError as error:  # not a regular file, or too large
        raise fail(f"cannot read: {error}") from None
    if text.startswith("\ufeff"):  # json's message would tell the user to decode "utf-8-sig"
        raise fail(
            "starts with a UTF-8 byte order mark (BOM), which transformers does not read: "
            "save it without one"
        )
    try:
        return json.loads(text, object_pairs_hook=unique_keys)
    except json.JSONDecodeError as error:
        raise fail(f"not JSON: {error.msg} at line {error.lineno}") from None
    except RecursionError:
        raise fail("not JSON moec can read: nested too deeply") from None
    except RepeatedKey as error:
        raise fail(f"not a config: the key {json.dumps(error.key)} appears twice") from None
    except ValueError as error:  # an integer of more digits than Python converts
        found = long_number(text)
        if found is None:
            raise fail(f"not JSON moec can read: {error}") from None
        line, digits = found
        raise fail(
            f"not JSON moec can read: a number of {digits:,} digits at line {line}"
        ) from None


def spec_data_from_config(
    config: dict[str, Any],
    name: str | None = None,
    set_keys: set[str] | frozenset = frozenset(),
    layer_type: str | None = None,
    clamp_as: str = "block",
    notes: list[str] | None = None,
) -> dict[str, Any]:
    """Spec data (as parsed from TOML) for a HF DeepSeek-family config dict.

    Every value is type-checked, naming its config key; values are copied as written, never
    coerced or repaired (ranges are the spec's to check, with the same key names). A key whose
    spec key `set_keys` (the --set keys) overrides is not checked. `layer_type` picks one of
    DeepSeek-V4's MoE layer types; hash-routed layers are refused by key.

    `clamp_as`: "block" (init's reading) is what the model type's transformers block
    computes: the SwiGLU clamped where the block clamps (Family.clamps: DeepSeek-V4's,
    GLM-5-Next's), and every routing key the block fixes (hf_blocks) at the block's value, one
    sentence in `notes` for each config key not followed; "config" reads the keys as written
    and clamps at any swiglu_limit, as SGLang's runner does (patch_model's reading, which then
    follows the block itself unless router_keys="config")."""
    if not isinstance(config, dict):
        raise MoecError(
            [problem("--from-hf", "is not a JSON object", "a HF config.json")], kind="usage"
        )
    model_type = config.get("model_type")
    if model_type is None:  # left out, or a JSON null: no value to show
        written = " (null)" if "model_type" in config else ""
        raise MoecError(
            [
                problem(
                    "model_type",
                    f"is missing from config.json{written}",
                    f"a DeepSeek-family MoE config names its model type, one of {_KNOWN_SHOWN}",
                )
            ],
            kind="usage",
        )
    refused = hf_refused.refused_type(model_type)
    if refused is not None:
        raise MoecError(
            [
                problem(
                    "model_type",
                    f"is {refused}",
                    f"a model type moec computes: {_KNOWN_SHOWN}",
                    value=model_type,
                )
            ],
            kind="usage",
        )
    if not isinstance(model_type, str) or model_type not in _KNOWN_TYPES:
        raise MoecError(
            [
                problem(
                    "model_type",
                    "is not a DeepSeek-family MoE config",
                    f"one of {_KNOWN_SHOWN}",
                    value=model_type,
                )
            ],
            kind="usage",
        )
    outer = ConfigReader(config, set_keys, absent_nulls=hf_nulls.EVERY_TYPE)
    source = hf_families.moe_source(outer, model_type)
    if source is None:  # text_config unusable: nothing else to read
        outer.raise_problems()
        raise AssertionError("moe_source records a problem where it finds no MoE keys")
    source.reader.absent_nulls = hf_nulls.absent_nulls(source.model_type)
    layer_type = hf_families.check_layer_type(source, layer_type)
    family, reader = hf_families.FAMILIES[source.model_type], source.reader
    hf_refused.check_keys(reader, source.model_type)
    hf_layers.check_moe_layers(reader, source.model_type)
    raw: dict[str, Any] = {"name": name or _name_from(outer)}
    raw.update(model=_model_from(reader, family), router=_router_from(reader, family))
    _check_scored_by_activation(reader, family, source.model_type, raw["router"])
    unused = _unused_groups(reader, family, raw["router"])
    if notes is not None:
        notes.extend(_beside_notes(reader, family) + unused)
        notes.extend(_rounding_notes(family, source.model_type, set_keys))
    if layer_type == "hash_moe":  # tid2eid[token_id] chooses: a table of vocab_size rows
        raw["router"]["topk_method"] = "hash"
        raw["model"]["vocab_size"] = reader.integer("vocab_size", "model.vocab_size", required=True)
    quant_holder = hf_families.reader_of(source, "quantization_config")
    raw["quant"] = _quant_from(quant_holder, reader)
    if notes is not None and raw["quant"]["scheme"] != "bf16":
        notes.extend(_loading_notes(quant_holder, raw["quant"]["scheme"]))
    activation = _activation_from(reader, family, clamp_as, source.model_type, notes)
    if activation:
        raw["activation"] = activation
    if clamp_as == "block":  # init's reading: the keys the block fixes are the block's
        block_notes = _follow_block(reader, family, source.model_type, raw)
        if notes is not None:
            notes.extend(block_notes)
    # from_pretrained's dtype "auto" is the outer config's (a composite model's sub-configs'
    # dtypes are not read); text_config's where the outer config writes none
    outer_dtype = any(source.outer.config.get(key) is not None for key in ("torch_dtype", "dtype"))
    dtype_holder = source.outer if outer_dtype else source.reader
    raw["target"] = {"device": "cuda", "dtype": _dtype_from(dtype_holder)}
    outer.raise_problems()
    return raw


def _dtype_from(reader: ConfigReader) -> str:
    """`torch_dtype` (or transformers' newer `dtype`), bfloat16 when neither is set."""
    key = "torch_dtype" if reader.config.get("torch_dtype") is not None else "dtype"
    dtype = reader.text(key, "target.dtype")
    if dtype is None:
        return "bfloat16"
    if dtype not in _DTYPES and not reader.overridden("target.dtype"):
        hint = f"one of {', '.join(_DTYPES)}, or --set target.dtype=bfloat16"
        reader.report(key, dtype, "is not a dtype a moec layer runs in", hint)
    return dtype


def _model_from(reader: ConfigReader, family: Family) -> dict[str, Any]:
    """The model keys, read under the family's names of them (MiniMax-M2: `intermediate_size`
    is the experts')."""
    model = {
        key: reader.integer(family.key(reader, key), f"model.{key}", required=True)
        for key in ("hidden_size", "moe_intermediate_size", "n_routed_experts")
    }
    model["num_experts_per_tok"] = reader.integer(
        family.key(reader, "num_experts_per_tok"), "model.num_experts_per_tok", required=True
    )
    shared = None
    if family.reads("n_shared_experts"):  # Hunyuan: one shared expert, no key
        shared = reader.integer(family.key(reader, "n_shared_experts"), "model.n_shared_experts")
    model["n_shared_experts"] = family.n_shared_experts if shared is None else shared
    if family.shared_width is not None:
        count = model["n_shared_experts"] if family.reads("n_shared_experts") else 1
        model["n_shared_experts"] = _shared_from_width(reader, family.shared_width, model, count)
    return model


def _shared_from_width(
    reader: ConfigReader, width: tuple[str, int], model: dict, count: Any
) -> Any:
    """n_shared_experts of shared experts sized apart: `count` of them (dots3's
    n_shared_experts, or one) of the width the key says (or transformers' default), over
    moe_intermediate_size; a total that is no multiple of it is reported (moec's shared experts
    are n_shared_experts x moe_intermediate_size wide)."""
    key, default = width
    value = reader.integer(key, "model.n_shared_experts")
    value = default if value is None else value
    experts = model["moe_intermediate_size"]
    if type(experts) is not int or experts <= 0 or type(count) is not int or count < 0:
        return 0 if type(count) is int else count  # the spec's rules report these
    total = value * count
    if total % experts == 0 and total >= 0:
        return total // experts
    times = "" if count == 1 else f" (x n_shared_experts = {count})"
    why = (
        f"is no multiple of moe_intermediate_size = {experts}{times}: moec's shared experts "
        "are n_shared_experts x moe_intermediate_size wide"
    )
    if reader.config.get(key) is None:
        message = f"absent, so transformers' default {value}, which {why}"
        reader.problems.append(problem(reader.prefix + key, message, f"a multiple of {experts}"))
    else:
        reader.report(key, value, why, f"a multiple of {experts}")
    return 0


def _router_from(reader: ConfigReader, family: Family) -> dict[str, Any]:
    """The router keys; a key left out (or null, where transformers reads null so: hf_nulls),
    or one the model type has none of (Mixtral: every routing key), takes the default of its
    model type."""
    router: dict[str, Any] = {}
    for key in ("scoring_func", "topk_method"):  # "" stays, for the spec's rules to report
        value = _family_value(reader, family, key, reader.text)
        router[key] = getattr(family, key) if value is None else value
    for key in ("n_group", "topk_group"):
        count = _family_value(reader, family, key, reader.integer)
        router[key] = getattr(family, key) if count is None else count
    norm = _family_value(reader, family, "norm_topk_prob", reader.boolean)
    router["norm_topk_prob"] = family.norm_topk_prob if norm is None else norm
    if family.softmax_of_top_k and router["scoring_func"] == "softmax":
        router["norm_topk_prob"] = True  # the softmax of the top-k logits sums to 1
    scaling = _family_value(reader, family, "routed_scaling_factor", reader.number)
    router["routed_scaling_factor"] = family.routed_scaling_factor if scaling is None else scaling
    if family.bias_key is not None:  # a router without its correction bias: the plain top-k
        if reader.boolean(family.bias_key, "router.topk_method") is False:
            router["topk_method"] = "greedy"
    return router


def _rounding_notes(family: Family, model_type: str, set_keys) -> list[str]:
    """The router.rounding that computes as the model type's transformers router, where that
    router rounds to the model dtype: the spec routes in fp32 unless --set says otherwise."""
    if family.rounding == "none" or "router.rounding" in set_keys:
        return []
    rounded = "its logits" if family.rounding == "logits" else "its logits, scores and weights"
    return [
        f"transformers' {model_type} router computes {rounded} in the model dtype; this spec "
        f'routes in fp32 (router.rounding = "none"), --set router.rounding='
        f"{family.rounding} rounds as transformers does (patch_model does so itself)"
    ]


def _check_scored_by_activation(
    reader: ConfigReader, family: Family, model_type: str, router: dict
) -> None:
    """Record a problem where a router that scores with an activation (DeepSeek-V4's) is given
    softmax, which is no activation: transformers cannot build such a model, so neither layer
    type (its hash layers score the same way) has a block to compute the same as."""
    if (
        family.scored_by_activation
        and router["scoring_func"] == "softmax"
        and not reader.overridden("router.scoring_func")
    ):
        reader.report(
            "scoring_func",
            "softmax",
            f"is no activation, and {model_type}'s router scores with one (transformers builds "
            "no layer of it)",
            '"sqrtsoftplus" or "sigmoid"',
        )


def _unused_groups(reader: ConfigReader, family: Family, router: dict[str, Any]) -> list[str]:
    """Under greedy, a router that reads its groups only for group_limited_greedy
    (Family.greedy_ignores_groups: DeepSeek-V2's, in transformers and DeepSeek's code) chooses
    among all experts: n_group and topk_group become 1 (the spec's greedy takes no groups), and
    one sentence says so. Empty when the config's groups are 1 already."""
    groups = (router["n_group"], router["topk_group"])
    if not family.greedy_ignores_groups or router["topk_method"] != "greedy":
        return []
    if groups == (1, 1) or not all(type(count) is int for count in groups):
        return []
    router["n_group"] = router["topk_group"] = 1
    return [
        f"{reader.prefix}n_group = {groups[0]} and topk_group = {groups[1]} are not followed: "
        'with topk_method = "greedy" the router chooses among all experts (transformers\' '
        "and DeepSeek's read the groups only for group_limited_greedy)"
    ]


def _follow_block(
    reader: ConfigReader, family: Family, model_type: str, raw: dict[str, Any]
) -> list[str]:
    """Set each key of `raw` that transformers' block for `model_type` computes otherwise than
    the config says (hf_blocks, as patch_model follows it) to the block's value, unless --set
    gives it; one sentence for each, naming the config's key and value and what the block
    does."""
    block = hf_blocks.block_of_type(model_type)
    if block is None:
        return []
    notes = []
    for fixed, value in hf_blocks.ignored_keys(block, raw):
        table, key = fixed.path.split(".")
        if reader.overridden(fixed.path) or table not in raw:  # (activation: _activation_from's)
            continue
        if not _spec_value(key, value):  # a malformed value is the spec's rules' to refuse
            continue
        raw[table][key] = fixed.value
        names = family.keys.get(key, (key,))
        written = next((name for name in names if name in reader.config), None)
        said = f"{written} = {hf_blocks.literal(value)}" if written else f"{key} (its default)"
        notes.append(
            f"{reader.prefix}{said} is not followed: transformers' {block.router} {fixed.does}, "
            f"so this layer's {fixed.path} = {hf_blocks.literal(fixed.value)} (--set "
            f"'{fixed.path}={hf_blocks.literal(value)}' follows the config instead)"
        )
    return notes


def _spec_value(key: str, value: Any) -> bool:
    """Whether `value` is one the spec takes for the router or model key `key` (its range
    aside: a block's experts divide into no groups it ignores)."""
    if key == "scoring_func":
        return value in tuple(ScoringFunc)
    if key == "topk_method":
        return value in tuple(TopkMethod) and value != TopkMethod.hash
    if key == "norm_topk_prob":
        return type(value) is bool
    if key == "routed_scaling_factor":
        return type(value) in (int, float) and 0 < value < float("inf")
    minimum = 0 if key == "n_shared_experts" else 1  # n_group, topk_group
    return type(value) is int and value >= minimum


def _beside_notes(reader: ConfigReader, family: Family) -> list[str]:
    """A sentence for each key of a module beside the MoE block that the config sets (not 0)."""
    notes = []
    for key, what in family.beside.items():
        value = reader.config.get(key)
        if value is not None and value != 0:
            shown = f" = {value}" if type(value) is int and abs(value) < 10**18 else ""
            notes.append(f"{reader.prefix}{key}{shown} {what}")
    return notes


def _family_value(reader: ConfigReader, family: Family, key: str, read) -> Any:
    """The value of DeepSeek's router key `key` under the family's name of it, read by `read`
    (a ConfigReader method); None when left out, or when the model type has no such key."""
    if not family.reads(key):
        return None
    return read(family.key(reader, key), f"router.{key}")


def _activation_from(
    reader: ConfigReader,
    family: Family,
    clamp_as: str,
    model_type: str,
    notes: list[str] | None,
) -> dict[str, Any] | None:
    """silu_clamped with a (non-zero) swiglu_limit (left out: the family's default) where the
    family's block clamps or `clamp_as` is "config", else None (silu); another hidden_act is
    reported. A swiglu_limit the block never reads is a sentence in `notes`."""
    if family.activation is not None:  # the block's own SwiGLU: hidden_act is not read
        kind, keys = family.activation
        activation: dict[str, Any] = {"kind": kind}
        for spec_key, key, default in keys:
            value = reader.number(key, f"activation.{spec_key}")
            activation[spec_key] = default if value is None else value
        return activation
    act = reader.text("hidden_act", "activation")
    if act not in _SILU_NAMES and not reader.overridden("activation"):
        # the clamp too is of this activation (a clamped gelu is not silu_clamped)
        reader.report("hidden_act", act, "is not a gated activation moec knows", '"silu"')
        return None
    if family.clamps or clamp_as == "config":
        limit = reader.number("swiglu_limit", "activation")
        limit = family.swiglu_limit if limit is None else limit
        if limit:  # 0 is how configs say "no clamp"; a negative limit is the spec's to reject
            return {"kind": "silu_clamped", "swiglu_limit": limit}
        if limit == 0 and family.clamps and clamp_as == "block":
            _refuse_zero_limit(reader, model_type)
    elif notes is not None and not reader.overridden("activation"):
        _note_unread_limit(reader, model_type, notes)
    return None


def _refuse_zero_limit(reader: ConfigReader, model_type: str) -> None:
    """A swiglu_limit of 0 where the block clamps: transformers' block then clamps its experts'
    SwiGLU at 0 and they output 0, while 0 is no clamp to moec (and to DeepSeek's code)."""
    if reader.overridden("activation"):
        return
    reader.report(
        "swiglu_limit",
        reader.config.get("swiglu_limit"),
        f"makes transformers' {model_type} MoE block clamp its experts' SwiGLU at 0, so that "
        "they output 0; moec reads 0 as no clamp, as DeepSeek's code does",
        "a positive swiglu_limit, or --set activation.kind=silu for no clamp",
    )


_SILU_NAMES = (None, "silu", "swish")
"""hidden_act values of a SwiGLU expert (left out: transformers' default, silu; "swish" is
transformers' other name of it)."""


def _note_unread_limit(reader: ConfigReader, model_type: str, notes: list[str]) -> None:
    """A sentence in `notes` for a swiglu_limit (not 0) that the model type's block never
    reads: transformers' and DeepSeek's own code compute silu, SGLang's runner clamps."""
    limit = reader.config.get("swiglu_limit")
    if limit is None or limit == 0:
        return
    number = isinstance(limit, (int, float)) and not isinstance(limit, bool)
    shown = f" = {limit!r}" if number and abs(limit) < 1e300 else ""  # not nan, inf, 10**400
    notes.append(
        f"{reader.prefix}swiglu_limit{shown} is not followed: transformers' {model_type} MoE "
        "block never clamps its SwiGLU (it reads no swiglu_limit), so this layer computes "
        "silu; --set activation.kind=silu_clamped --set activation.swiglu_limit=... clamps, "
        "as SGLang's runner does"
    )


def _quant_from(reader: ConfigReader, moe: ConfigReader) -> dict[str, Any]:
    """The quant table from `quantization_config` (absent or null: bf16); DeepSeek-V4's
    `expert_dtype = "fp4"` (in `quantization_config`, or beside it in `moe`'s keys) makes the
    routed experts mxfp4 and the shared ones fp8_block, as its checkpoints store them."""
    quantization = reader.table("quantization_config", "quant")
    if quantization is None:
        return {"scheme": "bf16"}
    sub = ConfigReader(
        quantization,
        reader.set_keys,
        "quantization_config.",
        reader.problems,
        absent_nulls=hf_nulls.QUANTIZATION,
    )
    method = sub.text("quant_method", "quant", required=True)
    block = sub.integers("weight_block_size", "quant.weight_block")
    activation = sub.text("activation_scheme", "quant.activation_scheme")
    expert_dtype = _expert_dtype(sub, moe)
    fmt = sub.text("fmt", "quant")
    if fmt not in (None, "e4m3", "e5m2") and not reader.overridden("quant"):
        # e5m2 values load converted to e4m3 exactly, block by block (their scale takes the
        # exponent), or are refused naming the tensor: the spec is the same as for e4m3
        sub.report("fmt", fmt, "is not an fp8 format moec reads", '"e4m3" or "e5m2"')
    if method is None:
        return {"scheme": "bf16"}  # reported, or overridden by --set
    # activation_scheme as written, when written: the rules say what each scheme takes
    written = {"activation_scheme": activation} if activation is not None else {}
    if method == "fp8" and expert_dtype == "fp4":
        if block not in (None, [128, 128]) and not reader.overridden("quant"):
            sub.report(
                "weight_block_size",
                block,
                "is the shared experts' fp8 block with fp4 experts, and moec's fp8_block "
                "shared experts take 128x128",
                "[128, 128]",
            )
        shared = {"shared_scheme": "fp8_block"}
        return {"scheme": "mxfp4", **shared, **written, "checkpoint": "quantized"}
    if method == "mxfp8":
        return {"scheme": "mxfp8", **written, "checkpoint": "quantized"}
    # a written block, even [] (the spec's rules report it), one --set gives, or none written:
    # FineGrainedFP8Config's default is (128, 128); only a written null is per-tensor scales
    if method == "fp8" and (
        block is not None
        or reader.overridden("quant.weight_block")
        or "weight_block_size" not in quantization
    ):
        block = [128, 128] if block is None else block  # the --set value replaces it
        return {"scheme": "fp8_block", "weight_block": block, **written, "checkpoint": "quantized"}
    if method == "fp8":
        return {"scheme": "fp8_per_tensor", **written, "checkpoint": "quantized"}
    if reader.overridden("quant"):
        return {"scheme": "bf16"}
    if method == "mxfp4":  # moec's mxfp4 is DeepSeek-V4's fp4 experts, not this format
        sub.report(
            "quant_method",
            method,
            "is a checkpoint format moec does not read (moec's mxfp4 reads DeepSeek-V4's fp4 "
            'experts: quant_method "fp8" with expert_dtype "fp4")',
            '"fp8" (expert_dtype "fp4" for mxfp4 experts) or "mxfp8"',
        )
    else:
        sub.report("quant_method", method, "is not a scheme moec runs", '"fp8" or "mxfp8"')
    return {"scheme": "bf16"}


def _loading_notes(reader: ConfigReader, scheme: str) -> list[str]:
    """What FineGrainedFP8Config's loading keys change in transformers that this layer does
    not follow: `dequantize` (bf16 weights and GEMMs) and `modules_to_not_convert` (or MiniMax's
    `ignored_layers`) naming modules of the MoE block (those weights stay bf16 there)."""
    quantization = reader.config.get("quantization_config")
    if not isinstance(quantization, dict):
        return []
    notes = []
    if quantization.get("dequantize") is True:
        notes.append(
            f"{reader.prefix}quantization_config.dequantize = true is not followed: transformers "
            f"dequantizes the weights to bf16 on load and runs bf16 GEMMs; this layer runs "
            f"{scheme} GEMMs on the checkpoint's weights (its error bound against that module); "
            "--set quant.scheme=bf16 --set quant.checkpoint=bf16 takes a bf16 checkpoint"
        )
    kept = quantization.get("modules_to_not_convert", quantization.get("ignored_layers"))
    named = [
        name
        for name in (kept if isinstance(kept, list) else [])
        if isinstance(name, str) and ("expert" in name or "mlp" in name)
    ]
    if named:
        shown = ", ".join(json.dumps(name) for name in named[:3])
        more = f" and {len(named) - 3} more" if len(named) > 3 else ""
        notes.append(
            f"{reader.prefix}quantization_config.modules_to_not_convert names {shown}{more}: "
            f"transformers keeps those weights bf16; this layer quantizes every expert weight "
            f"it loads to {scheme} (bf16 checkpoint tensors are quantized on load)"
        )
    return notes


def _expert_dtype(quantization: ConfigReader, moe: ConfigReader) -> str | None:
    """DeepSeek-V4's `expert_dtype` ("fp8" or "fp4"), from quantization_config or beside it."""
    # transformers moves the one beside it in only where quantization_config has none (a null
    # there is fp8 experts, not the other one)
    holder = quantization if "expert_dtype" in quantization.config else moe
    expert_dtype = holder.text("expert_dtype", "quant.scheme")
    if expert_dtype not in (None, "fp8", "fp4") and not holder.overridden("quant.scheme"):
        holder.report(
            "expert_dtype", expert_dtype, "is not an expert format moec runs", '"fp8" or "fp4"'
        )
        return None
    return expert_dtype


def _name_from(reader: ConfigReader) -> str:
    source = reader.text("_name_or_path", "name") or reader.config["model_type"]
    name = re.sub(r"[^A-Za-z0-9_]", "_", source.rstrip("/").split("/")[-1]).strip("_").lower()
    if not name or name[0].isdigit():
        name = f"moe_{name}"
    return name


def _to_toml(
    raw: dict[str, Any], config_name: str, model_type: str, schema: str, notes: list[str]
) -> str:
    """The spec's TOML text; each of `notes` (a config key the spec does not follow, and why)
    a comment line above the keys."""
    out = [f"# {note}." for note in notes]
    out.append(f"name = {_value(raw['name'])}")
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
    body = "\n".join(out) + "\n"
    mark = (
        f"{INIT_MARK} from {json.dumps(config_name)} (model_type {model_type}); "
        f"lines below: sha256 {_digest(body.encode())}."
    )
    return f"#:schema {schema}\n{mark}\n{body}"


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
