"""The copy-free dispatch (the gate/up GEMM gathers each row's token) against the row copy.

One package, built with the gather (the plan's choice); the copying variant calls the same
launchers with gather=False (the dispatch copies each token to its experts' rows, the GEMM
reads them there). For each T: dispatch + gate/up GEMM as 10 calls in one CUDA graph each way,
then the whole layer, one CUDA graph per variant, replayed in turn for ROUNDS rounds (each
variant's time the median of its rounds' medians). The layer's output must not change: the
GEMM's tiles read the same values either way.

    python benchmarks/gather_dispatch.py --tokens 1,256,1024,4096,16384 --out $OUT/gather.json
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
from functools import partial
from pathlib import Path

import torch
from common import (
    dump,
    graphed,
    held_by,
    import_package,
    in_turn,
    per_call_us,
    plan_stage,
    stages_of,
)
from common import route as route_tokens

ROUNDS = 3


@contextlib.contextmanager
def copying(package):
    """The package's dispatch and gate/up GEMM launchers with gather=False."""
    patched = [
        (sys.modules[f"{package.__name__}.triton_dispatch"], "dispatch"),
        (sys.modules[f"{package.__name__}.triton_gemm"], "grouped_gemm_contiguous"),
    ]
    built = {name: getattr(module, name) for module, name in patched}
    for module, name in patched:
        fn = built[name]
        setattr(module, name, lambda *a, fn=fn, **k: fn(*a, **{**k, "gather": False}))
    try:
        yield
    finally:
        for module, name in patched:
            setattr(module, name, built[name])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--package", default="bench_v3_fp8_triton")
    parser.add_argument("--tokens", default="1,256,1024,4096,16384")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    package = import_package(args.package)
    stages = stages_of(package)
    layer = package.MoELayer(device="cuda").random_(0)
    gate_up = held_by(layer, plan_stage(package, "gemm_gate_up"))
    hidden = package.PLAN["choices"]["dims"]["hidden"]
    rows = []
    for tokens in map(int, args.tokens.split(",")):
        x = torch.randn(tokens, hidden, device="cuda").bfloat16()
        _, ids = route_tokens(package, layer, x)

        def dispatch_and_gate_up(x=x, ids=ids):
            a, a_scale, routing = stages.dispatch(x, ids)
            return stages.gemm_gate_up(a, a_scale, routing, *gate_up)

        row = {"tokens": tokens}
        outputs, replays = {}, {}
        for variant in ("gather", "copy"):
            with copying(package) if variant == "copy" else contextlib.nullcontext():
                row[f"dispatch_gate_up_{variant}_us"] = round(per_call_us(dispatch_and_gate_up), 2)
                outputs[variant] = layer(x)
                replays[variant] = graphed(partial(layer, x))
        row["same_output"] = bool(torch.equal(outputs["gather"], outputs["copy"]))
        for variant, samples in in_turn(replays, args.rounds).items():
            row[f"layer_{variant}_ms"] = round(statistics.median(samples), 4)
        rows.append(row)
        print(row, flush=True)
    dump(Path(args.out), {"device": torch.cuda.get_device_name(), "rows": rows})


if __name__ == "__main__":
    main()
