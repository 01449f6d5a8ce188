"""Read checkpoint tensors by name, checking each one as it is read.

    read_tensors(source, prefix="", expected=None, *, allow_pickle=False, problems=None,
                 progress=None) -> iterator of (name after prefix, tensor)

`source` is one of:
  - a mapping of names to tensors (a state dict);
  - an iterable of (name, tensor) pairs;
  - the path (str or os.PathLike) of a .safetensors file;
  - the path of a folder of .safetensors shards, with or without model.safetensors.index.json
    (with it, only the shards that hold wanted tensors are opened);
  - the path of a pickled torch file (.bin, .pt, .pth), read only with `allow_pickle=True`
    (through torch.load(weights_only=True)): unpickling can run code, so by default the
    message says how to convert it to safetensors.

Only names that start with `prefix` are read, and they are yielded without it. `expected`
(names after the prefix) limits the read to those names: a collection of names, a mapping of
names to the dtype kind each must have (FLOATING, WIDE_FLOAT or STORED), or a predicate on a
name (e.g. an expert-parallel rank skipping the other ranks' experts, whose shards it then never
opens); without it, or with a predicate, every tensor read is of kind STORED.

Every problem is collected (a missing path, a missing, truncated or garbage safetensors file,
an index.json that is not JSON, lacks `weight_map` or names a missing shard, a source that is
not a mapping of names to tensors, a pickle file, a tensor of the wrong dtype kind, an fp8
weight without its scale, non-finite values, checked per tensor as it is read) and raised together as one WeightError after the last
tensor, or appended to `problems` when the caller passes a list to add its own to. When no
wanted tensor is under the prefix, the problem names the prefixes under which the checkpoint
does hold them (`suggest_prefixes`). Reading a folder of shards draws a progress line on stderr
when it is a terminal (`progress=None`; progress.py), since a real checkpoint is hundreds of
gigabytes: the caller's line when one is open (a layer's load_weights), else its own.

Plain module: the standard library, torch, safetensors and progress.py only; copied into
generated packages.
"""

import json
import os
import pickle
import re
import shlex
import stat
import zipfile
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import torch

from .progress import Progress, current

FLOATING = "floating"
"""Any floating-point dtype: bf16, fp16, fp32, fp64, fp8."""
WIDE_FLOAT = "wide float"
"""Floating point of two bytes or more: a weight stored without a scale (fp8 would lose one)."""
STORED = "stored"
"""Floating point, or uint8 / int8 bytes (packed e2m1 pairs, UE8M0 exponents): any format a
weight or scale is stored in. Bool and wider integers are never weights."""
EXPERT_IDS = "expert ids"
"""int64 or int32 expert ids: a hash router's table (`gate.tid2eid`), the one integer tensor
of a layer."""

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".ckpt")
INDEX = "model.safetensors.index.json"
_UNPICKLE_ERRORS: tuple[type[Exception], ...] = (pickle.UnpicklingError, zipfile.BadZipFile)
_UNPICKLE_ERRORS += (EOFError, OSError, RuntimeError, ValueError, TypeError, KeyError)
_UNPICKLE_ERRORS += (AttributeError, ImportError)
"""What torch.load(weights_only=True) raises on a bad or disallowed file."""
LAYER_NAME = re.compile(
    r"(router\.)?gate\.(weight|e_score_correction_bias|expert_bias|bias|tid2eid)$"
    r"|gate\.wg\.weight$|(e_score_correction|expert)_bias$|(shared_)?experts\.|shared_mlp\."
    r"|router\.(layer\.)?weight$|(input|output)_linear\.weight$"  # Granite's, Jamba's
)
"""How the names of an MoE layer start after its prefix: what a read without `expected`
looks for before it suggests another prefix."""
_SHOWN = 10
"""Most names one problem lists."""


class WeightError(ValueError):
    """Every problem of one load (missing, unexpected, mis-shaped or unreadable tensors).

    `problems` holds them all; the message a screenful: the first _LINES, then how many more,
    each line at most _WIDTH characters (a long name shortened in its middle). `unchanged`:
    the load raised before writing any parameter, which the message says."""

    def __init__(self, problems: list[str], unchanged: bool = False) -> None:
        self.problems = [_one_line(text) for text in problems]
        self.unchanged = unchanged
        shown = [
            line if isinstance(raw, Advice) else _clip(line, _WIDTH)
            for raw, line in zip(problems[:_LINES], self.problems, strict=False)
        ]
        if len(self.problems) > _LINES:
            shown.append(f"and {len(self.problems) - _LINES} more problems")
        tail = "\nthe layer is unchanged: no parameter was written" if unchanged else ""
        super().__init__("cannot load the weights:\n  " + "\n  ".join(shown) + tail)


_LINES = 20
"""Most problems a WeightError's message lists."""
_WIDTH = 400
"""Most characters of one problem in the message."""
_NAME_WIDTH = 120
"""Most characters of one name a problem quotes."""


class Advice(str):
    """A problem that holds a command to run: shown whole (a path is at most PATH_MAX), since a
    command cut in its middle does not run."""


def _clip(text: str, width: int = _NAME_WIDTH) -> str:
    """`text`, or its head and tail around an ellipsis when it is longer than `width`."""
    if len(text) <= width:
        return text
    keep = width - 3
    return text[: keep - keep // 3] + "..." + text[len(text) - keep // 3 :]


def _one_line(text: str) -> str:
    """A problem as one line: the control characters of what it quotes (a tensor name, a
    prefix) written as hex escapes, so that a name can neither break the line nor drive the
    terminal."""
    return _CONTROL.sub(lambda found: f"\\x{ord(found.group()):02x}", text)


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def read_tensors(
    source,
    prefix: str = "",
    expected=None,
    *,
    allow_pickle: bool = False,
    problems: list[str] | None = None,
    progress: bool | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """(name after prefix, tensor) for each wanted tensor of `source` (see the module doc)."""
    found: set[str] = set()
    raise_at_end = problems is None
    problems = [] if problems is None else problems
    if not isinstance(prefix, str):
        raise WeightError([f"prefix {prefix!r}: a string, e.g. 'model.layers.3.mlp.'"])
    wanted = _Wanted(prefix, expected)
    narrow: list[str] = []
    for name, tensor in _read_source(source, wanted, problems, found, allow_pickle, progress):
        _check(name, tensor, wanted.kind(name), problems)
        if tensor.dtype.is_floating_point and tensor.element_size() == 1:
            narrow.append(name)
        yield name[len(prefix) :], tensor
    problems += _unscaled(narrow, found)
    misplaced = _prefix_problem(wanted, found)
    if misplaced:
        problems.append(misplaced)
    elif not found and not problems:
        problems.append(f"{_describe(source)}: holds no tensors")
    if raise_at_end and problems:
        raise WeightError(problems)


class _Wanted:
    """Which names a read wants; how many it has read, and how many named like a layer's."""

    def __init__(self, prefix: str, expected) -> None:
        self.prefix = prefix
        self.accepts = expected if callable(expected) else None
        self.names = None if expected is None or callable(expected) else set(expected)
        self.kinds = dict(expected) if isinstance(expected, Mapping) else {}
        self.seen = 0
        self.layer_like = 0

    def wants(self, full_name: str) -> bool:
        if not full_name.startswith(self.prefix):
            return False
        name = full_name[len(self.prefix) :]
        if self.accepts is not None:
            return bool(self.accepts(name))
        return self.names is None or name in self.names

    def __call__(self, full_name: str) -> bool:
        """Whether to read `full_name` (counted when so)."""
        if not self.wants(full_name):
            return False
        self.seen += 1
        self.layer_like += bool(LAYER_NAME.match(full_name[len(self.prefix) :]))
        return True

    def kind(self, full_name: str) -> str:
        name = full_name[len(self.prefix) :]
        return self.kinds.get(name, EXPERT_IDS if name == "gate.tid2eid" else STORED)


# --- sources ------------------------------------------------------------------------------


def _read_source(source, wanted, problems, found, allow_pickle, progress):
    if isinstance(source, (str, os.PathLike)) and not os.fspath(source):
        problems.append('an empty path ("" would be the current folder): the path of a checkpoint')
    elif isinstance(source, (str, os.PathLike)):
        yield from _read_path(Path(source), wanted, problems, found, allow_pickle, progress)
    elif isinstance(source, Mapping):
        yield from _read_pairs(source.items(), wanted, problems, found)
    elif isinstance(source, torch.nn.Module):
        problems.append(f"a {type(source).__name__} module: pass its state_dict() instead")
    elif isinstance(source, Iterable) and not isinstance(source, (bytes, bytearray, torch.Tensor)):
        yield from _read_pairs(source, wanted, problems, found)
    else:
        problems.append(
            f"cannot read weights from {_a(type(source).__name__)}: a state dict, (name, tensor) "
            "pairs, a .safetensors file or a folder of them"
        )


def _read_pairs(pairs, wanted, problems, found):
    """(name, tensor) items: every name a string, every value a tensor."""
    bad: list[str] = []
    for item in pairs:
        if not (isinstance(item, (tuple, list)) and len(item) == 2):
            bad.append(f"{_short(item)} is not a (name, tensor) pair")
            continue
        name, tensor = item
        if not isinstance(name, str):
            bad.append(f"the name {_short(name)} is a {type(name).__name__}, not a string")
        elif not isinstance(tensor, torch.Tensor):
            bad.append(
                f"{name}: a {type(tensor).__module__}.{type(tensor).__qualname__}, not a tensor"
            )
        else:
            found.add(name)
            if wanted(name):
                yield name, tensor
    if bad:
        more = f" (and {len(bad) - _SHOWN} more)" if len(bad) > _SHOWN else ""
        problems.append("not a mapping of names to tensors: " + "; ".join(bad[:_SHOWN]) + more)


def _read_path(path: Path, wanted, problems, found, allow_pickle, progress):
    if path.is_dir():
        yield from _read_folder(path, wanted, problems, found, allow_pickle, progress)
    elif path.is_symlink() and not path.exists():
        problems.append(f"{path}: a link to nothing (a broken link or a loop of links)")
    elif not path.exists():
        problems.append(f"{path}: no such file or folder")
    elif not path.is_file():  # before opening: opening a fifo waits for a writer
        problems.append(f"{path}: {_special(path.stat().st_mode)}, not a regular file")
    elif _is_pickle(path):
        yield from _read_pickle(path, wanted, problems, found, allow_pickle)
    else:
        yield from _read_safetensors(path, wanted, problems, found)


def _a(noun: str) -> str:
    """`noun` with its article: "a dict", "an int"."""
    return f"an {noun}" if noun[:1].lower() in "aeiou" else f"a {noun}"


def _is_pickle(path: Path) -> bool:
    """A torch.save file: by its suffix, or its first bytes (a zip archive, a pickle). A
    safetensors file starts with its header's length (8 bytes, little-endian: its first byte
    may be 0x80 as a pickle's is) and then the header's JSON object."""
    if path.suffix in PICKLE_SUFFIXES:
        return True
    try:
        with open(path, "rb") as handle:
            head = handle.read(9)
    except OSError:
        return False
    if head[8:9] == b"{":
        return False
    return head.startswith(b"PK\x03\x04") or head[:1] == b"\x80"


def _read_pickle(path: Path, wanted, problems, found, allow_pickle):
    if not allow_pickle:
        problems.append(_pickle_advice(path))
        return
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except _UNPICKLE_ERRORS as error:
        problems.append(f"{path}: cannot load it with torch.load(weights_only=True): {error}")
        return
    if not isinstance(state, Mapping):
        problems.append(f"{path}: holds a {type(state).__name__}, not a state dict")
        return
    yield from _read_pairs(state.items(), wanted, problems, found)


def _pickle_advice(path: Path) -> Advice:
    target = path.with_suffix(".safetensors")
    command = (
        "import torch, safetensors.torch as st; "
        f"st.save_file(torch.load({str(path)!r}, weights_only=True), {str(target)!r})"
    )
    return Advice(
        f"{path}: a pickle file (torch.save), not unpickled by default since unpickling can "
        f"run code. Convert it once: python -c {shlex.quote(command)} ; or pass the state dict "
        "that torch.load(path, weights_only=True) returns (read_tensors: allow_pickle=True)"
    )


# --- safetensors --------------------------------------------------------------------------


def _safetensors_errors() -> tuple[type[BaseException], ...]:
    import safetensors

    error = getattr(safetensors, "SafetensorError", None)
    return (OSError, ValueError, RuntimeError) + ((error,) if error else ())


def _read_safetensors(path: Path, wanted, problems, found, names: set[str] | None = None):
    """The wanted tensors of one safetensors file (only `names` of it, when given)."""
    from safetensors import safe_open

    errors = _safetensors_errors()
    try:
        handle = safe_open(str(path), framework="pt")
    except errors as error:
        problems.append(f"{path}: not a readable safetensors file: {error}")
        return
    with handle:
        present = list(handle.keys())  # a safe_open handle is no dict
        if names is None:  # files of a folder without an index: one value for each name
            again = sorted(name for name in found.intersection(present) if wanted.wants(name))
            if again:
                problems.append(
                    f"{path}: holds {_listing(again)} again, which an earlier file of the folder "
                    "holds too (which one is meant? keep one, or add an index)"
                )
        found.update(present)
        for name in present if names is None else sorted(names & set(present)):
            if not wanted(name):
                continue
            try:
                tensor = handle.get_tensor(name)
            except errors as error:
                problems.append(f"{name}: cannot read it from {path}: {error}")
                continue
            yield name, tensor
    if names is not None and names - set(present):
        absent = sorted(names - set(present))
        problems.append(f"{INDEX} puts {_listing(absent)} in {path.name}, which lacks them")


def _read_folder(path: Path, wanted, problems, found, allow_pickle, progress):
    index = path / INDEX
    indexed = index.exists()
    shards: dict[str, set[str] | None]  # a shard's wanted names (None: read all it holds)
    if indexed:
        shards = dict(_shards_from_index(index, wanted, problems, found))
    else:
        shards = {file.name: None for file in sorted(path.glob("*.safetensors"))}
        if not shards:
            pickles = sorted(f for f in path.iterdir() if f.suffix in PICKLE_SUFFIXES)
            if pickles:
                for file in pickles:
                    yield from _read_pickle(file, wanted, problems, found, allow_pickle)
                return
            problems.append(f"{path}: a folder without *.safetensors files or {INDEX}")
            return
    outer = current() if progress is not False else None  # a layer's own line, if open
    line = outer or Progress("loading weights", len(shards), delay=0, ticks=True, on=progress)
    absent: list[str] = []
    for number, (shard, names) in enumerate(sorted(shards.items()), start=1):
        file = path / shard
        if not file.is_file():
            if indexed:
                absent.append(shard)
            else:
                problems.append(
                    f"{file}: not a regular file (a fifo, socket, device or broken link)"
                )
        else:
            yield from _read_safetensors(file, wanted, problems, found, names)
        line.update(number, shard, total=len(shards))
    if outer is None:
        line.close()
    else:
        line.update(note=f"{len(shards)} files read")
    if absent:
        which = f"the shard {absent[0]}" if len(absent) == 1 else f"the shards {_listing(absent)}"
        problems.append(
            f"{index}: names {which}, which {'is' if len(absent) == 1 else 'are'} not a file in {path}"
        )


def _shards_from_index(index: Path, wanted, problems, found) -> dict[str, set[str]]:
    """{shard file name: the wanted names it holds}, from model.safetensors.index.json."""
    twice: list[str] = []
    try:
        status = index.stat()
        if not stat.S_ISREG(status.st_mode):  # a fifo would wait for a writer, /dev/zero not end
            problems.append(
                f"{index}: {_special(status.st_mode)}, not a regular file (a JSON index)"
            )
            return {}
        if status.st_size > _INDEX_BYTES:
            problems.append(
                f"{index}: {status.st_size:,} bytes, more than an index of tensor names to "
                f"shard files takes (at most {_INDEX_BYTES >> 20} MiB)"
            )
            return {}
        data = json.loads(
            index.read_text(encoding="utf-8"), object_pairs_hook=lambda pairs: _object(pairs, twice)
        )
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as error:
        problems.append(f"{index}: not a JSON index: {error}")
        return {}
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict):
        problems.append(f'{index}: has no "weight_map" object of tensor names to shard files')
        return {}
    if twice:
        problems.append(
            f"{index}: names {_listing(sorted(set(twice)))} more than once (which shard is meant? "
            "keep one)"
        )
    shards: dict[str, set[str]] = {}
    for name, shard in weight_map.items():
        if not isinstance(shard, str) or Path(shard).name != shard or shard in ("", ".", ".."):
            problems.append(f"{index}: {name} is in {_short(shard)}, not a file name")
            continue
        found.add(name)
        if wanted.wants(name):
            shards.setdefault(shard, set()).add(name)
    return shards


_INDEX_BYTES = 64 << 20
"""The largest model.safetensors.index.json read (a trillion-parameter model's is a few MiB)."""


def _special(mode: int) -> str:
    """What a file that is not a regular one is: "a folder", "a fifo", ..."""
    if stat.S_ISDIR(mode):
        return "a folder"
    return "a fifo" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"


def _object(pairs: list[tuple[str, object]], twice: list[str]) -> dict:
    """A JSON object, its keys given more than once added to `twice` (json keeps the last)."""
    out: dict = {}
    for key, value in pairs:
        if key in out and isinstance(value, str):  # a tensor name of weight_map
            twice.append(key)
        out[key] = value
    return out


# --- checks of each tensor ----------------------------------------------------------------


def _check(name: str, tensor: torch.Tensor, kind: str, problems: list[str]) -> None:
    """Add a problem naming the tensor when its dtype is not of `kind` or a value is not
    finite. (The tensor is yielded anyway, so that a caller does not report it missing.)"""
    if tensor.device.type == "meta":
        problems.append(f"{name}: on the meta device, it holds no values")
        return
    if tensor.layout != torch.strided:
        problems.append(f"{name}: a {tensor.layout} tensor: pass it dense (tensor.to_dense())")
        return
    reason = _wrong_kind(tensor.dtype, kind)
    if reason:
        problems.append(f"{name}: {tensor.dtype} {list(tensor.shape)}: {reason}")
        return
    bad = non_finite_count(tensor)
    if bad:
        problems.append(f"{name}: {bad} of its {tensor.numel()} values are not finite (nan or inf)")


def _unscaled(narrow: list[str], found: set[str]) -> list[str]:
    """A problem for each fp8 weight without its scale in the checkpoint: its values alone are
    not the weight (an fp8 checkpoint read where bf16 was declared, or a scale left out)."""
    return [
        f"{name}: fp8 values without {name}_scale_inv (or weight_scale): not a weight alone"
        for name in narrow
        if name.endswith("weight") and not _scale_names(name) & found
    ]


def _scale_names(weight: str) -> set[str]:
    """The names a weight's scale may have: HF's `X.weight_scale_inv` (or `X.weight_scale`),
    DeepSeek's `X.scale`."""
    return {f"{weight}_scale_inv", f"{weight}_scale", weight.removesuffix("weight") + "scale"}


def _wrong_kind(dtype: torch.dtype, kind: str) -> str:
    """Why a tensor of `dtype` is no `kind` ("" when it is)."""
    if kind == EXPERT_IDS:
        return "" if dtype in (torch.int64, torch.int32) else "expected int64 or int32 expert ids"
    if dtype.is_floating_point:
        if kind == WIDE_FLOAT and torch.empty((), dtype=dtype).element_size() < 2:
            return "expected bf16, fp16 or fp32 values (an fp8 weight needs its scale)"
        return ""
    if kind == STORED and dtype in (torch.uint8, torch.int8):
        return ""
    if kind == STORED:
        return "weights are floating point, or uint8 bytes of a packed format"
    return "expected floating-point values"


_NAN_BYTES = {
    getattr(torch, name): (mask, value)
    for name, mask, value in (
        ("float8_e4m3fn", 0x7F, 0x7F),
        ("float8_e5m2", 0x7C, 0x7C),
        ("float8_e4m3fnuz", 0xFF, 0x80),
        ("float8_e5m2fnuz", 0xFF, 0x80),
        ("float8_e8m0fnu", 0xFF, 0xFF),
    )
    if hasattr(torch, name)
}
"""(mask, value) of the bytes that are nan or inf, per one-byte float dtype this torch has."""


def non_finite_count(tensor: torch.Tensor) -> int:
    """Values of a floating-point tensor that are nan or inf (0 for other dtypes)."""
    if not tensor.dtype.is_floating_point or tensor.numel() == 0:
        return 0
    if tensor.dtype in _NAN_BYTES:
        mask, value = _NAN_BYTES[tensor.dtype]
        return int(((tensor.view(torch.uint8) & mask) == value).sum())
    try:
        finite = torch.isfinite(tensor)
    except (RuntimeError, TypeError):  # a packed float type without nan (e2m1)
        return 0
    return 0 if bool(finite.all()) else int((~finite).sum())


# --- prefixes -----------------------------------------------------------------------------


def suggest_prefixes(expected: Iterable[str] | None, found: Iterable[str]) -> list[str]:
    """Prefixes under which the checkpoint names `found` hold the most of the `expected`
    names (after a prefix; None: names like a layer's, LAYER_NAME), most first: e.g.
    ["model.layers.3.mlp."] for "model.layers.3.mlp.gate.weight" and "gate.weight"."""
    wanted = None if expected is None else set(expected)
    counts: dict[str, int] = {}
    for name in found:
        parts = name.split(".")
        for cut in range(1, len(parts)):
            rest = ".".join(parts[cut:])
            if rest in wanted if wanted is not None else LAYER_NAME.match(rest):
                prefix = ".".join(parts[:cut]) + "."
                counts[prefix] = counts.get(prefix, 0) + 1
                break
    return sorted(counts, key=lambda prefix: (-counts[prefix], _natural(prefix)))


def _natural(text: str) -> list:
    """Sort key that puts layers.3 before layers.10."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in text.split(".")]


def _prefix_problem(wanted: _Wanted, found: set[str]) -> str | None:
    """A problem when nothing the read wants is under its prefix (for a read without
    `expected`: nothing named like a layer's), naming where the checkpoint has it."""
    if not found or (wanted.seen if wanted.names is not None else wanted.layer_like):
        return None
    start = len(wanted.prefix)
    if any(
        wanted.wants(name) and (wanted.names is not None or LAYER_NAME.match(name[start:]))
        for name in found
    ):
        return None  # the names are under the prefix, their tensors unread (a missing shard)
    head = f'no tensor of the layer is under the prefix "{wanted.prefix}"'
    prefixes = suggest_prefixes(wanted.names, found)
    if prefixes:
        more = len(prefixes) - 1
        others = f" (and {more} other prefix{'es' if more > 1 else ''})" if more else ""
        return f'{head}; the checkpoint has it under "{prefixes[0]}"{others}: pass that prefix'
    if wanted.seen:
        return None  # names of another kind: the caller reports what is missing
    return f"{head}; its names look like {_listing(sorted(found)[:3])}"


# --- output -------------------------------------------------------------------------------


def _describe(source) -> str:
    """How a problem names a source: its path, or its type."""
    if isinstance(source, (str, os.PathLike)):
        return str(source)
    return f"the {type(source).__name__}"


def _listing(names: list[str]) -> str:
    shown = ", ".join(_clip(name) for name in names[:_SHOWN])
    return shown + (f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else "")


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
