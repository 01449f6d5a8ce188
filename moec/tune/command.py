"""`moec tune SPEC`: check that this machine can tune the spec, tune it, write the table.

The table is written under the layer's key (`table_key`) to <user tuning folder>/<gpu>.json
(MOEC_TUNING_DIR, default ~/.cache/moec/tuned; <gpu> is the local GPU's name, e.g.
nvidia-h100-80gb-hbm3), merged with the other layers' entries already there, or to -o.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import TextIO

import torch

import moec
from moec.codegen.write import refuse_unless_moec_file, write_bytes
from moec.errors import MoecError, problem
from moec.plan import plan_loaded
from moec.plan.environment import read_table, shown, user_tuning_dir
from moec.plan.layer import Layer
from moec.plan.tables import gpu_name, is_tuned_table, target_gpu
from moec.spec import LoadedSpec, load_spec
from moec.spec.models import MAX_INT
from moec.spec.rules import arch_number
from moec.tune.measure import Timer
from moec.tune.progress import Progress
from moec.tune.run import TunedLayer, default_search, search_size, tune_layer

DEFAULT_TOKENS = (1, 16, 64, 256, 1024, 4096, 16384)
"""Bucket limits tuned by default (those up to the spec's max_num_tokens)."""


def tune_spec(
    path: str,
    overrides=(),
    tokens: str | None = None,
    out: str | None = None,
    stream: TextIO | None = None,
) -> str:
    """Tune the spec at `path` on the local GPU, write its table; return what was written.
    Progress goes to `stream` (default stderr)."""
    loaded = _triton_spec(path, overrides)
    buckets = _token_list(tokens, loaded.spec.target.max_num_tokens)
    device_name = _local_gpu(loaded)
    gpu = gpu_name(device_name)
    target = Path(out) if out is not None else user_tuning_dir() / f"{gpu}.json"
    # a new file, or a table moec tune wrote (which it adds to): asked before the measuring,
    # which takes minutes, and again by write_bytes when it writes
    refuse_unless_moec_file(target, is_tuned_table)
    layer = plan_loaded(loaded).layer
    package = moec.load(loaded)
    search = default_search(layer, buckets, tma=torch.cuda.get_device_capability()[0] >= 9)
    progress = Progress(search_size(search), stream)
    progress.line(f"moec tune: {loaded.spec.name} on {device_name}, {len(buckets)} buckets")
    tuned = tune_layer(package, layer, search, "cuda", Timer("cuda"), progress)
    progress.finish()
    write_table(target, tuned)
    return (
        f"wrote {shown(target)}: {tuned.key}, {len(tuned.buckets)} bucket"
        f"{'s' if len(tuned.buckets) > 1 else ''}\n"
        f"{build_note(target, gpu, layer)}\n"
    )


def _triton_spec(path: str, overrides) -> LoadedSpec:
    """The spec with the Triton GEMMs tune measures: its own problems first, as validate
    reports them; then those of the Triton backend, said to be tune's."""
    load_spec(path, overrides)
    try:
        return load_spec(path, [*overrides, "experts.gemm_backend=triton"])
    except MoecError as error:
        tuned = [
            replace(
                found,
                message=f"{found.message}, and moec tune measures the Triton GEMMs "
                '(experts.gemm_backend = "triton")',
                hint=_OTHER_BACKEND.sub("", found.hint),
            )
            for found in error.problems
        ]
        raise MoecError(tuned, error.source, kind=error.kind) from None


_OTHER_BACKEND = re.compile(r',? or experts\.gemm_backend = "[a-z_]+"')
"""A hint's way out through another GEMM backend, which tune does not take."""


def write_table(path: Path, tuned: TunedLayer) -> None:
    """Put the layer's entries into the table at `path`, keeping its other entries; atomic,
    and only over a table `moec tune` wrote (codegen.write.write_bytes)."""
    entries = read_table(path, shown(path)) if path.exists() else {}
    entries[tuned.key] = tuned.buckets
    entries[f"elementwise/{tuned.key}"] = tuned.elementwise
    data = (json.dumps(entries, indent=2) + "\n").encode("utf-8")
    write_bytes(path, data, is_tuned_table, make_parents=True)


def build_note(written: Path, gpu: str, layer: Layer) -> str:
    """How `moec build` comes to use the table just written."""
    lookup = user_tuning_dir() / f"{gpu}.json"
    if written.resolve() != lookup.resolve():
        return f"moec build looks for this GPU's table at {shown(lookup)}: put it there to use it"
    if layer.gpu == gpu:
        return f'moec build uses it for this spec (target.gpu = "{gpu}")'
    if target_gpu(layer) == gpu:
        return f"moec build uses it for this spec ({layer.arch} looks up {gpu} by default)"
    return (
        f'moec build uses it for specs with target.gpu = "{gpu}" (in [target], or '
        f"--set target.gpu={gpu})"
    )


def _token_list(text: str | None, max_tokens: int) -> list[int]:
    """The bucket limits: --tokens, else DEFAULT_TOKENS up to max_num_tokens. Checked before
    the GPU is (a wrong --tokens is told on any machine), and before the minutes of measuring:
    each a whole number from 1 to the spec's target.max_num_tokens (the layer's buffers end
    there), each once, at most MAX_BUCKETS of them."""
    if text is None:
        return [t for t in DEFAULT_TOKENS if t <= max_tokens] or [max_tokens]
    accepted = f"up to {MAX_BUCKETS} whole numbers from 1 to {max_tokens}, separated by commas"
    example = ",".join(str(t) for t in DEFAULT_TOKENS if t <= max_tokens)
    parts = [part.strip() for part in text.split(",")]
    wrong = next((part for part in parts if not _DIGITS.fullmatch(part)), None)
    if wrong is not None:
        what = "names no token count" if not wrong else f"{_quoted(wrong)} is not a whole number"
        raise _tokens_error(text, what, f"{accepted}, e.g. --tokens {example}")
    # a count of more digits than any bound is not converted (int() refuses 4300 digits)
    tokens = [int(part) if len(part) <= 19 else MAX_INT + 1 for part in parts]
    if 0 in tokens:
        raise _tokens_error(
            text, "0 is not a bucket limit: a bucket holds at least 1 token", accepted
        )
    above = next((i for i, t in enumerate(tokens) if t > max_tokens), None)
    if above is not None:
        larger = (
            f" or by --set target.max_num_tokens={tokens[above]}"
            if tokens[above] <= MAX_INT
            else ""
        )
        raise _tokens_error(
            text,
            f"{_quoted(parts[above])} is more than the spec's target.max_num_tokens = {max_tokens}",
            f"token counts up to {max_tokens}, or a larger target.max_num_tokens in the spec's "
            f"[target]{larger}",
        )
    twice = sorted(t for t, n in Counter(tokens).items() if n > 1)
    if twice:
        raise _tokens_error(text, f"names {twice[0]} twice", f"each bucket limit once: {accepted}")
    if len(tokens) > MAX_BUCKETS:
        raise _tokens_error(text, f"names {len(tokens)} buckets", accepted)
    return sorted(tokens)


MAX_BUCKETS = 64
"""Most bucket limits one --tokens names (each bucket is minutes of measuring)."""
_DIGITS = re.compile(r"[0-9]+")  # ASCII digits only, as moec.counts reads a count


def _quoted(part: str) -> str:
    """A part of --tokens as a message quotes it: a number plain, anything else as JSON; a long
    one by its length."""
    if len(part) > 20:
        return (
            f"a number of {len(part)} digits"
            if _DIGITS.fullmatch(part)
            else f"a part of {len(part)} characters"
        )
    return part if _DIGITS.fullmatch(part) else json.dumps(part)


def _tokens_error(text: str, message: str, hint: str) -> MoecError:
    return MoecError([problem("--tokens", message, hint, value=text)], "moec tune", kind="usage")


def _local_gpu(loaded: LoadedSpec) -> str:
    """The local GPU's name, after checking it can tune this spec."""
    target = loaded.spec.target
    if not torch.cuda.is_available():
        raise MoecError(
            [
                problem(
                    "",
                    "no CUDA GPU here (torch.cuda.is_available() is False): moec tune measures "
                    "on the GPU the layer will run on",
                    "run it on that GPU",
                )
            ],
            "moec tune",
            kind="usage",
        )
    if target.device != "cuda":
        raise _unfit(
            loaded, "target.device", "moec tune measures a CUDA layer", 'device = "cuda"', "cpu"
        )
    name = torch.cuda.get_device_name()
    major, minor = torch.cuda.get_device_capability()
    if major * 10 + minor < arch_number(loaded.spec):
        raise _unfit(
            loaded,
            "target.arch",
            f"this GPU ({name}) is sm{major}{minor}, older than the target",
            "tune on a GPU of the target's arch or newer",
            target.arch,
        )
    if target.gpu is not None and target.gpu != gpu_name(name):
        raise _unfit(
            loaded,
            "target.gpu",
            f"names another GPU than this one ({gpu_name(name)})",
            f"tune on that GPU, or --set target.gpu={gpu_name(name)}",
            target.gpu,
        )
    return name


def _unfit(loaded: LoadedSpec, key: str, message: str, hint: str, value) -> MoecError:
    return MoecError(
        loaded.located([problem(key, message, hint, value=value)]), loaded.source, kind="usage"
    )
