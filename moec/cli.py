"""`moec` command line: argument parsing, exit codes and output, nothing else.

Exit codes: 0 ok, 2 a user error (bad spec, bad arguments, missing optional backend, a path
the OS refuses or moec may not replace), printed as one line per problem with no traceback.
Numbers on the command line are parsed here (finite, in range) rather than by argparse, so a bad
one is a problem like any other.
"""

from __future__ import annotations

import argparse
import errno
import math
import os
import re
import sys
from pathlib import Path

from moec import __version__
from moec.counts import whole_numbers
from moec.entry import INTERRUPTED
from moec.errors import MoecError, os_error, problem, refuse_nul, shown_path
from moec.runtime.output import BROKEN_PIPE, OutputLost, discard
from moec.spec import cpu
from moec.spec.models import Parallel
from moec.vocab import ReplicaChoice

MAX_COUNT = 2**31 - 1
"""Largest token count a command takes (the spec's integer bound)."""
MIN_RATE, MAX_RATE = 1e-3, 1e6
"""Range of a bandwidth (GB/s) or matmul rate (TFLOP/s) `moec explain` takes."""


def _add_set(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a spec key with a TOML value, e.g. --set quant.scheme=bf16 (repeatable)",
    )


def _add_cpu(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--cpu",
        dest="overrides",
        action="append_const",
        const="target.device=cpu",
        help="the spec on a CPU: --set target.device=cpu, its GPU-only keys left out or "
        "replaced, each change printed",
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="moec",
        description="Compile a TOML spec of a DeepSeek-style MoE layer into a Python/Triton "
        "package.",
    )
    parser.add_argument("--version", action="version", version=f"moec {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    validate = commands.add_parser(
        "validate", help="check specs as `moec build` would; print ok or every problem"
    )
    validate.add_argument("specs", nargs="+", metavar="SPEC")
    validate.add_argument(
        "--portable",
        action="store_true",
        help="check for any machine: skip the check that optional packages are installed here",
    )
    _add_set(validate)
    _add_cpu(validate)

    explain = commands.add_parser("explain", help="print the plan: stages, types, decisions, cost")
    explain.add_argument("spec", nargs="?", metavar="SPEC")
    explain.add_argument(
        "--tokens", default=None, help="token counts for the cost table, e.g. 1,64,4096"
    )
    explain.add_argument(
        "--format", choices=["text", "json", "dot", "mermaid", "svg", "png"], default="text"
    )
    explain.add_argument("-o", "--out", default=None, help="write to this file (png needs one)")
    explain.add_argument("--matrix", action="store_true", help="print the support matrix instead")
    explain.add_argument(
        "--load", default=None, metavar="FILE", help="a load file: each rank's expected rows"
    )
    explain.add_argument("--bandwidth", help="HBM bandwidth in GB/s for the floor")
    explain.add_argument("--bf16-tflops", help="bf16 matmul rate in TFLOP/s")
    explain.add_argument("--fp8-tflops", help="fp8 grouped GEMM rate in TFLOP/s")
    _add_set(explain)
    _add_cpu(explain)

    build = commands.add_parser("build", help="generate the layer package")
    build.add_argument("spec", metavar="SPEC")
    build.add_argument("-o", "--out", default=None, help="output folder (default: out/)")
    _add_set(build)
    _add_cpu(build)

    run = commands.add_parser("run", help="build, load weights, run one forward, report")
    run.add_argument("spec", metavar="SPEC")
    run.add_argument("--tokens", default="16", help="tokens of the forward (default 16)")
    run.add_argument("--seed", default="0", help="seed of the random weights and input")
    run.add_argument("--weights", default=None, help="state dict, safetensors file or folder")
    run.add_argument("--prefix", help="prefix of the layer's weight names (with --weights)")
    _add_set(run)
    _add_cpu(run)

    tune = commands.add_parser(
        "tune", help="measure Triton tiles on this GPU; write the table `moec build` picks up"
    )
    tune.add_argument("spec", metavar="SPEC")
    tune.add_argument(
        "--tokens",
        default=None,
        help="bucket limits, e.g. 1,16,64 (default: those of 1,16,64,256,1024,4096,16384 "
        "up to target.max_num_tokens)",
    )
    tune.add_argument(
        "-o",
        "--out",
        default=None,
        metavar="TABLE",
        help="table file (default: $MOEC_TUNING_DIR or ~/.cache/moec/tuned, <gpu>.json)",
    )
    _add_set(tune)

    init = commands.add_parser("init", help="write a spec from a HF config.json")
    init.add_argument("--from-hf", required=True, metavar="CONFIG_JSON")
    init.add_argument("-o", "--out", default=None, metavar="SPEC", help="default: standard output")
    init.add_argument("--name", default=None, help="package name (default: from the config)")
    init.add_argument(
        "--layer-type",
        default=None,
        choices=("moe", "hash_moe"),
        help="which MoE layers of a DeepSeek-V4 config the spec describes (it has both)",
    )
    _add_set(init)

    eplb = commands.add_parser(
        "eplb", help="a placement of replicated experts from a recorded load (DeepSeek's EPLB)"
    )
    eplb.add_argument("load", metavar="LOAD", help="a load file (the layer's write_expert_load)")
    eplb.add_argument("-o", "--out", required=True, metavar="PLACEMENT", help="placement file")
    eplb.add_argument("--ranks", required=True, help="expert-parallel ranks (parallel.ep_size)")
    eplb.add_argument("--nodes", default="1", help="nodes the ranks span (default 1)")
    eplb.add_argument("--redundant", default="0", help="redundant experts (default 0)")
    eplb.add_argument(
        "--groups", default="1", help="expert groups (router.n_group; default 1: global)"
    )
    eplb.add_argument(
        "--replica-choice",
        default=Parallel.model_fields["replica_choice"].default,
        metavar="{" + ",".join(ReplicaChoice) + "}",
        help="parallel.replica_choice the imbalance is computed for (default: the spec's, "
        "%(default)s); the placement is DeepSeek's either way, made for an even split",
    )

    schema = commands.add_parser("schema", help="write the JSON Schema of spec files")
    schema.add_argument(
        "-o", "--out", default=None, help="default: schemas/moec-spec.schema.json; - prints it"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    cpu.report_to(sys.stderr)  # what --cpu (--set target.device=cpu) changes in a GPU spec
    stdout = sys.stdout
    sys.stdout = _Output(stdout)
    try:
        try:
            _refuse_empty(args)
            _refuse_standard_output(args)
            _refuse_inside_a_build(args)
            code = _COMMANDS[args.command](args)
            sys.stdout.flush()  # here, not at exit, where a failure is only "Exception ignored"
            return code
        except MoecError as error:
            print(error.report(), file=sys.stderr)
            return 2
        except OSError as error:  # the OS refused a path no command checked: still no traceback
            where = f"moec {args.command}"
            print(os_error(error, where, "cannot read or write").report(), file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            return INTERRUPTED
    except OutputLost as lost:
        discard(stdout)  # what is still buffered, so that the exit's flush has nothing to fail
        if lost.errno == errno.EPIPE:
            return BROKEN_PIPE
        failure = OSError(lost.errno, lost.reason)
        print(os_error(failure, "<standard output>").report(), file=sys.stderr)
        return 2
    finally:
        sys.stdout = stdout
        cpu.report_to(None)


class _Output:
    """Standard output whose write failures are OutputLost, told apart from the OSErrors of the
    paths a command reads and writes; None (the descriptor closed at start) fails the same."""

    def __init__(self, stream) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        return self._call("write", text)

    def flush(self) -> None:
        self._call("flush")

    def _call(self, method: str, *args):
        if self.stream is None:
            raise OutputLost(errno.EBADF, "standard output is closed")
        try:
            return getattr(self.stream, method)(*args)
        except OSError as error:
            raise OutputLost(error.errno or errno.EIO, error.strerror or str(error)) from None
        except ValueError as error:  # "I/O operation on closed file"
            raise OutputLost(errno.EBADF, str(error)) from None

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


def _refuse_empty(args: argparse.Namespace) -> None:
    """An empty -o (or init's --name) is a mistake, not a request for the default; an empty
    path to read (--from-hf, --load) is no path (the OS would read "" as the current folder)."""
    load = "LOAD" if args.command == "eplb" else "--load"
    for option, value, hint in (
        ("-o", getattr(args, "out", None), "leave it out for the default"),
        ("--name", getattr(args, "name", None), "leave it out for the default"),
        ("--from-hf", getattr(args, "from_hf", None), "the path of a HF config.json"),
        (load, getattr(args, "load", None), "the path of a load file (write_expert_load)"),
    ):
        if value is not None and not value.strip():
            raise MoecError(
                [problem(option, "is empty", hint, value=value)],
                f"moec {args.command}",
                kind="usage",
            )
        if value is not None:
            refuse_nul(value, option, f"moec {args.command}")


_FILE_ONLY = {
    "build": ("its package to a folder", "a folder's path, or leave -o out for out/"),
    "eplb": ("its placement to a file", "a placement file's path"),
    "tune": ("its table to a file", "a table file's path, or leave -o out for this GPU's table"),
}
"""Commands whose -o is a path only: "-", standard output to explain, init and schema, would
otherwise make a file (or build's folder) named "-"."""


def _refuse_standard_output(args: argparse.Namespace) -> None:
    if args.command in _FILE_ONLY and getattr(args, "out", None) == "-":
        what, hint = _FILE_ONLY[args.command]
        raise MoecError(
            [problem("-o", f"is standard output, and moec {args.command} writes {what}",
                     hint, value="-")],
            f"moec {args.command}",
            kind="usage",
        )  # fmt: skip


def _refuse_inside_a_build(args: argparse.Namespace) -> None:
    """A file -o inside a package moec built would be a file the build did not write (the next
    build refuses the folder) or replace one of the package's own (its plan.json): refused, as
    `moec build -o` inside one is."""
    from moec.codegen.ownership import package_holding

    out = getattr(args, "out", None)
    if args.command == "build" or not out or out == "-":
        return
    # the folder the OS writes in: `link/..` is the folder above link's target (abspath would
    # say link's own folder); a path ending in `..` names a folder, refused as one later
    name = os.path.basename(out)
    folder = os.path.dirname(os.path.abspath(out) if name in ("", ".", "..") else out)
    inside = package_holding(Path(folder or "."))
    if inside is not None:
        raise MoecError(
            [
                problem(
                    "-o",
                    f"is inside {shown_path(inside)}, a package moec built",
                    "an -o outside it",
                )
            ],
            out,
            kind="usage",
        )


def _validate(args: argparse.Namespace) -> int:
    from moec.codegen import check_installed
    from moec.plan import plan_loaded
    from moec.spec import load_spec

    failed = False
    for path in args.specs:
        try:
            loaded = load_spec(path, args.overrides)
            plan = plan_loaded(loaded)
            if not args.portable:
                check_installed(plan, loaded)
        except MoecError as error:
            print(error.report(), file=sys.stderr)
            failed = True
            continue
        print(f"{shown_path(path)}: ok" if len(args.specs) > 1 else "ok")
    return 2 if failed else 0


def _explain(args: argparse.Namespace) -> int:
    from moec import explain

    out = None if args.out == "-" else args.out  # -: standard output, as for init
    if args.matrix:
        ignored = [
            option
            for option, given in (
                ("SPEC", args.spec),
                ("--tokens", args.tokens),
                ("--format", args.format != "text"),
                ("--set or --cpu", args.overrides),  # --cpu is a --set target.device=cpu
                ("--bandwidth", args.bandwidth),
                ("--bf16-tflops", args.bf16_tflops),
                ("--fp8-tflops", args.fp8_tflops),
                ("--load", args.load),
            )
            if given
        ]
        if ignored:
            raise MoecError(
                [
                    problem(
                        "--matrix",
                        f"prints the support matrix of every spec, and takes no {', '.join(ignored)}",
                        "moec explain --matrix [-o FILE], or explain a SPEC without --matrix",
                    )
                ],
                "moec explain",
                kind="usage",
            )
        explain.write(explain.matrix_text(), out)
        return 0
    if args.spec is None:
        raise MoecError([problem("", "is required unless --matrix is given")], "SPEC", kind="usage")
    ceilings = {
        key: positive_number(option, value, "moec explain")
        for key, option, value in (
            ("bandwidth_gbs", "--bandwidth", args.bandwidth),
            ("bf16_tflops", "--bf16-tflops", args.bf16_tflops),
            ("fp8_tflops", "--fp8-tflops", args.fp8_tflops),
        )
        if value is not None
    }
    output = explain.explain(
        args.spec, args.overrides, args.tokens, args.format, ceilings, args.load
    )
    explain.write(output, out)
    return 0


def _build(args: argparse.Namespace) -> int:
    from moec.codegen import build

    result = build(args.spec, args.out, args.overrides)
    print(f"{shown_path(result.package_dir)}: {result.summary}")
    return 0


def _run(args: argparse.Namespace) -> int:
    from moec.runner import MAX_SEED, run_spec

    tokens = whole_number("--tokens", args.tokens, 1, MAX_COUNT, "moec run")
    seed = whole_number("--seed", args.seed, 0, MAX_SEED, "moec run")
    if args.weights == "":
        raise MoecError(
            [problem("--weights", "is empty", "a checkpoint path, or no --weights", value="")],
            "moec run",
            kind="usage",
        )
    if args.prefix is not None and args.weights is None:  # even --prefix '': it asks for weights
        raise MoecError(
            [
                problem(
                    "--prefix", "names the weights of --weights, which is not given", "--weights"
                )
            ],
            "moec run",
            kind="usage",
        )
    prefix = args.prefix or ""
    print(run_spec(args.spec, args.overrides, tokens, seed, args.weights, prefix), end="")
    return 0


def _tune(args: argparse.Namespace) -> int:
    from moec.tune.command import tune_spec

    print(tune_spec(args.spec, args.overrides, args.tokens, args.out), end="")
    return 0


def _init(args: argparse.Namespace) -> int:
    from moec.codegen.write import write_text
    from moec.spec.hf import spec_from_hf, written_by_init

    if args.out == "-":  # the usual name of standard output
        args.out = None
    _refuse_two_names(args.name, args.overrides)
    text = spec_from_hf(
        args.from_hf, args.name, args.overrides, args.out, layer_type=args.layer_type
    )
    if args.out:
        write_text(Path(args.out), text, written_by_init)
        print(f"wrote {shown_path(args.out)}")
    else:
        print(text, end="")
    return 0


def _refuse_two_names(name: str | None, overrides: list[str]) -> None:
    """init's --name and a --set name=... both name the package: one would be dropped."""
    named = [item for item in overrides if item.partition("=")[0].strip() == "name"]
    if name is not None and named:
        raise MoecError(
            [
                problem(
                    "--name",
                    f"names the package, and so does --set {named[-1]}",
                    "one of them",
                    value=name,
                )
            ],
            "moec init",
            kind="usage",
        )


def _schema(args: argparse.Namespace) -> int:
    from moec.codegen.write import write_text
    from moec.resources import schema_path
    from moec.spec.schema import is_moec_schema, schema_text

    if args.out == "-":  # standard output, as for init and explain
        print(schema_text(), end="")
        return 0
    out = Path(args.out) if args.out else schema_path()
    write_text(out, schema_text(), is_moec_schema, make_parents=True, recorded=True)
    print(f"wrote {shown_path(out)}")
    return 0


def whole_number(option: str, text: str, low: int, high: int, command: str) -> int:
    """The integer an option's text writes, from `low` to `high`; else a usage MoecError."""
    numbers = whole_numbers(text)
    value = numbers[0] if numbers and len(numbers) == 1 else None
    if value is None or not low <= value <= high:
        raise MoecError(
            [
                problem(
                    option,
                    f"must be a whole number from {low} to {high}",
                    f"e.g. {option} {max(low, 16) if option == '--tokens' else low}",
                    value=text,
                )
            ],
            command,
            kind="usage",
        )
    return value


def positive_number(option: str, text: str, command: str) -> float:
    """The number from MIN_RATE to MAX_RATE an option's text writes; else a usage MoecError."""
    plain = re.fullmatch(r"([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?", text.strip())  # ASCII
    value = float(text.strip()) if plain else math.nan
    if not (math.isfinite(value) and MIN_RATE <= value <= MAX_RATE):
        raise MoecError(
            [
                problem(
                    option,
                    f"must be a finite number from {MIN_RATE:g} to {MAX_RATE:g}",
                    f"e.g. {option} 3000",
                    value=text,
                )
            ],
            command,
            kind="usage",
        )
    return value


def _eplb(args: argparse.Namespace) -> int:
    from moec.eplb import command

    counts = {
        option: whole_number(f"--{option}", getattr(args, option), low, MAX_COUNT, "moec eplb")
        for option, low in (("ranks", 1), ("nodes", 1), ("redundant", 0), ("groups", 1))
    }
    print(command(args.load, args.out, **counts, replica_choice=args.replica_choice), end="")
    return 0


_COMMANDS = {
    "validate": _validate,
    "explain": _explain,
    "build": _build,
    "run": _run,
    "tune": _tune,
    "init": _init,
    "schema": _schema,
    "eplb": _eplb,
}


if __name__ == "__main__":
    sys.exit(main())
