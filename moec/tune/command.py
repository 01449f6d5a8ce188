"""`moec tune SPEC`: check that this machine can tune the spec, tune it, write the table.

The table is written under the layer's key (`table_key`) to <user tuning folder>/<gpu>.json
(MOEC_TUNING_DIR, default ~/.cache/moec/tuned; <gpu> is the local GPU's name, e.g.
nvidia-h100-80gb-hbm3), merged with the other layers' entries already there, or to -o.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TextIO

import torch

import moec
from moec.codegen.write import refuse_unless_moec_file, write_bytes
from moec.counts import whole_numbers
from moec.errors import MoecError, problem
from moec.plan import plan_loaded
from moec.plan.environment import read_table, shown, user_tuning_dir
from moec.plan.layer import Layer
from moec.plan.tables import gpu_name, is_tuned_table, target_gpu
from moec.spec import LoadedSpec, load_spec
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
    loaded = load_spec(path, [*overrides, "experts.gemm_backend=triton"])
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
    """The bucket limits: --tokens, else DEFAULT_TOKENS up to max_num_tokens."""
    if text is None:
        return [t for t in DEFAULT_TOKENS if t <= max_tokens] or [max_tokens]
    tokens = sorted(set(whole_numbers(text) or []))
    if not tokens or tokens[0] < 1:
        raise MoecError(
            [
                problem(
                    "--tokens",
                    "expects positive token counts",
                    "e.g. --tokens 1,64,4096",
                    value=text,
                )
            ],
            "moec tune",
            kind="usage",
        )
    return tokens


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
