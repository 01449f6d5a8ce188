"""Tune the grouped GEMM tiles per token bucket on the GPU; write moec's tuned table.

For each scheme and T, routes T random tokens to top-8 of the layer's experts (contiguous
layout), times every candidate config of both GEMMs (gate/up: N = 2I, K = H; down: N = H,
K = I) with CUDA events, and checks each candidate's output against an fp32 torch reference on
a sample of rows: a config that is fast and wrong is rejected (FACTS.md: warp specialization
once was). Both GEMMs of a bucket share BLOCK_M (the layout's row padding).

    python benchmarks/tune.py --out $OUT/h200.json          (on the GPU)
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import json
import math
import time
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import torch
from common import DEVICE, TOKENS, import_package, median_ms

PACKAGES = {"fp8_block": "bench_v3_fp8_triton", "bf16": "bench_v3_bf16_triton"}


def candidates(tokens: int, experts: int, top_k: int) -> list[dict]:
    """Configs worth timing at this T: small M tiles for decode (plain, or TMA with one program
    per tile), large tiles for prefill (TMA persistent, with and without warp specialization)."""
    rows_per_expert = tokens * top_k / experts
    grid = []  # (BLOCK_M, BLOCK_N, warps, stages, extra)
    if rows_per_expert <= 2:
        grid += [(16, bn, 4, stages, {}) for bn in (32, 64, 128) for stages in (4, 6)]
        grid += [(16, bn, 4, stages, {"SWAP_AB": True}) for bn in (64, 128) for stages in (4, 6)]
        grid += [
            (16, bn, 4, stages, {"TMA": True, "PROGRAMS": 4096})
            for bn in (32, 64)
            for stages in (4, 6)
        ]
    elif rows_per_expert <= 40:
        grid += [(bm, bn, 4, 3, {}) for bm in (16, 32, 64) for bn in (64, 128)]
        grid += [
            (bm, bn, 4, stages, {"SWAP_AB": True})
            for bm in (16, 32)
            for bn in (64, 128)
            for stages in (3, 4)
        ]
        grid += [(bm, 128, 4, 4, {"TMA": True}) for bm in (16, 32, 64)]
        grid += [(bm, 64, 4, 4, {"TMA": True, "PROGRAMS": 8192}) for bm in (16, 32)]
    else:
        grid += [
            (64, 128, 4, 3, {}),
            (64, 128, 4, 3, {"TMA": True}),
            (64, 128, 4, 4, {"TMA": True}),
        ]
        grid += [(128, 128, 8, 3, {}), (128, 128, 8, 4, {})]
        grid += [(128, 128, 8, stages, {"TMA": True}) for stages in (3, 4)]
        grid += [(128, 128, 8, stages, {"TMA": True, "WARP_SPECIALIZE": True}) for stages in (3, 4)]
        grid += [(64, 128, 8, 4, {"TMA": True, "WARP_SPECIALIZE": True})]
    configs = []
    for bm, bn, warps, stages, extra in grid:
        config = {
            "BLOCK_M": bm,
            "BLOCK_N": bn,
            "BLOCK_K": 128,
            "GROUP_SIZE_M": 8,
            "num_warps": warps,
            "num_stages": stages,
            **extra,
        }
        configs.append(config)
    return configs


def routing(tokens: int, experts: int, top_k: int, block_m: int, device):
    """Uniform random top-k experts per token -> contiguous layout (m_indices, num_rows)."""
    ids = torch.rand(tokens, experts, device=device).topk(top_k, dim=-1).indices.flatten()
    counts = torch.bincount(ids, minlength=experts)
    padded = (counts + block_m - 1) // block_m * block_m
    assignments = tokens * top_k
    nonempty = min(assignments, experts)
    rows = block_m * (nonempty + (assignments - nonempty) // block_m)
    starts = torch.cumsum(padded, 0) - padded
    order = torch.argsort(ids, stable=True)
    rank = torch.arange(assignments, device=device) - (torch.cumsum(counts, 0) - counts)[ids[order]]
    m_indices = torch.full((rows,), -1, dtype=torch.int32, device=device)
    m_indices[starts[ids[order]] + rank] = ids[order].to(torch.int32)
    return m_indices, padded.sum().reshape(1).to(torch.int32)


def reference(a, a_scale, w, w_scale, m_indices, sample, scheme):
    """fp32 rows `sample` of the grouped GEMM, from dequantized operands."""
    out = []
    for row in sample.tolist():
        e = int(m_indices[row])
        if scheme == "bf16":
            out.append(w[e].float() @ a[row].float())
            continue
        wd = (
            w[e].float()
            * w_scale[e]
            .repeat_interleave(128, 0)[: w.shape[1]]
            .repeat_interleave(128, 1)[:, : w.shape[2]]
        )
        ad = a[row].float() * a_scale[row].repeat_interleave(128)[: a.shape[1]]
        out.append(wd @ ad)
    return torch.stack(out)


def kernels_of(package) -> SimpleNamespace:
    """The launchers of a built Triton package, act_quant bound to its activation."""

    def module(name):
        return importlib.import_module(f"{package.__name__}.{name}")

    return SimpleNamespace(
        grouped_gemm=module("triton_gemm").grouped_gemm,
        permute_quant=module("triton_permute").permute_quant,
        act_quant=partial(
            module("triton_act").act_quant, activation=module("gated_activation").triton_gated
        ),
        combine=module("triton_combine").combine,
    )


def tune_gemm(kernels, scheme, tokens, n, k, experts, top_k, block_m, configs, device):
    m_indices, num_rows = routing(tokens, experts, top_k, block_m, device)
    rows = m_indices.numel()
    if scheme == "bf16":
        a = torch.randn(rows, k, device=device).bfloat16()
        w = (torch.randn(experts, n, k, device=device) / math.sqrt(k)).bfloat16()
        a_scale = w_scale = None
    else:
        a = torch.randn(rows, k, device=device).to(torch.float8_e4m3fn)
        a_scale = torch.rand(rows, k // 128, device=device) * 0.01 + 0.001
        w = (torch.randn(experts, n, k, device=device) * 50).to(torch.float8_e4m3fn)
        w_scale = torch.rand(experts, -(-n // 128), k // 128, device=device) * 1e-4 + 1e-5
    valid = (m_indices >= 0).nonzero().flatten()
    sample = valid[torch.randperm(valid.numel(), device=device)[:64]]
    expected = reference(a, a_scale, w, w_scale, m_indices, sample, scheme)
    out = torch.empty(rows, n, device=device, dtype=torch.bfloat16)
    kind = "bf16" if scheme == "bf16" else "fp8_block"
    results = []
    for config in configs:
        if config["BLOCK_M"] != block_m:
            continue
        call = partial(
            kernels.grouped_gemm,
            a,
            a_scale,
            w,
            w_scale,
            out,
            scheme=kind,
            config=config,
            m_indices=m_indices,
            num_rows=num_rows,
        )
        try:
            out.fill_(float("nan"))
            call()
            (torch.cuda.synchronize() if DEVICE == "cuda" else None)
            got = out[sample].float()
            error = ((got - expected).norm() / expected.norm()).item()
            if not math.isfinite(error) or error > 2**-6:
                results.append((float("inf"), config, f"wrong: error {error:.3g}"))
                continue
            results.append((median_ms(call, warmup=2, repeats=10), config, ""))
        except Exception as failure:  # a config the compiler rejects (e.g. shared memory)
            results.append((float("inf"), config, f"failed: {type(failure).__name__}"))
    return results


def tune_elementwise(kernels, scheme, hidden, inter, device, tokens=4096, top_k=8):
    """Tile sizes of the memory-bound kernels, timed at T = 4096 (T*K rows), where they cost
    most; each candidate checked against the first candidate's bytes."""
    rows = tokens * top_k
    x = torch.randn(tokens, hidden, device=device).bfloat16()
    token_of_row = torch.randint(0, tokens, (rows,), device=device, dtype=torch.int32)
    h = torch.randn(rows, 2 * inter, device=device).bfloat16()
    y = torch.randn(rows, hidden, device=device).bfloat16()
    row_of = torch.randperm(rows, device=device).view(tokens, top_k).to(torch.int32)
    weights = torch.rand(tokens, top_k, device=device)
    quantized = scheme != "bf16"
    a = torch.empty(
        rows, hidden, device=device, dtype=torch.float8_e4m3fn if quantized else torch.bfloat16
    )
    a_scale = torch.empty(rows, hidden // 128, device=device)
    g = torch.empty(rows, inter, device=device, dtype=a.dtype)
    g_scale = torch.empty(rows, inter // 128, device=device)
    out = torch.empty(tokens, hidden, device=device, dtype=torch.bfloat16)
    quant = "group" if quantized else "none"
    launches = {
        "permute": lambda c: kernels.permute_quant(
            x, token_of_row, a, a_scale if quantized else None, quant=quant, config=c
        ),
        "act": lambda c: kernels.act_quant(
            h, g, g_scale if quantized else None, quant=quant, config=c
        ),
        "combine": lambda c: kernels.combine(y, row_of, weights, out, x, config=c),
    }
    outputs = {"permute": a, "act": g, "combine": out}
    widths = {"permute": "BLOCK_H", "act": "BLOCK_I", "combine": "BLOCK_H"}
    rows_key = {"permute": "BLOCK_M", "act": "BLOCK_M", "combine": "BLOCK_T"}
    best = {}
    for name, launch in launches.items():
        results, reference = [], None
        for block_rows, block_cols, warps in itertools.product((1, 4, 8), (1024, 2048), (4, 8)):
            config = {rows_key[name]: block_rows, widths[name]: block_cols, "num_warps": warps}
            try:
                launch(config)
                result = outputs[name].float().clone()
                if reference is None:
                    reference = result
                elif not torch.equal(result, reference):
                    results.append((float("inf"), config))
                    continue
                results.append((median_ms(partial(launch, config), warmup=2, repeats=10), config))
            except Exception:
                results.append((float("inf"), config))
        ms, config = min(results, key=lambda r: r[0])
        print(f"{scheme} {name}: {ms:.4f} ms with {config}", flush=True)
        best[name] = config
    return best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--schemes", default="fp8_block,bf16")
    parser.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    args = parser.parse_args()
    device = torch.device(DEVICE)
    table, log = {}, []
    for scheme in args.schemes.split(","):
        package = import_package(PACKAGES[scheme])
        kernels = kernels_of(package)
        dims = package.PLAN["choices"]["dims"]
        hidden, inter, experts, top_k = (
            dims["hidden"],
            dims["intermediate"],
            dims["local_experts"],
            dims["top_k"],
        )
        buckets = []
        for tokens in map(int, args.tokens.split(",")):
            configs = candidates(tokens, experts, top_k)
            best = None
            for block_m in sorted({c["BLOCK_M"] for c in configs}):
                start = time.time()
                up = tune_gemm(
                    kernels,
                    scheme,
                    tokens,
                    2 * inter,
                    hidden,
                    experts,
                    top_k,
                    block_m,
                    configs,
                    device,
                )
                down = tune_gemm(
                    kernels, scheme, tokens, hidden, inter, experts, top_k, block_m, configs, device
                )
                for name, results in (("gate_up", up), ("down", down)):
                    for ms, config, note in results:
                        log.append(
                            {
                                "scheme": scheme,
                                "tokens": tokens,
                                "gemm": name,
                                "ms": ms,
                                "config": config,
                                "note": note,
                            }
                        )
                up_best, down_best = min(up, key=lambda r: r[0]), min(down, key=lambda r: r[0])
                total = up_best[0] + down_best[0]
                print(
                    f"{scheme} T={tokens} BLOCK_M={block_m}: gate_up {up_best[0]:.4f} ms, down {down_best[0]:.4f} ms ({time.time() - start:.0f} s)",
                    flush=True,
                )
                if best is None or total < best[0]:
                    best = (total, block_m, up_best[1], down_best[1])
            buckets.append(
                {
                    "max_tokens": tokens,
                    "block_m": best[1],
                    "gate_up": best[2],
                    "down": best[3],
                    "ms": round(best[0], 4),
                }
            )
        buckets[-1]["max_tokens"] = None  # the last bucket takes every larger T
        key = f"{scheme}/H{hidden}/I{inter}/E{experts}/K{top_k}"
        table[key] = buckets
        table[f"elementwise/{key}"] = tune_elementwise(kernels, scheme, hidden, inter, device)
    Path(args.out).write_text(json.dumps(table, indent=2) + "\n")
    Path(args.out).with_suffix(".log.json").write_text(json.dumps(log) + "\n")


if __name__ == "__main__":
    main()
