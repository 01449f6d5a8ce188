"""The overlapped shared experts under narrower decode tiles, against the fused layer.

With experts.shared_experts = "overlapped" the shared MLP runs on a second stream beside the
router, selection and dispatch, with the routed experts' tiles for T. At a few tokens its dense
GEMMs then have N / BLOCK_N programs (64 for DeepSeek-V3's gate/up), too few to stream at the
HBM's rate (run 78: 35.5 us alone against a 10.3 us floor). Here its two GEMMs take swap-AB
tiles of BLOCK_N 16-64 instead (more programs), patched into the built package; each variant's
whole layer is captured in a CUDA graph and replayed in turn with the fused layer's, and the
shared MLP is also timed alone.

    python benchmarks/shared_tiles.py --out $OUT/shared_tiles.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
from functools import partial
from pathlib import Path

import torch
from common import dump, graphed, held_by, import_package, in_turn, per_call_us, plan_stage

VARIANTS = {  # (BLOCK_N, num_stages) of both shared GEMMs, swap-AB
    "n16": (16, 6),
    "n32": (32, 6),
    "n32s4": (32, 4),
    "n64": (64, 6),
}


def narrowed(config: dict, block_n: int, stages: int) -> dict:
    return {**config, "BLOCK_N": block_n, "num_stages": stages, "SWAP_AB": True}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fused", default="bench_v3_fp8_triton")
    parser.add_argument("--overlapped", default="bench_v3_fp8ovl_triton")
    parser.add_argument("--tokens", default="1,4,16")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    fused, overlapped = import_package(args.fused), import_package(args.overlapped)
    shared = sys.modules[f"{overlapped.__name__}.triton_shared"]
    built_mlp = shared.shared_mlp
    stage = sys.modules[f"{overlapped.__name__}.stages"].shared_expert
    layers = {
        "fused": fused.MoELayer(device="cuda").random_(0),
        "overlapped": overlapped.MoELayer(device="cuda").random_(0),
    }
    held = held_by(layers["overlapped"], plan_stage(overlapped, "shared_expert"))
    hidden = fused.PLAN["choices"]["dims"]["hidden"]
    rows = []
    for tokens in map(int, args.tokens.split(",")):
        x = torch.randn(tokens, hidden, device="cuda").bfloat16()
        reference = layers["fused"](x).float()
        replays = {"fused": graphed(partial(layers["fused"], x))}
        row = {"tokens": tokens}
        for name, variant in [("as built", None), *VARIANTS.items()]:
            if variant is not None:

                def patched(*a, gate_up_config, down_config, variant=variant, **k):
                    return built_mlp(
                        *a,
                        gate_up_config=narrowed(gate_up_config, *variant),
                        down_config=narrowed(down_config, *variant),
                        **k,
                    )

                shared.shared_mlp = patched
            try:
                out = layers["overlapped"](x).float()
                row[f"gap {name}"] = float((out - reference).abs().max() / reference.abs().max())
                row[f"shared alone {name} us"] = round(per_call_us(partial(stage, x, *held)), 2)
                replays[name] = graphed(partial(layers["overlapped"], x))
            except Exception as error:  # a tile that does not compile: a row
                row[f"error {name}"] = repr(error)[:120]
            finally:
                shared.shared_mlp = built_mlp
        for name, samples in in_turn(replays, args.rounds).items():
            row[f"layer {name} ms"] = round(statistics.median(samples), 4)
        rows.append(row)
        print(row, flush=True)
    dump(Path(args.out), {"device": torch.cuda.get_device_name(), "rows": rows})


if __name__ == "__main__":
    main()
