"""A grouped GEMM that finishes each expert's last rows with a small tile (issue 27's lead).

DeepGEMM's sm90 grouped GEMMs compute every 128-row block whole, so an expert with 140 rows
costs two full blocks (run 94: 23% more time than the same rows in whole blocks at T=4096).
This kernel walks work items instead of row blocks: each expert's rows become full 128-row items
and, when the rows left over are at most TAIL_M, one *tail* item computed as W A^T with the
rows as the MMA's N (wgmma takes N = 16..256), so 12 left-over rows cost a 16- or 32-wide tile,
not a 128-row one. The items of one expert are adjacent in the persistent walk, so the tail's
weight tiles are read while the full items read them (L2). Rows more than TAIL_M past the last
full block take one more 128-row item, as DeepGEMM does.

Probed on the layer's two GEMMs (DeepSeek-V3: gate/up N=4096 K=7168, down N=7168 K=2048; 256
routed experts with the counts of uniform random choices plus the shared expert as group 257
with T rows), bf16 and fp8_block (1x128 activation scales, 128x128 weight scales, each 128-K
partial product promoted to fp32), beside DeepGEMM's psum-layout GEMM on the same operands and
layout; the output is checked against DeepGEMM's. TAIL_M=0 is the same kernel without tail
items (its own rate on whole blocks).

    cd benchmarks && python tail_gemm.py --tokens 2048,4096,16384 --out $OUT/tail_gemm.json
    TRITON_INTERPRET=1 python tail_gemm.py --check    # a small case on the CPU interpreter
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

BLOCK = 128
HIDDEN, INTER, EXPERTS, TOPK = 7168, 2048, 256, 8
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _tile(
    a_desc, w_desc, a_scale_ptr, w_scale_ptr, row0, w_row0, expert, n0, M, K,
    stride_asm, stride_ask, stride_wse, stride_wsn, stride_wsk,
    SCHEME: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SWAP: tl.constexpr, UPCAST: tl.constexpr, WS: tl.constexpr,
):  # fmt: skip
    """One tile over the whole of K: [ROWS, BLOCK_N] fp32, or [BLOCK_N, ROWS] with SWAP (W A^T)."""
    if SWAP:
        acc = tl.zeros((BLOCK_N, ROWS), dtype=tl.float32)
    else:
        acc = tl.zeros((ROWS, BLOCK_N), dtype=tl.float32)
    rows = row0 + tl.arange(0, ROWS)
    offs_n = n0 + tl.arange(0, BLOCK_N)
    ws_expert = w_scale_ptr + expert.to(tl.int64) * stride_wse
    for k0 in tl.range(0, K, BLOCK_K, warp_specialize=WS):
        a = a_desc.load([row0, k0])  # [ROWS, BLOCK_K]
        w = w_desc.load([w_row0 + n0, k0])  # [BLOCK_N, BLOCK_K]
        if UPCAST:  # the interpreter's bf16 / fp8 dot is not the GPU's: fp32 tiles there
            a = a.to(tl.float32)
            w = w.to(tl.float32)
        if SCHEME == "bf16":
            if SWAP:
                acc = tl.dot(w, a.T, acc)
            else:
                acc = tl.dot(a, w.T, acc)
        else:  # fp8_block: each 128-K partial product promoted with its scales
            kb = k0 // 128
            a_s = tl.load(
                a_scale_ptr + rows * stride_asm + kb * stride_ask, mask=rows < M, other=0.0
            )
            if 128 % BLOCK_N == 0:
                w_s = tl.load(ws_expert + (n0 // 128) * stride_wsn + kb * stride_wsk)
                if SWAP:
                    acc += tl.dot(w, a.T, max_num_imprecise_acc=BLOCK_K) * (a_s * w_s)[None, :]
                else:
                    acc += tl.dot(a, w.T, max_num_imprecise_acc=BLOCK_K) * (a_s * w_s)[:, None]
            else:
                w_s = tl.load(ws_expert + (offs_n // 128) * stride_wsn + kb * stride_wsk)
                if SWAP:
                    partial = tl.dot(w, a.T, max_num_imprecise_acc=BLOCK_K)
                    acc += partial * w_s[:, None] * a_s[None, :]
                else:
                    partial = tl.dot(a, w.T, max_num_imprecise_acc=BLOCK_K)
                    acc += partial * a_s[:, None] * w_s[None, :]
    return acc


@triton.jit
def tail_gemm_kernel(
    a_desc,  # [M, K], block [BLOCK_M, BLOCK_K]
    a_tail_desc,  # the same, block [TAIL_M, BLOCK_K]
    w_desc,  # [E * N, K], block [BLOCK_N, BLOCK_K]
    a_scale_ptr, w_scale_ptr, out_ptr,
    item_row0_ptr, item_rows_ptr, item_expert_ptr, item_kind_ptr,  # [items] int32
    num_items, M, N, K,
    stride_om, stride_asm, stride_ask, stride_wse, stride_wsn, stride_wsk,
    SCHEME: tl.constexpr, BLOCK_M: tl.constexpr, TAIL_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, NUM_PROGRAMS: tl.constexpr, UPCAST: tl.constexpr, WS: tl.constexpr,
):  # fmt: skip
    num_pid_n = N // BLOCK_N
    for tile in range(tl.program_id(0), num_items * num_pid_n, NUM_PROGRAMS):
        item = tile // num_pid_n
        n0 = (tile % num_pid_n) * BLOCK_N
        row0 = tl.load(item_row0_ptr + item)
        end = row0 + tl.load(item_rows_ptr + item)
        expert = tl.load(item_expert_ptr + item)
        offs_n = n0 + tl.arange(0, BLOCK_N)
        # each branch's names are its own: Triton types a name set in both branches alike
        if tl.load(item_kind_ptr + item) == 1:
            acc_t = _tile(
                a_tail_desc, w_desc, a_scale_ptr, w_scale_ptr, row0, expert * N, expert, n0, M, K,
                stride_asm, stride_ask, stride_wse, stride_wsn, stride_wsk,
                SCHEME, TAIL_M, BLOCK_N, BLOCK_K, True, UPCAST, WS,
            )  # fmt: skip
            rows_t = row0 + tl.arange(0, TAIL_M)
            ptrs_t = out_ptr + rows_t.to(tl.int64)[None, :] * stride_om + offs_n[:, None]
            tl.store(ptrs_t, acc_t.to(out_ptr.dtype.element_ty), mask=(rows_t < end)[None, :])
        else:
            acc = _tile(
                a_desc, w_desc, a_scale_ptr, w_scale_ptr, row0, expert * N, expert, n0, M, K,
                stride_asm, stride_ask, stride_wse, stride_wsn, stride_wsk,
                SCHEME, BLOCK_M, BLOCK_N, BLOCK_K, False, UPCAST, WS,
            )  # fmt: skip
            rows = row0 + tl.arange(0, BLOCK_M)
            ptrs = out_ptr + rows.to(tl.int64)[:, None] * stride_om + offs_n[None, :]
            tl.store(ptrs, acc.to(out_ptr.dtype.element_ty), mask=(rows < end)[:, None])


def work_items(counts: list[int], starts: list[int], tail_m: int, device) -> list[torch.Tensor]:
    """Each expert's full 128-row items, then its left-over rows as a tail item (at most tail_m
    rows) or one more 128-row item: row0, rows, expert, kind (0 full, 1 tail)."""
    row0, rows, expert, kind = [], [], [], []
    for e, (count, start) in enumerate(zip(counts, starts, strict=True)):
        full, left = divmod(count, BLOCK)
        for b in range(full):
            row0.append(start + b * BLOCK), rows.append(BLOCK), expert.append(e), kind.append(0)
        if left:
            row0.append(start + full * BLOCK), rows.append(left), expert.append(e)
            kind.append(1 if left <= tail_m else 0)
    return [torch.tensor(v, dtype=torch.int32, device=device) for v in (row0, rows, expert, kind)]


def tail_gemm(a, a_scale, w, w_scale, out, items, *, scheme, config, programs):
    """out[r] = A[r] W[e(r)]^T over the work items (see work_items)."""
    num_experts, n, k = w.shape
    bm, tm, bn, bk = (config[key] for key in ("BLOCK_M", "TAIL_M", "BLOCK_N", "BLOCK_K"))
    a_desc = TensorDescriptor.from_tensor(a, [bm, bk])
    tm = max(tm, 16)  # TAIL_M=0: no tail items (work_items), the kernel's tail path unused
    a_tail_desc = TensorDescriptor.from_tensor(a, [tm, bk])
    w_desc = TensorDescriptor.from_tensor(w.view(num_experts * n, k), [bn, bk])
    if scheme == "bf16":
        a_scale = w_scale = a  # not read
        stride_as, stride_ws = (0, 0), (0, 0, 0)
    else:
        stride_as, stride_ws = a_scale.stride(), w_scale.stride()
    tail_gemm_kernel[(programs,)](
        a_desc, a_tail_desc, w_desc, a_scale, w_scale, out, *items,
        items[0].numel(), a.shape[0], n, k,
        out.stride(0), *stride_as, *stride_ws,
        SCHEME=scheme, BLOCK_M=bm, TAIL_M=tm, BLOCK_N=bn, BLOCK_K=bk, NUM_PROGRAMS=programs,
        UPCAST=INTERPRET, WS=config.get("WS", False), num_warps=config["num_warps"], num_stages=config["num_stages"],
    )  # fmt: skip


def aligned_starts(counts: list[int]) -> tuple[list[int], int]:
    """Each group's first row, every group on a 128-aligned row (DeepGEMM's psum layout)."""
    starts, start = [], 0
    for count in counts:
        starts.append(start)
        start = -(-(start + count) // BLOCK) * BLOCK
    return starts, start


def operands(scheme, rows, n, k, groups, device):
    """Random activations and weights (fp8: e4m3 with 1x128 scales MN-major and 128x128 block
    scales, as DeepGEMM's sm90 kernels take them)."""
    a = torch.randn(rows, k, device=device, dtype=torch.bfloat16)
    w = torch.randn(groups, n, k, device=device, dtype=torch.bfloat16)
    if scheme == "bf16":
        return a, None, w, None
    a_scale = torch.rand(k // BLOCK, rows, device=device).add(0.5).t()
    w_scale = torch.rand(groups, n // BLOCK, k // BLOCK, device=device).add(0.5)
    return a.to(torch.float8_e4m3fn), a_scale, w.to(torch.float8_e4m3fn), w_scale


def reference(a, a_scale, w, w_scale, counts, starts):
    """The GEMM in fp32 on the dequantized operands, row by row of each group."""
    out = torch.zeros(a.shape[0], w.shape[1], device=a.device)
    for e, (count, start) in enumerate(zip(counts, starts, strict=True)):
        rows = slice(start, start + count)
        x, we = a[rows].float(), w[e].float()
        if a_scale is not None:
            x = x * a_scale[rows].repeat_interleave(BLOCK, 1)
            we = we * w_scale[e].repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)
        out[rows] = x @ we.T
    return out


def error(out, ref, counts, starts) -> float:
    used = torch.cat([torch.arange(s, s + c) for s, c in zip(starts, counts, strict=True)])
    used = used.to(out.device)
    return ((out[used].float() - ref[used]).abs().max() / ref[used].abs().max()).item()


def check() -> None:
    """A small case on the interpreter: both schemes, tails and partial full items."""
    torch.manual_seed(0)
    counts = [3, 40, 128, 150, 0, 260]
    starts, rows = aligned_starts(counts)
    for scheme in ("bf16", "fp8_block"):
        a, a_s, w, w_s = operands(scheme, rows, 256, 256, len(counts), "cpu")
        ref = reference(a, a_s, w, w_s, counts, starts)
        for tail_m in (0, 32):
            config = dict(BLOCK_M=128, TAIL_M=tail_m, BLOCK_N=128, BLOCK_K=128, num_warps=8,
                          num_stages=3)  # fmt: skip
            out = torch.zeros(rows, 256, dtype=torch.bfloat16)
            items = work_items(counts, starts, tail_m, "cpu")
            tail_gemm(a, a_s, w, w_s, out, items, scheme=scheme, config=config, programs=3)
            err = error(out, ref, counts, starts)
            print(f"{scheme} TAIL_M={tail_m}: max err / max {err:.2e}")
            assert err < 2**-7, err


def timed(fn, repeats: int = 20) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


CONFIGS = {
    "bf16": [
        dict(BLOCK_M=128, TAIL_M=tm, BLOCK_N=bn, BLOCK_K=64, num_warps=8, num_stages=st)
        for bn in (128, 256) for st in (3, 4) for tm in (0, 32, 64)
    ] + [dict(BLOCK_M=128, TAIL_M=tm, BLOCK_N=128, BLOCK_K=64, num_warps=8, num_stages=4, WS=True)
         for tm in (0, 32)],
    "fp8_block": [
        dict(BLOCK_M=128, TAIL_M=tm, BLOCK_N=bn, BLOCK_K=128, num_warps=8, num_stages=st)
        for bn, st in ((128, 4), (128, 5), (256, 3)) for tm in (0, 32, 64)
    ] + [dict(BLOCK_M=128, TAIL_M=tm, BLOCK_N=128, BLOCK_K=128, num_warps=8, num_stages=4, WS=True)
         for tm in (0, 32)],
}  # fmt: skip


def deep_gemm_call(scheme, a, a_s, w, w_s, out, ends):
    import deep_gemm

    if scheme == "bf16":
        return lambda: deep_gemm.m_grouped_bf16_gemm_nt_contiguous(
            a, w, out, ends, use_psum_layout=True
        )
    return lambda: deep_gemm.m_grouped_fp8_gemm_nt_contiguous(
        (a, a_s), (w, w_s), out, ends, disable_ue8m0_cast=True, use_psum_layout=True
    )


def probe(tokens: int, scheme: str, rounds: int, programs: int) -> list[dict]:
    counts = torch.bincount(
        torch.randint(0, EXPERTS, (tokens * TOPK,)), minlength=EXPERTS
    ).tolist() + [tokens]
    starts, rows = aligned_starts(counts)
    ends = torch.tensor([s + c for s, c in zip(starts, counts, strict=True)], dtype=torch.int32,
                        device="cuda")  # fmt: skip
    results = []
    for gemm, (n, k) in {"gate_up": (2 * INTER, HIDDEN), "down": (HIDDEN, INTER)}.items():
        a, a_s, w, w_s = operands(scheme, rows, n, k, len(counts), "cuda")
        ref_out = torch.empty(rows, n, device="cuda", dtype=torch.bfloat16)
        calls = {"deep_gemm": deep_gemm_call(scheme, a, a_s, w, w_s, ref_out, ends)}
        calls["deep_gemm"]()
        outs, errors = {}, {}
        for i, config in enumerate(CONFIGS[scheme]):
            if k % config["BLOCK_K"]:
                continue
            out = torch.zeros(rows, n, device="cuda", dtype=torch.bfloat16)
            items = work_items(counts, starts, config["TAIL_M"], "cuda")

            def call(out=out, items=items, config=config, operands=(a, a_s, w, w_s)):
                tail_gemm(*operands, out, items, scheme=scheme, config=config, programs=programs)

            try:
                call()
                torch.cuda.synchronize()
            except Exception as exc:  # a config that does not compile or fit: say so, go on
                print(f"config {config}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                continue
            errors[i] = error(out, ref_out.float(), counts, starts)
            calls[i], outs[i] = call, out
        samples = {name: [] for name in calls}
        for _ in range(rounds):
            for name, call in calls.items():
                samples[name].append(timed(call))
        best = {name: min(ms) for name, ms in samples.items()}
        useful = sum(counts)
        flops = 2 * useful * n * k
        for name, ms in best.items():
            row = dict(tokens=tokens, scheme=scheme, gemm=gemm, kernel="deep_gemm" if name ==
                       "deep_gemm" else "tail", ms=round(ms, 4),
                       useful_tflops=round(flops / ms / 1e9, 1))  # fmt: skip
            if name != "deep_gemm":
                row.update(config=CONFIGS[scheme][name], err_vs_deep_gemm=errors[name])
            results.append(row)
        fastest = min((n for n in best if n != "deep_gemm"), key=best.get, default=None)
        print(json.dumps(dict(tokens=tokens, scheme=scheme, gemm=gemm,
                              deep_gemm_ms=round(best["deep_gemm"], 4),
                              tail_best_ms=round(best[fastest], 4) if fastest is not None else None,
                              tail_best=CONFIGS[scheme][fastest] if fastest is not None else None,
                              err=errors.get(fastest))), flush=True)  # fmt: skip
        del a, a_s, w, w_s, outs, calls
        torch.cuda.empty_cache()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", default="2048,4096,16384")
    parser.add_argument("--schemes", default="bf16,fp8_block")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--check", action="store_true", help="a small case on the interpreter")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.check:
        return check()
    torch.manual_seed(0)
    programs = torch.cuda.get_device_properties(0).multi_processor_count
    results = []
    for tokens in map(int, args.tokens.split(",")):
        for scheme in args.schemes.split(","):
            results += probe(tokens, scheme, args.rounds, programs)
    if args.out:
        with open(args.out, "w") as handle:
            json.dump({"gpu": torch.cuda.get_device_name(), "rows": results}, handle, indent=2)


if __name__ == "__main__":
    main()
