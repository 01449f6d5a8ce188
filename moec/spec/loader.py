"""Read a spec: TOML text -> overrides -> preset -> pydantic -> normalized -> rules.

Every problem found on the way becomes a located `Problem`; `load_spec` raises one `MoecError`
with all of them, or returns a `LoadedSpec`.
"""

from __future__ import annotations

import ast
import difflib
import errno
import hashlib
import json
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, get_args

import tomli
from pydantic import BaseModel, ValidationError

from moec.errors import MoecError, Problem, override_list, path_argument, problem
from moec.spec import cpu, models, placement, rules
from moec.spec.locate import dotted, key_lines, line_of, long_number, split_dotted
from moec.spec.normalize import normalize
from moec.spec.presets import PRESETS, apply_preset


@dataclass(frozen=True)
class LoadedSpec:
    """A valid, normalized spec and where it came from."""

    spec: models.Spec
    source: str
    """File name (or "<spec>") used in messages."""
    text: str
    """The TOML text as read (before overrides)."""
    overrides: tuple[str, ...] = ()
    lines: dict[str, int] = field(default_factory=dict)
    changes: tuple[str, ...] = ()
    """What `--set target.device=cpu` changed in a GPU spec, a line each (moec/spec/cpu.py)."""
    placement_file: bool = False
    """Whether parallel.placement named a file (the spec holds the placement read from it)."""

    @property
    def normalized(self) -> dict[str, Any]:
        """The spec as plain data with every default explicit."""
        return self.spec.model_dump(mode="json")

    @property
    def content_hash(self) -> str:
        """sha256 of the normalized spec: equal specs, equal hash, whatever their formatting."""
        return spec_hash(self.spec)

    def located(self, problems: list[Problem]) -> list[Problem]:
        """Problems found later (by the planner) with the line of their key in this file."""
        return [
            p if p.line is not None else p.located(line_of(self.lines, p.path)) for p in problems
        ]


def spec_hash(spec: models.Spec) -> str:
    canonical = json.dumps(spec.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


MAX_TEXT_BYTES = 1 << 22
"""The largest spec or config.json moec reads (4 MiB; real ones are a few KiB)."""


def refuse_standard_input(path: Path, key: str, hint: str) -> None:
    """A MoecError for the path "-" (where no file has that name): the usual name of standard
    input, which moec does not read (a spec's relative paths, a placement file, are its
    folder's; a config.json's folder holds its checkpoint)."""
    if str(path) == "-" and not path.exists():
        says = "is standard input, which moec does not read"
        raise MoecError([problem(key, says, hint)], "-", kind="usage")


def read_user_text(path: Path) -> str:
    """The UTF-8 text of a user's input file; OSError, UnicodeDecodeError (its `start` the
    offset), or ValueError for a file that is not a regular file or is over MAX_TEXT_BYTES."""
    mode = os.stat(path).st_mode  # before opening: opening a fifo waits for a writer
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR))
    if not stat.S_ISREG(mode):
        what = (
            "a fifo" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"
        )
        raise ValueError(f"{what}, not a regular file")
    with open(path, "rb") as handle:
        data = handle.read(MAX_TEXT_BYTES + 1)
    if len(data) > MAX_TEXT_BYTES:
        raise ValueError(f"larger than {MAX_TEXT_BYTES >> 20} MiB")
    return data.decode("utf-8")


class RepeatedKey(ValueError):
    """A JSON object in a user's file that writes one key twice (json.loads would keep the
    last of the two silently)."""

    def __init__(self, key: str) -> None:
        super().__init__(f"the key {json.dumps(key)} is written twice (which one is meant?)")
        self.key = key


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json's object_pairs_hook for a user's file: a dict, RepeatedKey for a key written twice."""
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise RepeatedKey(key)
        found[key] = value
    return found


def read_user_json(path: Path) -> Any:
    """The JSON value of a user's input file, read as read_user_text reads it; besides its
    errors, a ValueError that says what is wrong in plain words: json's own (not JSON), a
    RepeatedKey for a key twice, or one for a leading byte order mark, nesting too deep for
    the parser, or a number too long to read."""
    text = read_user_text(path)
    if text.startswith("\ufeff"):  # json's message would tell the user to decode "utf-8-sig"
        raise ValueError("starts with a UTF-8 byte order mark (BOM): save it as UTF-8 without one")
    try:
        return json.loads(text, object_pairs_hook=unique_keys, parse_int=_json_int)
    except RecursionError:
        raise ValueError("JSON nested too deeply to read") from None


MAX_JSON_DIGITS = 100
"""Digits of the longest integer a user's JSON file may write (int() refuses 4300, with a
message about sys.set_int_max_str_digits; no count moec reads has more than 20)."""


def _json_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_JSON_DIGITS:
        raise ValueError(f"holds an integer of {len(text.lstrip('-'))} digits, too long to read")
    return int(text)


def load_spec(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> LoadedSpec:
    """Read and check the spec file at `path`, with `--set KEY=VALUE` overrides."""
    path = path_argument(path, "path", "load_spec")
    overrides = override_list(overrides, "load_spec")
    if not str(path):  # Path("") is the current folder
        raise MoecError(
            [problem("", "is an empty path", "the path of a TOML spec file")], "SPEC", kind="usage"
        )
    path = Path(path)
    refuse_standard_input(path, "", "a spec is read from its file: the path of a TOML spec file")
    try:
        text = read_user_text(path)
    except OSError as error:
        raise MoecError(
            [problem("", f"cannot read the spec: {error.strerror}", "a readable TOML file")],
            str(path),
            kind="usage",
        ) from None
    except UnicodeDecodeError as error:
        line = path.read_bytes()[: error.start].count(b"\n") + 1
        raise MoecError(
            [Problem("", f"not UTF-8 text: {error.reason}", "a UTF-8 TOML file", line=line)],
            str(path),
        ) from None
    except ValueError as error:
        raise MoecError(
            [problem("", f"cannot read the spec: {error}", "a TOML file of a few KiB")],
            str(path),
            kind="usage",
        ) from None
    return parse_spec(text, str(path), overrides, folder=path.parent)


_KEY_PART = r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\""
_KEY_TUPLE = re.compile(rf"\((?:{_KEY_PART})(?:, (?:{_KEY_PART}))*,?\)")
"""A key tomli writes in its messages as a Python tuple: ('model', 'sub')."""


def _toml_reason(error: tomli.TOMLDecodeError) -> str:
    """tomli's message, a key it quotes as a Python tuple written as TOML writes it (model.sub,
    router."a.b")."""
    message = error.msg if hasattr(error, "msg") else str(error)

    def as_key(found: re.Match[str]) -> str:
        try:
            parts = ast.literal_eval(found.group())
        except (ValueError, SyntaxError):
            return found.group()
        return dotted(parts) if isinstance(parts, tuple) else found.group()

    return _KEY_TUPLE.sub(as_key, message)


def parse_spec(
    text: str,
    source: str = "<spec>",
    overrides: list[str] | tuple[str, ...] = (),
    folder: Path | None = None,
) -> LoadedSpec:
    """Check a spec given as TOML text; `folder` is where the relative file names it holds (a
    placement file) start (default: the current folder); those of `overrides` start in the
    current folder."""
    if text.startswith("\ufeff"):  # tomli's message would be "Invalid statement" at 1:1
        raise MoecError(
            [
                Problem(
                    "",
                    "starts with a UTF-8 byte order mark (BOM), which TOML does not allow",
                    "save it as UTF-8 without a BOM",
                    line=1,
                )
            ],
            source,
        )
    try:
        raw = tomli.loads(text)
    except RecursionError:
        raise MoecError(
            [problem("", _TOO_DEEP, "a spec nests tables and arrays a few levels")], source
        ) from None
    except tomli.TOMLDecodeError as error:
        message = _toml_reason(error)
        line = getattr(error, "lineno", None)
        column = getattr(error, "colno", None)
        where = f"column {column}: " if column else ""
        raise MoecError(
            [Problem("", f"TOML syntax: {where}{message}", "see https://toml.io", line=line)],
            source,
        ) from None
    except ValueError as error:  # e.g. an integer of more digits than Python converts
        raise MoecError([_unreadable_value(text, error)], source) from None
    lines = key_lines(text)
    raw, set_paths = apply_overrides(raw, overrides, source)
    raw, changes = cpu.for_cpu(raw, set_paths)  # --set target.device=cpu on a GPU spec
    changes.sort(key=lambda change: line_of(lines, change[0]) or 0)
    told = tuple(f"{source}:{line_of(lines, key) or '--set'}: {said}" for key, said in changes)
    cpu.tell(told)
    loaded = check_raw(raw, source, text, lines, set_paths, tuple(overrides), folder)
    return replace(loaded, changes=told) if told else loaded


_TOO_DEEP = "TOML nested too deeply to read (arrays or tables inside each other)"


def _unreadable_value(text: str, error: ValueError) -> Problem:
    """A value tomli parsed but Python could not convert: an integer of thousands of digits,
    placed at its key and line where the text shows one."""
    found = long_number(text)
    if found is None:
        return problem("", f"a TOML value moec cannot read: {error}", "numbers of a few digits")
    line, digits = found
    key = max((path for path, at in key_lines(text).items() if at == line), key=len, default="")
    return Problem(key, f"is a number of {digits:,} digits", "numbers of a few digits", line=line)


def check_raw(
    raw: dict[str, Any],
    source: str = "<spec>",
    text: str = "",
    lines: dict[str, int] | None = None,
    set_paths: set[str] | None = None,
    overrides: tuple[str, ...] = (),
    folder: Path | None = None,
) -> LoadedSpec:
    """Validate parsed spec data (the TOML already read and the overrides applied)."""
    lines = lines or {}
    set_paths = set_paths or set()
    from_preset: set[str] = set()
    preset = raw.get("model", {}).get("preset") if isinstance(raw.get("model"), dict) else None
    preset_name = ""
    if isinstance(preset, str) and preset in PRESETS:
        raw, from_preset = apply_preset(raw, preset)
        preset_name = preset

    def locate(found: Problem) -> Problem:
        if _from_set(found.path, set_paths, lines):
            return found.located(None, "--set")
        if found.path in from_preset:
            return found.located(line_of(lines, "model.preset"), f"from preset {preset_name}")
        return found.located(line_of(lines, found.path))

    # a file named in the spec is found beside it; one named by --set, where the command runs
    on_command_line = _from_set("parallel.placement", set_paths, lines)
    named, (raw, read_problem) = raw, _read_placement(raw, None if on_command_line else folder)
    if read_problem is not None:
        raise MoecError([locate(read_problem)], source)
    try:
        spec = models.Spec.model_validate(raw)
    except ValidationError as error:
        found = [locate(p) for p in _from_validation(error, raw)]
        raise MoecError(_sorted(found), source) from None
    spec = normalize(spec)
    found = [locate(p) for p in rules.check(spec)]
    if found:
        raise MoecError(_sorted(found), source)
    placement_file = raw is not named  # a file's placement replaced its name in raw
    return LoadedSpec(spec, source, text, overrides, lines, placement_file=placement_file)


def _read_placement(
    raw: dict[str, Any], folder: Path | None
) -> tuple[dict[str, Any], Problem | None]:
    """parallel.placement naming a file: its placement replaces the name in `raw`, so that the
    spec (its hash, the package's spec.json) holds the placement itself."""
    parallel = raw.get("parallel")
    if not isinstance(parallel, dict):
        return raw, None
    name = parallel.get("placement")
    if not isinstance(name, str) or name == "even":
        return raw, None
    if not name:
        hint = '"even" or a placement file'
        return raw, problem("parallel.placement", "is an empty path", hint, value=name)
    path = Path(name)
    read, found = placement.read(path if path.is_absolute() else (folder or Path()) / path)
    if found is not None:
        return raw, found
    return {**raw, "parallel": {**parallel, "placement": read}}, None


def _from_set(path: str, set_paths: set[str], lines: dict[str, int]) -> bool:
    """Whether the value at `path` came from --set: a set key, a value inside one, or a table
    that only --set wrote."""
    parts = split_dotted(path)
    tables = {dotted(parts[:n]) for n in range(1, len(parts) + 1)} - set(lines)
    for key in set_paths:
        if path == key or path.startswith(key + "."):
            return True
        if any(key.startswith(table + ".") for table in tables):  # in a table only --set wrote
            return True
    return False


def _sorted(found: list[Problem]) -> list[Problem]:
    unique = list(dict.fromkeys(found))
    return sorted(unique, key=lambda p: (p.line if p.line is not None else 10**9, p.path))


# --- overrides ----------------------------------------------------------------------------


def parse_override(item: str) -> tuple[str, Any]:
    """`KEY=VALUE` with one TOML value; a bare word that is not TOML is taken as a string, but a
    value that starts like a TOML string, array or table must be one."""
    if not item.isascii():
        try:
            item.encode("utf-8")
        except UnicodeEncodeError:  # bytes of the command line that are not UTF-8
            raise MoecError(
                [problem("--set", "is not UTF-8 text", "KEY=VALUE in UTF-8", value=item)],
                kind="usage",
            ) from None
    key, sep, value = item.partition("=")
    key = key.strip()
    if not sep or not key or not all(part.isidentifier() for part in key.split(".")):
        raise MoecError(
            [
                problem(
                    "--set",
                    "expects KEY=VALUE with a dotted key",
                    "e.g. --set quant.scheme=bf16",
                    value=item,
                )
            ],
            kind="usage",
        )
    text = value.strip()
    try:
        document = tomli.loads(f"value = {text}")
    except RecursionError:
        raise MoecError([problem(key, _TOO_DEEP, "one TOML value")], kind="usage") from None
    except tomli.TOMLDecodeError as error:
        if text[:1] not in ('"', "'", "[", "{") and "\n" not in text:
            return key, text
        reason = _toml_reason(error)
    except ValueError:  # an integer of more digits than Python converts
        digits = sum(c.isdigit() for c in text)
        raise MoecError(
            [problem(key, f"is a number of {digits:,} digits", "numbers of a few digits")],
            kind="usage",
        ) from None
    else:
        if list(document) == ["value"]:
            return key, document["value"]
        reason = "more than one value"
    raise MoecError(
        [
            problem(
                key,
                f"is not one TOML value: {reason}",
                'e.g. --set description="two words" or --set quant.weight_block=[128, 128]',
                value=text,
            )
        ],
        kind="usage",
    )


def apply_overrides(raw: dict[str, Any], overrides, source: str) -> tuple[dict[str, Any], set[str]]:
    """Set each `KEY=VALUE` of `overrides` in `raw`; return it and the key paths set."""
    paths: set[str] = set()
    for item in overrides:
        try:
            key, value = parse_override(item)
        except MoecError as error:  # the value's problems are the --set's, not the file's
            located = [p if p.path == "--set" else p.located(None, "--set") for p in error.problems]
            raise MoecError(located, source, kind=error.kind) from None
        parts = key.split(".")
        node = raw
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                found = problem(key, f"{part} is not a table", "a key inside a table", value=value)
                raise MoecError([found.located(None, "--set")], source, kind="usage")
            node = child
        _set(node, parts[-1], value, dotted(parts), paths)
    return raw, paths


def _set(node: dict[str, Any], name: str, value: Any, key: str, paths: set[str]) -> None:
    """node[name] = value; a table (--set router={scoring_func="softmax"}) is merged key by key
    into the table already there, as the dotted keys it holds would be, not put in its place
    (which would drop the file's other keys of that table)."""
    paths.add(key)
    here = node.get(name)
    if isinstance(value, dict) and isinstance(here, dict):
        for inner, inner_value in value.items():
            _set(here, inner, inner_value, dotted([*split_dotted(key), inner]), paths)
    else:
        node[name] = value


# --- pydantic errors to problems ----------------------------------------------------------

_ACTIVATION_KINDS = {
    get_args(cls.model_fields["kind"].annotation)[0]: cls
    for cls in (models.Silu, models.SiluClamped, models.OaiSwiglu, models.Situ)
}


def _fields_at(path: list[str]) -> list[str]:
    """Keys accepted in the table at `path` (for did-you-mean)."""
    cls: type[BaseModel] = models.Spec
    for part in path:
        info = cls.model_fields.get(part)
        if info is None:
            return []
        if part == "activation" and cls is models.Spec:
            return sorted(
                {name for kind in _ACTIVATION_KINDS.values() for name in kind.model_fields}
            )
        annotation = info.annotation
        candidates = [a for a in (annotation, *get_args(annotation)) if isinstance(a, type)]
        nested = [a for a in candidates if issubclass(a, BaseModel)]
        if not nested:
            return []
        cls = nested[0]
    return list(cls.model_fields)


_PLACEMENT = ("parallel", "placement")
_PLACEMENT_ACCEPTS = (
    '"even", the path of a placement file (moec eplb), or an array of each rank\'s expert ids, '
    "e.g. [[0, 1], [2, 3]]"
)


def _placement_items(items: list[Any], raw: dict[str, Any]) -> list[Any]:
    """pydantic tries each member of parallel.placement's union ("even", a list of lists, a file
    path) and names each in its locations; the user wrote one value. An array: the problems of
    the list member (its items'), without the member's name; anything else: one problem."""
    parallel = raw.get("parallel")
    value = parallel.get("placement") if isinstance(parallel, dict) else None
    kept, told = [], False
    for item in items:
        loc = tuple(item["loc"])
        if loc[:2] != _PLACEMENT or len(loc) < 3 or not isinstance(loc[2], str):
            kept.append(item)
        elif isinstance(value, list):
            if loc[2].startswith("list") and item["type"] == "list_type":  # a rank's entry
                message = "should be an array of one rank's expert ids"
                kept.append(
                    {**item, "loc": loc[:2] + loc[3:], "type": "placement_type", "msg": message}
                )
            elif loc[2].startswith("list"):
                kept.append({**item, "loc": loc[:2] + loc[3:]})
        elif not told:
            told = True
            message = "is neither a string nor an array"
            kept.append(
                {"loc": _PLACEMENT, "type": "placement_type", "msg": message, "input": value}
            )
    return kept


_TABLES = frozenset(models.Spec.model_fields) - {"name", "description"}
"""The spec's tables: [model], [router], ..."""


def _misplaced(loc: list[str], value: Any) -> bool:
    """Whether an unknown key at `loc` is a dotted key that names a table, written inside
    another table (or its own): `model.hidden_size = 256` under [model] is
    model.model.hidden_size to TOML."""
    return len(loc) >= 2 and loc[-1] in _TABLES and isinstance(value, dict)


def _written_elsewhere(items: list[Any]) -> list[Any]:
    """A key written as a misplaced dotted key is one problem (the unknown key, saying where it
    belongs), not also "is required" for the key it meant."""
    meant = {
        (str(item["loc"][-1]), str(key))
        for item in items
        if item["type"] == "extra_forbidden"
        and _misplaced([str(p) for p in item["loc"]], item.get("input"))
        for key in item["input"]
    }
    return [
        item
        for item in items
        if not (item["type"] == "missing" and tuple(map(str, item["loc"])) in meant)
    ]


def _location(item: Mapping[str, Any]) -> tuple[list[str], str | None]:
    """An error's key path, and the activation kind pydantic's location names (taken out of
    the path: the user wrote [activation], not [activation.silu_clamped])."""
    loc = [str(part) for part in item["loc"]]
    if len(loc) >= 2 and loc[0] == "activation" and loc[1] in _ACTIVATION_KINDS:
        return loc[:1] + loc[2:], loc[1]
    return loc, None


def _misspelt_required(items: list[Any]) -> list[Any]:
    """An unknown key whose closest known key (the one its message would suggest) is a
    required key left out is that key misspelt: one problem, not also "is required". The
    items without those "is required" ones, each unknown key that misspells one holding the
    required key's path under "meant"."""
    missing = {}
    for index, item in enumerate(items):
        if item["type"] == "missing":
            loc, kind = _location(item)
            missing[(tuple(loc), kind)] = index
    paired: set[int] = set()  # the "is required" items told by an unknown key
    kept = list(items)
    for index, item in enumerate(items):
        loc, kind = _location(item)
        if item["type"] != "extra_forbidden" or not loc or _misplaced(loc, item.get("input")):
            continue
        if kind is not None and any(
            loc[-1] in cls.model_fields for cls in _ACTIVATION_KINDS.values()
        ):
            continue  # another kind's key: "belongs to kind = ..." says more
        close = _closest(loc[-1], _known_keys(loc[:-1], kind))
        required = missing.get((tuple(loc[:-1] + close), kind)) if close else None
        if required is not None and required not in paired:
            paired.add(required)
            kept[index] = {**item, "meant": dotted(loc[:-1] + close)}
    return [item for index, item in enumerate(kept) if index not in paired]


def _closest(key: str, known: list[str]) -> list[str]:
    """The known key `key` likely means, in a list of one (empty: none is close); case aside,
    as every known key is lower case ("HIDDEN_SIZE" means hidden_size)."""
    lower = {name.lower(): name for name in known}
    found = difflib.get_close_matches(str(key).lower(), list(lower), n=1, cutoff=0.6)
    return [lower[found[0]]] if found else []


def _known_keys(table: list[str], kind: str | None) -> list[str]:
    """The keys accepted in `table` (under activation `kind`, that kind's)."""
    if table == ["activation"] and kind is not None:
        return list(_ACTIVATION_KINDS[kind].model_fields)
    return _fields_at(table)


def _from_validation(error: ValidationError, raw: dict[str, Any]) -> list[Problem]:
    found = []
    items = _without_preset_keys(_placement_items(list(error.errors()), raw), raw)
    for item in _misspelt_required(_written_elsewhere(items)):
        loc, kind = _location(item)
        path = dotted(loc)
        kind_of = item["type"]
        value = item.get("input")
        if "meant" in item:
            where = f"[{dotted(loc[:-1])}]" if loc[:-1] else "the top level"
            meant = item["meant"]
            hint = f"did you mean {split_dotted(meant)[-1]}? {meant} is required, not set"
            found.append(problem(path, f"unknown key in {where}", hint, value=value))
        elif kind_of == "extra_forbidden":
            found.append(_unknown_key(loc, value, kind))
        elif kind_of == "missing":
            found.append(problem(path, "is required", _required_hint(loc)))
        elif kind_of == "literal_error":
            expected = item.get("ctx", {}).get("expected", "")
            found.append(problem(path, "is not a known value", f"one of {expected}", value=value))
        elif kind_of in ("union_tag_invalid", "union_tag_not_found"):
            kinds = ", ".join(f'"{k}"' for k in _ACTIVATION_KINDS)
            tag_path = f"{path}.kind" if path else "kind"
            if kind_of == "union_tag_not_found":
                found.append(
                    problem(tag_path, "is required to choose the activation", f"one of {kinds}")
                )
            else:
                found.append(
                    problem(
                        tag_path,
                        "is not a known activation",
                        f"one of {kinds}",
                        value=value.get("kind") if isinstance(value, dict) else value,
                    )
                )
        elif kind_of in ("model_type", "model_attributes_type", "dict_type"):
            found.append(problem(path, "must be a table", f"[{path}] with its keys", value=value))
        else:
            message = item["msg"]
            if message.startswith("Value error, "):
                message = message[len("Value error, ") :]
            elif message.startswith("Input should be"):
                message = "should be" + message[len("Input should be") :]
            found.append(problem(path, message, _type_hint(kind_of, item), value=value))
    return found


def _unknown_key(loc: list[str], value: Any, kind: str | None) -> Problem:
    key, table = loc[-1], loc[:-1]
    path = dotted(loc)
    if table == ["activation"] and kind is not None:
        owners = [k for k, cls in _ACTIVATION_KINDS.items() if key in cls.model_fields]
        if owners:
            accepted = [f for f in _ACTIVATION_KINDS[kind].model_fields]
            return problem(
                path,
                f'belongs to kind = "{owners[0]}", not "{kind}"',
                f"{kind} takes {', '.join(accepted)}",
                value=value,
            )
    if _misplaced(loc, value):
        inner = next(iter(value), "")
        return problem(
            path,
            f"unknown key in [{dotted(table)}]: a dotted key {dotted([key, inner])} written "
            f"there is read as {dotted([*table, key, inner])}",
            f"write {dotted([inner])} = ... under [{key}]",
            value=value,
        )
    known = _known_keys(table, kind)
    close = _closest(key, known)
    where = f"[{dotted(table)}]" if table else "the top level"
    hint = f"did you mean {close[0]}?" if close else f"known keys: {', '.join(known)}"
    return problem(path, f"unknown key in {where}", hint, value=value)


def _without_preset_keys(items: list[Any], raw: dict[str, Any]) -> list[Any]:
    """A model.preset that is no preset is one problem, not also one per model key that the
    preset meant would have set ("hidden_size is required, or set model.preset")."""
    model = raw.get("model")
    if not isinstance(model, dict) or "preset" not in model:
        return items
    return [item for item in items if not (item["type"] == "missing" and item["loc"][0] == "model")]


def _required_hint(loc: list[str]) -> str:
    if loc[:1] == ["model"]:
        presets = ", ".join(PRESETS)
        return f"set it, or set model.preset to one of {presets}"
    return "set it"


def _type_hint(kind_of: str, item: Mapping[str, Any]) -> str:
    """What the key accepts, said differently from pydantic's message (which names the type)."""
    if kind_of.startswith("int"):
        return "an integer, without quotes or a decimal point: e.g. 256"
    if kind_of.startswith("float"):
        return "a number, without quotes: e.g. 2.5"
    if kind_of.startswith("bool"):
        return "true or false, without quotes"
    if kind_of.startswith("list"):
        return "an array, e.g. [128, 128]"
    if kind_of.startswith("string"):
        return "a string, in quotes"
    if kind_of == "finite_number":
        return "a finite number, not nan or inf"
    if kind_of in ("greater_than", "greater_than_equal"):
        return "a positive value" if item.get("ctx", {}).get("gt") == 0 else "a larger value"
    if kind_of in ("less_than", "less_than_equal"):
        return "a smaller value"
    if kind_of == "string_too_long":
        return "a shorter string"
    if kind_of == "placement_type":
        return _PLACEMENT_ACCEPTS
    return ""
