"""`moec run`: build, import, load or randomize weights, run one forward, report.

Prints the output checksum, the forward time, and, when the spec's backend is not torch, the
max relative error against the torch backend on the same weights and input. Checks before it
allocates anything that the forward fits: at most max_num_tokens tokens, and the memory of its
peak within what the device has free: making the weights (moec/spec/memory.py: making_bytes,
two copies of them), or the forward and the run's own copies (layer_bytes, run_bytes). On a
terminal, stderr shows which step it is at (moec/runtime/progress.py), and the package's own line
while weights are made or loaded.
"""

from __future__ import annotations

import functools
import math
import os
import time

from moec.errors import MoecError, problem
from moec.runtime.progress import Progress
from moec.spec import LoadedSpec, load_spec
from moec.spec.memory import WEIGHT_COPIES, layer_bytes, making_bytes, run_bytes, show_bytes

MAX_SEED = 2**32 - 1
"""Largest --seed: random weights seed one generator per tensor from seed * 100003 + stream."""


def run_spec(path: str, overrides, tokens: int, seed: int, weights: str | None, prefix: str) -> str:
    import torch

    _check_whole("--tokens", tokens, 1, 2**31 - 1)
    _check_whole("--seed", seed, 0, MAX_SEED)
    loaded = load_spec(path, overrides)
    spec = loaded.spec
    device = spec.target.device
    if device == "cuda" and not torch.cuda.is_available():
        raise MoecError(
            [
                problem(
                    "target.device",
                    "no CUDA device here",
                    "--cpu (the spec on this CPU, its GPU-only keys left out)",
                    value="cuda",
                )
            ],
            loaded.source,
            kind="usage",
        )
    if spec.parallel.tp_size * spec.parallel.ep_size > 1:
        raise MoecError(
            [problem("parallel", "moec run runs one rank", "tp_size = ep_size = 1")],
            loaded.source,
            kind="usage",
        )
    _check_bound(loaded, tokens)
    with Progress("moec run", total=4, delay=0) as line:
        return _run(path, overrides, loaded, tokens, seed, weights, prefix, line)


def _run(path, overrides, loaded: LoadedSpec, tokens, seed, weights, prefix, line) -> str:
    """run_spec after its checks, each step told on `line`."""
    import torch

    import moec
    from moec.runtime.self_check import needs_interpreter

    spec, device = loaded.spec, loaded.spec.target.device
    line.update(0, "building the package")
    package = moec.load(loaded)
    if needs_interpreter(device, package.PLAN):
        raise MoecError(
            [
                problem(
                    "target.device",
                    "this layer's Triton kernels run on a CPU only interpreted",
                    "set TRITON_INTERPRET=1 in the environment, or --set "
                    "experts.gemm_backend=torch",
                    value="cpu",
                )
            ],
            loaded.source,
            kind="usage",
        )
    compared = package.PLAN["choices"]["gemm_backend"] != "torch"
    _check_memory(loaded, tokens, compared, parameter_bytes(package))
    note = f"weights from {weights}" if weights else f"random weights (seed {seed})"
    line.update(1, note, total=6 if compared else 4)
    layer = _layer(package, device, weights, prefix, seed)
    dtype = getattr(torch, spec.target.dtype)
    generator = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(tokens, spec.model.hidden_size, generator=generator).to(
        device=device, dtype=dtype
    )
    from moec.runtime.reference import token_ids_for

    token_ids = token_ids_for(package.PLAN, x, generator)  # a hash-routed layer's keys
    extra = {} if token_ids is None else {"token_ids": token_ids}
    line.update(2, "the first forward (warm-up)")
    out = layer(x, **extra)  # warm-up (and Triton compilation)
    line.update(3, "timing forwards")
    elapsed = _time(functools.partial(layer, **extra), x, device)
    lines = [
        f"spec      {spec.name} (sha256 {loaded.content_hash[:16]})",
        f"backend   {package.PLAN['choices']['gemm_backend']}, layout {package.PLAN['choices']['layout']}",
        f"input     [{tokens}, {spec.model.hidden_size}] {spec.target.dtype} on {device}",
        f"checksum  sum {out.double().sum().item():.6e}, sum|x| {out.double().abs().sum().item():.6e}",
        f"time      {elapsed * 1e3:.3f} ms per forward (median)",
    ]
    if compared:
        line.update(4, "the torch backend's package and weights")
        reference = moec.load(load_spec(path, [*overrides, "experts.gemm_backend=torch"]))
        expected_layer = _layer(reference, device, weights, prefix, seed)
        line.update(5, "the torch backend's forward")
        expected = expected_layer(x, **extra)
        scale = expected.double().abs().max().item() or 1.0
        error = (out.double() - expected.double()).abs().max().item() / scale
        lines.append(f"vs torch  max relative error {error:.3e}")
    line.update(line.total)
    return "\n".join(lines) + "\n"


def _check_whole(option: str, value: int, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise MoecError(
            [problem(option, f"must be a whole number from {low} to {high}", value=value)],
            "moec run",
            kind="usage",
        )


def _check_bound(loaded: LoadedSpec, tokens: int) -> None:
    """Raise when `tokens` is more than one forward of the layer takes."""
    bound = loaded.spec.target.max_num_tokens
    if tokens > bound:
        raise MoecError(
            [
                problem(
                    "--tokens",
                    f"more than target.max_num_tokens = {bound}, the most one forward of this "
                    "layer takes",
                    f"at most {bound}, or --set target.max_num_tokens={tokens}",
                    value=tokens,
                )
            ],
            loaded.source,
            kind="usage",
        )


def _check_memory(loaded: LoadedSpec, tokens: int, compared: bool, weights: int) -> None:
    """Raise before allocating when the run's peak needs more memory than the device has free:
    the layer's `weights` bytes of parameters while random_ or load_weights makes them
    (making_bytes: two copies and a projection's quantization scratch), or, after, a forward
    of `tokens` tokens and what the run keeps beside it; with the torch backend's layer too when
    `compared` (made and run after the first, which stays)."""
    spec = loaded.spec
    making = making_bytes(spec, weights)
    forward = layer_bytes(spec, tokens).activations + run_bytes(spec, tokens, compared)
    layers = 2 if compared else 1
    total = (layers - 1) * weights + max(making, weights + forward)
    free = _free_memory(spec.target.device)
    if free is not None and total > free:
        model = spec.model
        dims = (
            f"H={model.hidden_size}, I={model.moe_intermediate_size}, "
            f"E={model.n_routed_experts} + {model.n_shared_experts} shared, "
            f"K={model.num_experts_per_tok}, {spec.quant.scheme}"
        )
        twice = " (and the torch backend's layer's, to compare)" if compared else ""
        raise MoecError(
            [
                problem(
                    "--tokens",
                    f"the layer ({dims}) needs at least {show_bytes(total)} at its peak, more "
                    f"than the {show_bytes(free)} free on this {spec.target.device}: its "
                    f"weights {show_bytes(weights)}{twice}, made at a peak of "
                    f"{show_bytes(making)} ({making / weights:.2f}x: {WEIGHT_COPIES} copies and "
                    f"a projection's quantization scratch), a forward of {tokens} tokens and "
                    f"its report {show_bytes(forward)}",
                    "fewer tokens, or a smaller layer (e.g. --set model.n_routed_experts=...)",
                    value=tokens,
                )
            ],
            loaded.source,
            kind="usage",
        )


def parameter_bytes(package) -> int:
    """Bytes of the parameters of one layer of `package` (its weights.PARAMETERS table)."""
    return sum(
        math.prod(shape) * dtype.itemsize for shape, dtype in package.weights.PARAMETERS.values()
    )


def _free_memory(device: str) -> int | None:
    """Bytes free on `device` (the host's available memory for cpu); None when unknown."""
    if device == "cuda":
        import torch

        return torch.cuda.mem_get_info()[0]
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    except (OSError, ValueError, AttributeError):
        return None


def _layer(package, device: str, weights: str | None, prefix: str, seed: int):
    layer = package.MoELayer(device=device)
    if not weights:
        return layer.random_(seed)
    try:
        return layer.load_weights(weights, prefix)
    except ValueError as error:  # WeightError is one: every problem of the checkpoint
        problems = getattr(error, "problems", None) or [str(error)]
        hint = "a checkpoint of this layer"
    except (OSError, RuntimeError, TypeError, KeyError, IndexError) as error:
        problems = [f"cannot load: {type(error).__name__}: {error}"]
        hint = "a checkpoint of this layer (if it is one, this is a moec bug: please report it)"
    source = str(weights)
    return _raise_weights(problems, source, hint)


def _raise_weights(problems: list[str], source: str, hint: str):
    """One problem per line of the checkpoint's, each under the --weights path (named once)."""
    lines = [line.removeprefix(f"{source}: ") for line in problems]
    raise MoecError([problem("--weights", line, hint) for line in lines], source, kind="usage")


def _time(layer, x, device: str, repeats: int = 5) -> float:
    import torch

    times = []
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        layer(x)
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]
