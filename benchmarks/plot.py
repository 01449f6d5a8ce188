"""Time against T on log-log axes, each backend beside the floors, from bench_moe.py's JSON.

One panel per run file: the generated layer of the run's package (Triton, DeepGEMM or both,
as the panel's title says; eager, and replayed as a CUDA graph where it was captured), the
torch backend, the design floor and the plan floor (benchmarks/RESULTS.md says what each floor
counts). Needs matplotlib (`pip install -e ".[plot]"`); reading the runs does not.

    python benchmarks/plot.py benchmarks/runs/2026-12-01-run12-bench_fp8_block.json \\
        benchmarks/runs/2026-12-01-run12-bench_fp8_block_deep_gemm.json \\
        benchmarks/runs/2026-12-01-run12-bench_fp8_block_auto.json -o benchmarks/figures/fp8_block.svg
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

SERIES = {
    "triton_ms": "moec layer, eager",
    "triton_graph_ms": "moec layer, CUDA graph",
    "torch_ms": "torch backend",
    "design_floor_ms": "design floor",
    "plan_floor_ms": "plan floor",
}
"""Row key of bench_moe.py's JSON -> legend label, in drawing order."""
FLOORS = ("design_floor_ms", "plan_floor_ms")


@dataclass(frozen=True)
class Run:
    """One bench_moe.py result: milliseconds per token count, per series."""

    name: str
    """The file's run, e.g. "2026-11-30-run5"."""
    scheme: str
    device: str
    tokens: list[int]
    series: dict[str, list[float | None]]
    """SERIES key -> ms at each of `tokens` (None: not measured at that T)."""

    @property
    def title(self) -> str:
        return f"{self.scheme}: {self.device}, {self.name}"


def load_run(path: str | Path) -> Run:
    """Read a bench_moe.py JSON file; ValueError if it is not one."""
    path = Path(path)
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list) or not data["rows"]:
        raise ValueError(f"{path}: not a bench_moe.py result (no rows)")
    rows = sorted(data["rows"], key=lambda row: row["tokens"])
    run = re.match(r"\d{4}-\d{2}-\d{2}-run\d+", path.name)
    return Run(
        name=run.group() if run else path.stem,
        scheme=str(data.get("scheme", "?")),
        device=str(data.get("device", "?")),
        tokens=[int(row["tokens"]) for row in rows],
        series={key: [row.get(key) for row in rows] for key in SERIES},
    )


def draw(runs: list[Run], out: Path) -> None:
    """One log-log panel per run, sharing the time axis; written to `out` (.svg or .png)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams["svg.hashsalt"] = "moec"  # the same ids on every run: same bytes, same data
    plt.rcParams["svg.fonttype"] = "none"  # text as text: small, searchable
    figure, axes = plt.subplots(
        1,
        len(runs),
        figsize=(5.2 * len(runs), 4.6),
        sharey=True,
        squeeze=False,
        layout="constrained",
    )
    for ax, run in zip(axes[0], runs, strict=True):
        _panel(ax, run)
    axes[0][0].set_ylabel("time per forward, ms")
    handles, labels = axes[0][0].get_legend_handles_labels()
    figure.legend(
        handles,
        labels,
        loc="outside lower center",
        ncol=min(len(labels), 3 * len(runs)),
        fontsize=8,
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, metadata={"Date": None} if out.suffix == ".svg" else None)
    plt.close(figure)


def _panel(ax, run: Run) -> None:
    """The series of one run on log-log axes, T ticks at the measured token counts."""
    for key, label in SERIES.items():
        points = [
            (t, ms) for t, ms in zip(run.tokens, run.series[key], strict=True) if ms is not None
        ]
        if not points:
            continue
        style = {"linestyle": "--" if key == "design_floor_ms" else ":", "color": "black"}
        if key not in FLOORS:
            style = {"marker": "o", "markersize": 4}
        ax.plot(*zip(*points, strict=True), label=label, **style)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(run.tokens, [str(t) for t in run.tokens])
    ax.minorticks_off()
    ax.set_xlabel("T, tokens")
    ax.set_title(run.title, fontsize=10)
    ax.grid(True, which="major", alpha=0.3)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", help="bench_moe.py JSON files, one panel each")
    parser.add_argument("-o", "--out", required=True, help="figure file (.svg or .png)")
    args = parser.parse_args()
    try:
        runs = [load_run(path) for path in args.runs]
    except (OSError, ValueError) as error:  # json.JSONDecodeError is a ValueError
        print(f"plot.py: {error}", file=sys.stderr)
        return 2
    try:
        import matplotlib  # noqa: F401  (draw imports it; here only to say how to get it)
    except ImportError:
        print('plot.py: needs matplotlib: pip install -e ".[plot]"', file=sys.stderr)
        return 2
    draw(runs, Path(args.out))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
