"""DeepSeek-V4-Flash's routed and hash-routed MoE layers (`moe`, `hash_moe`) on the GPU against transformers' own
block in fp32, bf16 and fp4 experts, at the real dims: H 4096, I 2048, 256 experts, top-6 by
sqrt(softplus) scores with a correction bias, renormalized x1.5, SwiGLU clamped at 10 (the
shared expert's too), one shared expert.

Random weights of realistic scale are loaded into each package under DeepSeek's checkpoint
names (`gate.weight`, `gate.bias`, `experts.{e}.w1/w3/w2.weight` with `.scale`, as the V4
checkpoints store them): bf16 values for the bf16 package; packed e2m1 with 1x32 power-of-two
scales (and an fp8 128x128 shared expert) for the fp4 one. The fp32 oracle holds the same
values, exactly (a bf16, e2m1 x 2^k or e4m3 x scale value is an fp32 one):
transformers.models.deepseek_v4's DeepseekV4SparseMoeBlock where transformers (>= 5.24) is
importable, else this file's `replica`, line for line transformers 5.24's block (the output
says which). For T in {1, ..., 16384}: the norm-wise error against the oracle over the tokens
whose experts both choose, the tokens whose choice differs (a near tie of scores, within the rounding
of the bf16x3 router's sums, is the only cause), the time (CUDA graph replay where graph safe)
and the plan's floor.

Packages (built beforehand, from the repo root):
    moec build examples/deepseek-v4-flash.toml -o benchmarks/.packages --set name=bench_v4_mxfp4_triton \
        --set experts.gemm_backend=triton
    moec build examples/deepseek-v4-flash.toml -o benchmarks/.packages --set name=bench_v4_bf16_triton \
        --set experts.gemm_backend=triton --set quant.scheme=bf16 --set quant.shared_scheme=bf16
and the same two from examples/deepseek-v4-flash-hash.toml (the hash_moe layers, whose forward
takes random token ids here) as bench_v4_hash_mxfp4_triton and bench_v4_hash_bf16_triton.
Run (repo root on PYTHONPATH, as gpu_session.sh sets it):
    cd benchmarks && python v4_layer.py --out $OUT/v4_layer.json
"""

from __future__ import annotations

import argparse
import math
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from common import (
    DEVICE,
    TOKENS,
    chosen_experts,
    dump,
    graph_safe,
    graphed,
    import_package,
    median_ms,
    plan_floors,
)

from moec.runtime import quant

PACKAGES = (
    "bench_v4_bf16_triton",
    "bench_v4_mxfp4_triton",
    "bench_v4_hash_bf16_triton",
    "bench_v4_hash_mxfp4_triton",
)
BOUND = {"bf16": 2**-7, "mxfp4": 2 * 2**-4 + 2**-7}
"""Norm-wise bounds against the fp32 oracle. bf16: the self-check's 2**-7 (bf16 rounds h, the
activation and the output, u = 2**-8 each: docs/numerics.md). fp4: the weights are the oracle's
values exactly, the layer rounds two operands the oracle takes unrounded, x and the activation,
to e4m3 (mxfp8 activations, u = 2**-4 of each element): 2u, plus bf16's 2**-7 (the self-check's
2**-5 + 2**-7 is against the layer's own math, which rounds them alike, not against fp32)."""


def weights(dims: dict, scheme: str, seed: int) -> tuple[dict, dict]:
    """(checkpoint tensors under DeepSeek's names, the fp32 values the oracle holds)."""
    hidden, inter, experts = dims["hidden"], dims["intermediate"], dims["routed_experts"]
    generator = torch.Generator(device=DEVICE).manual_seed(seed)
    shapes = (("w1", (inter, hidden)), ("w3", (inter, hidden)), ("w2", (hidden, inter)))

    def normal(*shape):
        return torch.randn(*shape, generator=generator, device=DEVICE) / math.sqrt(shape[-1])

    def mlp(prefix: str, fp4: bool) -> dict[str, torch.Tensor]:
        """One gated MLP into `checkpoint`; its fp32 values {w1, w3, w2}."""
        held = {}
        for name, shape in shapes:
            w = normal(*shape)
            if fp4:  # e2m1 pairs in bytes, 1x32 power-of-two scales
                packed, scale = quant.quantize_e2m1(w)
                checkpoint[f"{prefix}.{name}.weight"] = packed
                checkpoint[f"{prefix}.{name}.scale"] = scale
                held[name] = quant.unpack_e2m1(packed) * scale.repeat_interleave(32, dim=1)
            elif scheme == "mxfp4":  # V4's fp8 128x128 shared expert beside fp4 experts
                q, scale = quant.quantize_blocks(w, 128, 128, pow2_scales=False)
                checkpoint[f"{prefix}.{name}.weight"] = q
                checkpoint[f"{prefix}.{name}.scale"] = scale
                held[name] = quant.dequantize_blocks(q, scale, 128, 128)
            else:
                checkpoint[f"{prefix}.{name}.weight"] = w.to(torch.bfloat16)
                held[name] = checkpoint[f"{prefix}.{name}.weight"].float()
        return held

    checkpoint = {"gate.weight": normal(experts, hidden)}
    values = {"gate": checkpoint["gate.weight"]}
    if dims["vocab"]:  # a hash layer: top_k distinct experts per token id, no correction bias
        draws = torch.rand(dims["vocab"], experts, generator=generator, device=DEVICE)
        checkpoint["gate.tid2eid"] = values["table"] = draws.argsort(dim=1)[:, : dims["top_k"]]
    else:
        checkpoint["gate.bias"] = 0.02 * torch.randn(experts, generator=generator, device=DEVICE)
        values["bias"] = checkpoint["gate.bias"]
    routed = [mlp(f"experts.{e}", scheme == "mxfp4") for e in range(experts)]
    values["w13"] = torch.stack([torch.cat((w["w1"], w["w3"])) for w in routed])  # [E, 2I, H]
    values["w2"] = torch.stack([w["w2"] for w in routed])  # [E, H, I]
    del routed
    values.update({f"shared_{name}": w for name, w in mlp("shared_experts", False).items()})
    return checkpoint, values


def oracle(dims: dict, values: dict, limit: float, scaling: float, which: str):
    """(transformers' block, or the replica, as a function of (fp32 x [T, H], token ids [T]) ->
    (out, ids); which one). `which`: auto (transformers where importable), transformers or
    replica."""
    if which == "replica":
        return partial(
            replica, values=values, top_k=dims["top_k"], limit=limit, scaling=scaling
        ), "replica"
    try:
        from transformers import DeepseekV4Config
        from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4SparseMoeBlock
    except ImportError:
        if which == "transformers":
            raise
        return partial(
            replica, values=values, top_k=dims["top_k"], limit=limit, scaling=scaling
        ), "replica"
    config = DeepseekV4Config(
        hidden_size=dims["hidden"],
        moe_intermediate_size=dims["intermediate"],
        n_routed_experts=dims["routed_experts"],
        num_experts_per_tok=dims["top_k"],
        n_shared_experts=1,
        routed_scaling_factor=scaling,
        swiglu_limit=limit,
        num_hidden_layers=1,
        mlp_layer_types=["hash_moe" if dims["vocab"] else "moe"],
        vocab_size=dims["vocab"] or 129280,
    )
    with torch.device("meta"):
        block = DeepseekV4SparseMoeBlock(config, 0)
    state = {
        "gate.weight": values["gate"],
        **({"gate.tid2eid": values["table"]} if dims["vocab"] else {}),
        **({} if dims["vocab"] else {"gate.e_score_correction_bias": values["bias"]}),
        "experts.gate_up_proj": values["w13"],
        "experts.down_proj": values["w2"],
        **{
            f"shared_experts.{proj}.weight": values[f"shared_{name}"]
            for proj, name in (("gate_proj", "w1"), ("up_proj", "w3"), ("down_proj", "w2"))
        },
    }
    block.load_state_dict(state, assign=True)
    block.eval()

    def run(x, token_ids):
        with torch.no_grad():
            if block.is_hash:
                ids = block.gate(x.unsqueeze(0), token_ids.unsqueeze(0))[2]
                return block(x.unsqueeze(0), input_ids=token_ids.unsqueeze(0)).squeeze(0), ids
            ids = block.gate(x.unsqueeze(0))[2]
            return block(x.unsqueeze(0)).squeeze(0), ids

    return run, "transformers DeepseekV4SparseMoeBlock"


def replica(x, token_ids, *, values: dict, top_k: int, limit: float, scaling: float):
    """transformers 5.24's DeepseekV4TopKRouter (or DeepseekV4HashRouter) + DeepseekV4Experts +
    DeepseekV4MLP, in fp32."""
    scores = F.softplus(x @ values["gate"].T).sqrt()  # [T, E]
    if "table" in values:  # hash: tid2eid[input_ids]
        ids = values["table"][token_ids]
    else:
        ids = torch.topk(scores + values["bias"], top_k, dim=-1, sorted=False).indices
    weights = scores.gather(1, ids)
    weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20) * scaling
    out = torch.zeros_like(x)
    for expert in ids.unique():
        rows, position = torch.where(ids == expert)
        gate, up = (x[rows] @ values["w13"][expert].T).chunk(2, dim=-1)
        h = F.silu(gate.clamp(max=limit)) * up.clamp(min=-limit, max=limit)
        out.index_add_(0, rows, (h @ values["w2"][expert].T) * weights[rows, position, None])
    gate, up = x @ values["shared_w1"].T, x @ values["shared_w3"].T
    h = F.silu(gate.clamp(max=limit)) * up.clamp(min=-limit, max=limit)
    return out + h @ values["shared_w2"].T, ids


def run_package(name: str, tokens: list[int], seed: int, which: str) -> list[dict]:
    package = import_package(name)
    dims = package.PLAN["choices"]["dims"]
    scheme = dims["routed"]["scheme"]
    spec = package.SPEC
    limit = spec["activation"]["swiglu_limit"]
    scaling = spec["router"]["routed_scaling_factor"]
    checkpoint, values = weights(dims, scheme, seed)
    layer = package.MoELayer(device=DEVICE).load_weights(checkpoint)
    del checkpoint
    reference, which = oracle(dims, values, limit, scaling, which)
    floors = plan_floors(package)
    print(f"{name}: {scheme} experts against {which} in fp32 (bound {BOUND[scheme]:.4g})")
    print("       T  error(agreeing)  tokens differing     ms    floor ms  x floor")
    rows = []
    for count in tokens:
        generator = torch.Generator(device=DEVICE).manual_seed(seed + count)
        x = torch.randn(count, dims["hidden"], device=DEVICE, generator=generator)
        x = x.to(torch.bfloat16)
        token_ids = None
        extra = {}
        if dims["vocab"]:  # a hash layer's keys
            token_ids = torch.randint(
                0, dims["vocab"], (count,), device=DEVICE, generator=generator
            )
            extra = {"token_ids": token_ids}
        out = layer(x, **extra).float()
        expected, ids = reference(x.float(), token_ids)
        if dims["vocab"]:
            ours = layer.tid2eid[token_ids].long().sort(dim=-1).values
        else:
            ours = chosen_experts(package, layer, x)
        agree = (ours == ids.sort(dim=-1).values).all(dim=-1)
        error = ((out - expected)[agree].norm() / expected[agree].norm()).item()
        run = partial(layer, x, **extra)
        if DEVICE == "cuda" and graph_safe(package):
            run = graphed(run)
        ms = median_ms(run)
        floor = floors.get(count, {}).get("floor_ms", float("nan"))
        status = "ok" if error <= BOUND[scheme] else "OVER THE BOUND"
        print(
            f"  {count:6d}  {error:15.3e}  {int((~agree).sum()):16d}  {ms:7.3f}  {floor:10.4f}  {ms / floor:7.2f}  {status}"
        )
        rows.append(
            dict(
                tokens=count,
                error=error,
                differing=int((~agree).sum()),
                ms=ms,
                floor_ms=floor,
                ok=error <= BOUND[scheme],
            )
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--packages", default=",".join(PACKAGES))
    parser.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--oracle", choices=("auto", "transformers", "replica"), default="auto")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    tokens = [int(t) for t in args.tokens.split(",")]
    results = {}
    for name in args.packages.split(","):
        results[name] = run_package(name, tokens, args.seed, args.oracle)
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
    if args.out:
        gpu = torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu"
        dump(args.out, {"gpu": gpu, "torch": torch.__version__, "results": results})


if __name__ == "__main__":
    main()
