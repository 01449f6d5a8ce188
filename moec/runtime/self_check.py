"""`python -m <package>.check`: the layer on random weights against its torch reference
(reference.py), timed, beside the plan's floor. Imports no moec.

Exit status: 0 when the output is within the bound at every T, 1 when it is not or the layer
raises, 2 when the check cannot run here (no CUDA device, Triton kernels on a CPU without
TRITON_INTERPRET=1, a layer of several ranks, weights that do not fit) or cannot write its
report; 141 when the reader of its report went away (`| head`), 130 on Ctrl-C.

Bound, norm-wise (docs/numerics.md, "Comparing two fp8 layers"): layer and reference differ by
fp32 summation order and one rounding of each output to the model dtype, 2**-7 for bfloat16
(two roundings of u = 2**-8; float16 and float32 layers are within it a fortiori). When a
quantized layer quantizes its intermediate again, a value one bf16 ulp off lands on the
neighbouring e4m3 value with probability <= 2**-7 / 2**-3, moving by <= 2**-3 of itself: an rms
of 2**-2 * 2**-3, so 2**-5 + 2**-7.
"""

import argparse
import errno
import os
import re
import sys
import time

import torch

from . import reference
from .output import BROKEN_PIPE, OutputLost, discard

BOUND = {"bf16": (2**-7, "2**-7"), "quantized": (2**-5 + 2**-7, "2**-5 + 2**-7")}
DEFAULT_TOKENS = (1, 64, 4096)
WARMUP = {"cuda": 3, "cpu": 0}
"""Runs before the timed ones, after the checked run (which compiles the kernels)."""
REPEATS = {"cuda": 20, "cpu": 3}
"""Timed runs (their median is reported) unless --repeats says otherwise."""


def main(name: str, layer_class, plan: dict, torch_gated, argv=None) -> int:
    """Run the check of package `name` (its MoELayer, PLAN and torch gated activation). Its
    report goes to standard output, line by line; when that fails the check stops: silently
    with BROKEN_PIPE when the reader went away (`| head`), else with one message and exit 2.
    Ctrl-C stops it with 130, as a shell's."""
    args = _arguments(name, plan).parse_args(argv)
    problem = cannot_run(args.device, plan)
    if problem:
        print(f"{name}.check: {problem}", file=sys.stderr)
        return 2
    try:
        return check(name, layer_class, plan, torch_gated, args)
    except KeyboardInterrupt:
        return 130
    except OutputLost as lost:
        discard(sys.stdout)  # what it still buffers: the exit's flush has nothing to fail
        if lost.errno == errno.EPIPE:
            return BROKEN_PIPE
        print(f"{name}.check: cannot write to standard output: {lost.reason}", file=sys.stderr)
        return 2


def check(name: str, layer_class, plan: dict, torch_gated, args) -> int:
    """Make the layer on random weights, check and time it at each T; the exit status."""
    try:
        layer = layer_class(device=args.device).random_(args.seed)
    except torch.cuda.OutOfMemoryError as error:
        reason = last_line(error)
        print(f"{name}.check: the layer does not fit on {args.device}: {reason}", file=sys.stderr)
        return 2
    bound, bound_text = bound_of(plan)
    for line in header(name, plan, args, bound_text):
        say(line)
    say(f"{'T':>6} {'error':>9} {'time ms':>10} {'floor ms':>10} {'x floor':>9}")
    failures = []
    for tokens in args.tokens:
        failure = check_tokens(layer, plan, torch_gated, tokens, args, bound)
        if failure:
            failures.append(failure)
    if failures:
        say("FAILED: " + "; ".join(failures))
        return 1
    say(f"ok: within {bound_text} of the reference at every T")
    return 0


def say(line: str) -> None:
    """Print a line of the report, at once (a row of a long check shows when it is done); a
    failed write is OutputLost."""
    try:
        print(line, flush=True)
    except OSError as error:
        raise OutputLost(error.errno, error.strerror or str(error)) from None


def needs_interpreter(device: str, plan: dict) -> bool:
    """Whether the layer of `plan` has Triton kernels to run on the CPU and the interpreter is
    not on (TRITON_INTERPRET=1, set before Python starts)."""
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    return device == "cpu" and "triton" in plan["choices"]["requires"] and not interpreted


def cannot_run(device: str, plan: dict) -> str:
    """Why the check cannot run here on `device` ("" when it can)."""
    dims = plan["choices"]["dims"]
    world = dims["tp"] * dims["ep"]
    if world > 1:
        return (
            f"this layer runs on {world} ranks; the self-check runs one-rank layers (build the "
            "spec with parallel.tp_size = ep_size = 1 and check that)"
        )
    if device == "cuda" and not torch.cuda.is_available():
        return (
            "--device cuda: no CUDA device here (torch.cuda.is_available() is False); run it on "
            "a GPU, or pass --device cpu"
        )
    if needs_interpreter(device, plan):
        return (
            "--device cpu: this layer's Triton kernels run on a CPU only interpreted: set "
            "TRITON_INTERPRET=1 in the environment (before Python starts)"
        )
    return ""


def bound_of(plan: dict) -> tuple[float, str]:
    """The norm-wise bound of the layer's scheme, and how it is written."""
    dims = plan["choices"]["dims"]
    quantized = any(dims[experts]["scheme"] != "bf16" for experts in ("routed", "shared"))
    return BOUND["quantized" if quantized else "bf16"]


def header(name: str, plan: dict, args, bound_text: str) -> list[str]:
    """What is checked, against what bound, and whose floor the times stand beside."""
    scheme = plan["choices"]["dims"]["routed"]["scheme"]
    backend = plan["choices"]["gemm_backend"]
    above = plan.get("above")
    if above:  # a GEMM split: both sides run when the check's token counts straddle it
        backend = f"{backend} (up to T={above['up_to']}) and {above['gemm_backend']}"
    return [
        (
            f"{name} self-check: {backend} backend, random weights (seed {args.seed}), on "
            f"{args.device}, torch {torch.__version__}"
        ),
        (
            f"reference: the layer's math in torch ops on its own weights (reference.py); bound "
            f"{bound_text} of the output norm ({scheme}, docs/numerics.md)"
        ),
        floor_line(plan, args.device),
    ]


def floor_line(plan: dict, device: str) -> str:
    """Which device the plan's floor is for, and whether it is the one the check runs on."""
    name = plan["device"]["name"]
    measured = "measured there" if plan["device"]["measured"] else "not measured"
    line = f"floor: the plan's cost model for {name}, {measured}:"
    if device == "cpu":
        return f"{line} not this machine's CPU, compare with care"
    local = torch.cuda.get_device_name()
    if same_device(name, local):
        return f"{line} this GPU ({local})"
    return f"{line} not this GPU ({local}), compare with care"


def same_device(plan_name: str, device_name: str) -> bool:
    """Whether a device table name (e.g. "A100-80GB") names this device (e.g. "NVIDIA
    A100-SXM4-80GB"): each of its words is one of the device's."""
    words = set(re.findall(r"[a-z0-9]+", device_name.lower()))
    return set(re.findall(r"[a-z0-9]+", plan_name.lower())) <= words


def check_tokens(layer, plan, torch_gated, tokens: int, args, bound: float) -> str:
    """Check and time the layer at T = `tokens`, print its row; why it failed, or ""."""
    dims = plan["choices"]["dims"]
    generator = torch.Generator().manual_seed(args.seed + 1 + tokens)
    x = torch.randn(tokens, dims["hidden"], generator=generator)
    x = x.to(args.device, getattr(torch, dims["dtype"]))
    token_ids = reference.token_ids_for(plan, x, generator)  # a hash-routed layer's keys
    run = (lambda: layer(x)) if token_ids is None else (lambda: layer(x, token_ids))
    repeats = args.repeats or REPEATS[args.device]
    try:
        out = run()
        expected = reference.forward(layer, x, plan, torch_gated, token_ids)
        ms = median_ms(run, args.device, repeats, WARMUP[args.device])
    except Exception as error:  # noqa: BLE001  (any failure of the layer is a failed check)
        raised = f"{type(error).__name__}: {last_line(error)}"
        say(f"{tokens:>6} {raised}")
        return f"T={tokens}: raised {raised}"
    gap = norm_error(out, expected)
    floors = {row["tokens"]: row["floor_ms"] for row in plan["cost"]}
    floor = floors.get(tokens)
    shown = f"{floor:>10.4f} {ms / floor:>9.3g}" if floor else f"{'-':>10} {'-':>9}"
    verdict = "ok" if gap <= bound else f"OVER the bound {bound:.2e}"
    say(f"{tokens:>6} {gap:>9.2e} {ms:>10.3f} {shown}  {verdict}")
    return "" if gap <= bound else f"T={tokens}: error {gap:.3g} > {bound:.3g}"


def last_line(error: Exception, width: int = 200) -> str:
    """The last line of an error's message (a compiler's names the cause), at most `width`."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return (lines[-1] if lines else "")[:width]


def norm_error(out: torch.Tensor, expected: torch.Tensor) -> float:
    """|out - expected| / |expected| in float64 (inf when out is not finite)."""
    out, expected = out.double(), expected.double()
    if not torch.isfinite(out).all():
        return float("inf")
    scale = expected.norm().item()
    return (out - expected).norm().item() / scale if scale else (out - expected).norm().item()


def median_ms(run, device: str, repeats: int, warmup: int, barrier=None) -> float:
    """Median time of `repeats` runs of run() in ms, after `warmup` untimed runs: CUDA events on
    a GPU, the host clock on a CPU. barrier(), when given, is called before each timed run,
    outside the time, so that every run starts from the same point (a rank barrier keeps the
    ranks of a group in step; torch.cuda.synchronize starts each run on an idle GPU).

    The benchmarks and the GPU tests time with this function too (one definition)."""
    for _ in range(warmup):
        run()
    times = []
    for _ in range(repeats):
        if barrier is not None:
            barrier()
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            began = time.perf_counter()
            run()
            times.append((time.perf_counter() - began) * 1e3)
    return sorted(times)[len(times) // 2]


def _arguments(name: str, plan: dict) -> argparse.ArgumentParser:
    dims = plan["choices"]["dims"]
    default = [t for t in DEFAULT_TOKENS if t <= dims["max_tokens"]] or [dims["max_tokens"]]
    parser = argparse.ArgumentParser(
        prog=f"python -m {name}.check",
        description=f"Check the {name} layer against its torch reference on random weights, "
        "and time it beside the plan's floor.",
    )
    parser.add_argument("--device", choices=("cuda", "cpu"), default=plan["target"]["device"])
    parser.add_argument(
        "--tokens",
        type=_tokens,
        default=default,
        help=f"token counts, e.g. 1,64,4096 (default: {','.join(map(str, default))})",
    )
    parser.add_argument("--seed", type=_whole, default=0, help="seed of the weights and inputs")
    parser.add_argument(
        "--repeats",
        type=_positive,
        default=None,
        help="timed runs per T, their median reported (default: 20 on cuda, 3 on cpu)",
    )
    return parser


MAX_TOKEN_COUNTS = 64
"""Token counts --tokens takes at most (as `moec explain --tokens`)."""


def _whole(text: str) -> int:
    """A whole number written in ASCII digits (int() also takes "1_0", " 5" and other
    scripts' digits)."""
    if not re.fullmatch(r"-?[0-9]+", text):  # a sign, for the range's message
        raise argparse.ArgumentTypeError(f"expects a whole number, e.g. 0: {text!r}")
    return int(text)


def _positive(text: str) -> int:
    if not re.fullmatch(r"[0-9]+", text) or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expects a positive count: {text!r}")
    return int(text)


def _tokens(text: str) -> list[int]:
    parts = text.split(",")
    if not all(re.fullmatch(r"[0-9]+", part) for part in parts) or len(parts) > MAX_TOKEN_COUNTS:
        parts = []
    tokens = [int(part) for part in parts]
    if not tokens or min(tokens) < 1:
        raise argparse.ArgumentTypeError(
            f"expects positive token counts (at most {MAX_TOKEN_COUNTS}), e.g. 1,64: {text!r}"
        )
    return tokens
