"""Fuzz the Triton backend against the torch backend on random small valid specs.

    TRITON_INTERPRET=1 .venv/bin/python benchmarks/fuzz_triton.py --seed 0 --cases 50

Each case draws a spec (dims, router, quant scheme, activation, layout, shared experts, dtype),
validates it (a refusal is counted, with its message, not run), builds it twice (experts.
gemm_backend = "triton" and "torch"), fills both with `random_(seed)` and runs the same input
through both. Checks, per case:

- the Triton output is finite and within the bound of tests/test_triton_layer.py, 2**-7 of
  the torch output's norm (both backends implement docs/numerics.md; they differ by fp32
  summation order and one rounding of the output);
- zero tokens give a [0, H] output of the layer's dtype;
- a non-contiguous input (a column slice of a wider tensor, a column-major copy) gives the
  contiguous input's output;
- a repeated call gives the same output, bit for bit;
- a NaN row (where the torch backend keeps it local, i.e. no per-tensor activation scale)
  is NaN in its own output row only, the other rows exactly as without it.

Not part of the test suite (the interpreter is slow: about a second or more a case). Prints a
summary: the cases run, refused and failed, each failure with a one-line repro (the spec as
`--set` overrides of a minimal spec, the token count and the seed).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import moec  # noqa: E402
from moec.errors import MoecError  # noqa: E402
from moec.spec import parse_spec  # noqa: E402

BOUND = 2**-7
"""tests/test_triton_layer.py's bound: one bf16 rounding of the output plus rare one-ulp flips
of a quantized intermediate, relative to the output's norm."""

TOKENS = (0, 1, 2, 3, 5, 7, 9, 13, 17, 31, 33, 47, 65, 130)
SCHEMES = ("bf16", "fp8_per_tensor", "fp8_block", "mxfp8", "mxfp4")


def _dims(rng: random.Random, scheme: str, block_k: int, odd: float) -> tuple[int, int]:
    """(hidden, intermediate) that the scheme's blocks divide, but with probability `odd` any
    size (validation may refuse: counted)."""
    if rng.random() < odd:
        return rng.choice((24, 40, 72, 100, 136)), rng.choice((16, 40, 48, 72, 96))
    if scheme == "fp8_block":
        return block_k * rng.choice((1, 1, 2)), block_k * rng.choice((1, 1, 2))
    if scheme in ("mxfp8", "mxfp4"):
        return 32 * rng.choice((2, 3, 4, 5, 6, 8)), 32 * rng.choice((1, 2, 3, 4, 5))
    return rng.choice((16, 48, 64, 80, 96, 112, 160, 200)), rng.choice((16, 24, 40, 64, 96))


def draw(rng: random.Random, odd: float = 0.1, shared_schemes: float = 0.3) -> dict:
    """A random case: the spec's tables as dicts, the token count, the input's layout."""
    scheme = rng.choice(SCHEMES)
    quant: dict = {"scheme": scheme}
    block_k = 128
    if scheme == "fp8_block":
        if rng.random() < 0.15:
            block = rng.choice((64, 128))
            block_k = block
            quant["weight_block"] = [block, block]
        if rng.random() < 0.3:
            quant["scale_dtype"] = rng.choice(("fp32", "ue8m0"))
    if scheme == "mxfp4":
        quant["checkpoint"] = "quantized"
    elif scheme != "bf16":
        quant["checkpoint"] = rng.choice(("bf16", "quantized"))
    if scheme == "fp8_per_tensor" and quant["checkpoint"] == "quantized" and rng.random() < 0.5:
        quant["activation_scheme"] = "static"
    hidden, inter = _dims(rng, scheme, block_k, odd)

    experts = rng.choice((2, 3, 4, 6, 8, 12, 16))
    method = rng.choice(("greedy", "group_limited_greedy", "noaux_tc", "hash"))
    scoring = rng.choice(("softmax", "sigmoid", "sqrtsoftplus"))
    if method == "noaux_tc" and scoring == "softmax":
        scoring = rng.choice(("sigmoid", "sqrtsoftplus"))
    router: dict = {"scoring_func": scoring, "topk_method": method}
    model: dict = {
        "hidden_size": hidden,
        "moe_intermediate_size": inter,
        "n_routed_experts": experts,
    }
    top_k = rng.randint(1, min(experts, 6))
    if method in ("group_limited_greedy", "noaux_tc"):
        divisors = [d for d in range(1, experts + 1) if experts % d == 0]
        if method == "noaux_tc":
            divisors = [d for d in divisors if d == 1 or experts // d >= 2]
        n_group = rng.choice(divisors)
        topk_group = rng.randint(1, n_group)
        top_k = rng.randint(1, min(6, topk_group * (experts // n_group)))
        router["n_group"] = n_group
        router["topk_group"] = topk_group
    if method == "hash":
        model["vocab_size"] = rng.choice((7, 50, 1000))
    model["num_experts_per_tok"] = top_k
    if rng.random() < 0.5:
        router["norm_topk_prob"] = rng.random() < 0.5
    if rng.random() < 0.5:
        router["routed_scaling_factor"] = rng.choice((0.5, 1.0, 2.5, 16.0))

    shared = rng.choice((0, 0, 1, 1, 2))
    model["n_shared_experts"] = shared
    experts_table: dict = {"layout": rng.choice(("contiguous", "masked", "auto"))}
    if shared:
        experts_table["shared_experts"] = rng.choice(("auto", "separate", "fused", "overlapped"))
        if rng.random() < shared_schemes:
            quant["shared_scheme"] = rng.choice(SCHEMES)
        if experts_table["shared_experts"] == "fused" and rng.random() < 0.7:
            quant.pop("shared_scheme", None)
            quant["shared_scheme"] = scheme

    kind = rng.choice(("silu", "silu", "silu_clamped", "oai_swiglu", "situ"))
    activation: dict = {"kind": kind}
    if kind == "silu_clamped":
        activation["swiglu_limit"] = rng.choice((0.5, 1.0, 10.0))
    elif kind == "oai_swiglu":
        if rng.random() < 0.5:
            activation["limit"] = rng.choice((0.5, 1.0, 7.0))
        if rng.random() < 0.5:
            activation["alpha"] = rng.choice((1.0, 1.702))
    elif kind == "situ":
        activation["beta"] = rng.choice((0.5, 1.0, 4.0))
        activation["linear_beta"] = rng.choice((1.0, 2.0, 8.0))

    dtype = "bfloat16" if rng.random() < 0.6 else "float32"
    if scheme == "bf16" and rng.random() < 0.2:
        dtype = "float16"
    tokens = rng.choice(TOKENS)
    target = {"device": "cpu", "dtype": dtype, "max_num_tokens": max(tokens, 1) * 2}
    return {
        "model": model,
        "router": router,
        "quant": quant,
        "activation": activation,
        "experts": experts_table,
        "target": target,
        "tokens": tokens,
        "seed": rng.randrange(1000),
    }


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, list):
        return "[" + ", ".join(map(_toml_value, value)) + "]"
    return repr(value)


TABLES = ("model", "router", "quant", "activation", "experts", "target")


def spec_text(case: dict, backend: str) -> str:
    lines = ['name = "fuzz_case"']
    for table in TABLES:
        lines.append(f"[{table}]")
        values = dict(case[table])
        if table == "experts":
            values["gemm_backend"] = backend
        lines += [f"{key} = {_toml_value(value)}" for key, value in values.items()]
    return "\n".join(lines) + "\n"


def repro(case: dict) -> str:
    """One line: the case as moec --set overrides (of an empty CPU spec) plus tokens and seed."""
    sets = [
        f"{table}.{key}={_toml_value(value)}"
        for table in TABLES
        for key, value in case[table].items()
    ]
    return f"tokens={case['tokens']} seed={case['seed']} " + " ".join(sets)


DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}


def _input(case: dict, tokens: int, generator: torch.Generator) -> torch.Tensor:
    hidden = case["model"]["hidden_size"]
    return torch.randn(tokens, hidden, generator=generator).to(DTYPES[case["target"]["dtype"]])


def _forward(layer, x, ids):
    return layer(x) if ids is None else layer(x, ids)


def _rel(out: torch.Tensor, expected: torch.Tensor) -> float:
    out, expected = out.double(), expected.double()
    norm = expected.norm().item()
    if norm == 0:
        return out.norm().item()
    return ((out - expected).norm() / norm).item()


def run_case(case: dict, cache: Path) -> list[str]:
    """The problems of one valid case (empty: it passed)."""
    problems = []
    fast_pkg = moec.load(parse_spec(spec_text(case, "triton"), "fuzz.toml"), cache_dir=cache)
    slow_pkg = moec.load(parse_spec(spec_text(case, "torch"), "fuzz.toml"), cache_dir=cache)
    fast = fast_pkg.MoELayer().random_(case["seed"])
    slow = slow_pkg.MoELayer().random_(case["seed"])
    tokens = case["tokens"]
    generator = torch.Generator().manual_seed(case["seed"] + 1)
    x = _input(case, tokens, generator)
    vocab = case["model"].get("vocab_size")
    ids = None
    if vocab is not None:
        id_dtype = torch.int32 if case["seed"] % 2 else torch.int64
        ids = torch.randint(0, vocab, (tokens,), generator=generator, dtype=id_dtype)

    out = _forward(fast, x, ids)
    expected = _forward(slow, x, ids)
    if out.shape != x.shape or out.dtype != x.dtype:
        problems.append(f"output {list(out.shape)} {out.dtype}, input {list(x.shape)} {x.dtype}")
        return problems
    if tokens and not torch.isfinite(expected).all():
        problems.append("torch backend output not finite")
    if tokens and not torch.isfinite(out).all():
        problems.append("triton output not finite")
    error = _rel(out, expected)
    if not error <= BOUND:
        problems.append(f"triton vs torch relative error {error:.3g} > 2**-7")

    empty = _forward(fast, x[:0], None if ids is None else ids[:0])
    if empty.shape != (0, x.shape[1]) or empty.dtype != x.dtype:
        problems.append(f"zero tokens gave {list(empty.shape)} {empty.dtype}")
    if tokens:
        wide = torch.zeros(tokens, 2 * x.shape[1], dtype=x.dtype)
        wide[:, 1::2] = x
        strided = wide[:, 1::2]
        assert not strided.is_contiguous()
        again = _forward(fast, strided, ids)
        if not torch.equal(again, out):
            problems.append(f"non-contiguous input differs from contiguous: {_rel(again, out):.3g}")
        if tokens > 1:
            transposed = x.t().contiguous().t()  # column-major: strides (1, T)
            again = _forward(fast, transposed, ids)
            # float32: the router's torch matmul sums in another order for these strides
            exact = x.dtype != torch.float32
            if not (torch.equal(again, out) if exact else _rel(again, out) <= BOUND):
                problems.append(
                    f"column-major input differs from contiguous: {_rel(again, out):.3g}"
                )
        repeat = _forward(fast, x, ids)
        if not torch.equal(repeat, out):
            problems.append(f"repeated call differs: {_rel(repeat, out):.3g}")
    if tokens >= 2:
        row = tokens // 2
        bad = x.clone()
        bad[row] = float("nan")
        slow_bad = _forward(slow, bad, ids)
        keep = torch.ones(tokens, dtype=torch.bool)
        keep[row] = False
        torch_local = torch.equal(slow_bad[keep], expected[keep])
        fast_bad = _forward(fast, bad, ids)
        if torch_local and not torch.equal(fast_bad[keep], out[keep]):
            problems.append(
                "a NaN row changes other rows (torch backend keeps them): "
                f"{_rel(fast_bad[keep], out[keep]):.3g}"
            )
        if torch_local and not fast_bad[row].isnan().all():
            problems.append("the NaN row's output is not all NaN")
    return problems


def _reason(error: MoecError) -> str:
    problems = getattr(error, "problems", None) or []
    if problems:
        return "; ".join(f"{p.path}: {p.message}" for p in problems)
    return str(error).splitlines()[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cases", type=int, default=20, help="valid cases to run")
    parser.add_argument("--cache", type=Path, default=None, help="build cache folder")
    parser.add_argument("--minutes", type=float, default=None, help="stop after this long")
    parser.add_argument("--odd", type=float, default=0.1, help="P(dims the blocks skip)")
    parser.add_argument("--shared-schemes", type=float, default=0.3, help="P(shared_scheme)")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    cache = args.cache or Path(tempfile.mkdtemp(prefix="moec-fuzz-"))
    refused: Counter[str] = Counter()
    failures: list[tuple[dict, str]] = []
    covered: Counter[str] = Counter()
    ran = drawn = 0
    start = time.monotonic()
    while ran < args.cases:
        if args.minutes is not None and time.monotonic() - start > 60 * args.minutes:
            break
        case = draw(rng, args.odd, args.shared_schemes)
        drawn += 1
        try:
            parse_spec(spec_text(case, "triton"), "fuzz.toml")
            parse_spec(spec_text(case, "torch"), "fuzz.toml")
        except MoecError as error:
            refused[_reason(error)] += 1
            continue
        ran += 1
        began = time.monotonic()
        try:
            problems = run_case(case, cache)
        except Exception as error:  # a crash is a finding
            tail = traceback.format_exc().strip().splitlines()
            problems = [f"crash: {type(error).__name__}: {error}".splitlines()[0]]
            if args.verbose:
                print("\n".join(tail[-12:]), file=sys.stderr)
        for table in ("quant", "router", "activation", "experts"):
            for key, value in case[table].items():
                covered[f"{table}.{key}={value}"] += 1
        covered[f"tokens={case['tokens']}"] += 1
        covered[f"dtype={case['target']['dtype']}"] += 1
        status = "FAIL" if problems else "ok"
        print(
            f"[{ran}] {status} {time.monotonic() - began:.1f}s {repro(case)}",
            flush=True,
        )
        for problem in problems:
            print(f"    {problem}", flush=True)
            failures.append((case, problem))
    print(f"\n{ran} cases run ({drawn} drawn, {sum(refused.values())} refused by validation)")
    if args.verbose:
        print("refusals:")
        for reason, count in refused.most_common():
            print(f"  {count:4d}  {reason}")
        print("covered:")
        for key, count in sorted(covered.items()):
            print(f"  {count:4d}  {key}")
    print(f"{len(failures)} failures")
    for case, problem in failures:
        print(f"  {problem}\n    repro: {repro(case)}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
