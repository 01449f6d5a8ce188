"""Where a captured layer's time goes between its kernels: each package's layer captured in one
CUDA graph, then (1) its replay timed as prefill_ab times it, with the SM clock and the power
sampled by nvidia-smi meanwhile, and (2) REPLAYS replays profiled back to back (torch.profiler's
trace): per replay the span from the first kernel's start to the last kernel's end, the time
some kernel runs (busy), the idle gaps between kernels and the largest of them, named by the
kernels on either side, and each kernel's time. The question it answers: is a layer slower
than the sum of its kernels (idle GPU between them, or slower kernels while timed), and where.

    python benchmarks/graph_gaps.py --packages bench_v3_fp8_auto --tokens 4096,16384 \
        --out $OUT/gaps.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from functools import partial
from pathlib import Path

import torch
from common import DEVICE, dump, graphed, import_package, median_ms

REPLAYS = 10


def kernel_events(trace: Path) -> list[dict]:
    """The trace's GPU kernels (and memsets / copies), sorted by start: name, start, end (us)."""
    events = json.loads(trace.read_text())["traceEvents"]
    kinds = {"kernel", "gpu_memset", "gpu_memcpy"}
    out = [
        {"name": e["name"][:80], "start": e["ts"], "end": e["ts"] + e["dur"]}
        for e in events
        if e.get("ph") == "X" and e.get("cat") in kinds
    ]
    return sorted(out, key=lambda e: e["start"])


def profiled_replays(replay, count: int) -> list[dict]:
    """`count` replays back to back under the profiler: their kernels, in order."""
    from torch.profiler import ProfilerActivity, profile

    replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(count):
            replay()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as folder:
        trace = Path(folder) / "trace.json"
        prof.export_chrome_trace(str(trace))
        return kernel_events(trace)


def split_replays(kernels: list[dict], per_replay: int) -> list[list[dict]]:
    return [kernels[i : i + per_replay] for i in range(0, len(kernels), per_replay)]


def replay_summary(kernels: list[dict]) -> dict:
    span = kernels[-1]["end"] - kernels[0]["start"]
    busy, covered_to = 0.0, kernels[0]["start"]
    gaps = []
    for before, after in zip(kernels, kernels[1:], strict=False):
        gaps.append((after["start"] - before["end"], before["name"], after["name"]))
    for k in kernels:  # union of kernel intervals (kernels may overlap under PDL)
        start = max(k["start"], covered_to)
        if k["end"] > start:
            busy += k["end"] - start
            covered_to = k["end"]
    gaps.sort(reverse=True)
    return {
        "span_us": round(span, 1),
        "busy_us": round(busy, 1),
        "idle_us": round(span - busy, 1),
        "largest_gaps": [(round(g, 1), a, b) for g, a, b in gaps[:4]],
        "kernels_us": [(k["name"], round(k["end"] - k["start"], 1)) for k in kernels],
    }


def batched_ms(replay, count: int = 10, repeats: int = 5) -> float:
    """Time per replay of `count` replays queued back to back (CUDA events around all of
    them, the GPU idle before): what a replay costs when the host is ahead of the GPU."""
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(count):
            replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / count)
    return statistics.median(times)


def launch_us(replay, repeats: int = 20) -> float:
    """Host time of one replay() call in us (the GPU idle before it), median."""
    host = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        began = time.perf_counter()
        replay()
        host.append((time.perf_counter() - began) * 1e6)
    torch.cuda.synchronize()
    return statistics.median(host)


def sampled_clocks(fn) -> tuple[float, list[tuple[int, float]]]:
    """fn()'s result while nvidia-smi samples (SM MHz, W) every 20 ms."""
    query = ["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits"]
    sampler = subprocess.Popen([*query, "-lms", "20"], stdout=subprocess.PIPE, text=True)
    try:
        result = fn()
    finally:
        sampler.terminate()
        text, _ = sampler.communicate()
    samples = []
    for line in text.splitlines():
        try:
            mhz, watts = (float(v) for v in line.split(","))
            samples.append((int(mhz), watts))
        except ValueError:
            continue
    return result, samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--packages", required=True)
    parser.add_argument("--tokens", default="4096")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    names = args.packages.split(",")
    rows = []
    for name in names:
        package = import_package(name)
        layer = package.MoELayer(device=DEVICE).random_(0)
        hidden = package.PLAN["choices"]["dims"]["hidden"]
        for tokens in [int(t) for t in args.tokens.split(",")]:
            x = torch.randn(tokens, hidden, device=DEVICE).bfloat16()
            replay = graphed(partial(layer, x))
            timed, clocks = sampled_clocks(partial(median_ms, replay, warmup=3, repeats=20))
            batched = batched_ms(replay)
            host_us = launch_us(replay)
            one = profiled_replays(replay, 1)
            many = split_replays(profiled_replays(replay, REPLAYS), len(one))
            summaries = [replay_summary(kernels) for kernels in many]
            alone = replay_summary(one)
            row = {
                "package": name,
                "tokens": tokens,
                "timed_ms": round(timed, 4),
                "batched_ms": round(batched, 4),
                "launch_host_us": round(host_us, 1),
                "clock_mhz": sorted(mhz for mhz, _ in clocks),
                "power_w": sorted(w for _, w in clocks),
                "alone": alone,
                "back_to_back_span_us": statistics.median(s["span_us"] for s in summaries),
                "back_to_back_busy_us": statistics.median(s["busy_us"] for s in summaries),
                "back_to_back_idle_us": statistics.median(s["idle_us"] for s in summaries),
                "back_to_back_kernels_us": summaries[len(summaries) // 2]["kernels_us"],
            }
            rows.append(row)
            mhz = row["clock_mhz"]
            print(
                f"{name} T={tokens}: timed {timed:.4f} ms, {batched:.4f} per replay of 10 "
                f"queued, replay() {host_us:.0f} us on the host; alone span {alone['span_us']} us, "
                f"busy {alone['busy_us']}, idle {alone['idle_us']}; back to back span "
                f"{row['back_to_back_span_us']}, idle {row['back_to_back_idle_us']}; SM MHz "
                f"{mhz[0] if mhz else '?'}..{mhz[-1] if mhz else '?'} over {len(mhz)} samples"
            )
            for gap, before, after in alone["largest_gaps"]:
                print(f"    gap {gap:7.1f} us  {before}  ->  {after}")
            for kernel, us in row["back_to_back_kernels_us"]:
                print(f"    {us:8.1f} us  {kernel}")
            dump(Path(args.out), {"rows": rows, "device": torch.cuda.get_device_name()})
            del replay
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
