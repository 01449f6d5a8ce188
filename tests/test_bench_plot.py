"""benchmarks/plot.py reads bench_moe.py's JSON without matplotlib, and says how to get it."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
RUN5 = BENCHMARKS / "runs" / "2026-11-30-run5-bench_fp8_block.json"


def _plot_module():
    spec = importlib.util.spec_from_file_location("bench_plot", BENCHMARKS / "plot.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_load_run_reads_every_series_of_a_run_file():
    run = _plot_module().load_run(RUN5)
    rows = json.loads(RUN5.read_text())["rows"]
    assert (run.name, run.scheme, run.device) == ("2026-11-30-run5", "fp8_block", "NVIDIA H200")
    assert run.tokens == [1, 16, 64, 256, 1024, 4096, 16384]
    for key in ("triton_ms", "triton_graph_ms", "torch_ms", "design_floor_ms", "plan_floor_ms"):
        assert run.series[key] == [row[key] for row in rows]
    assert run.series["triton_graph_ms"][-2:] == [None, None]  # no CUDA graph past T = 1024
    assert run.title == "fp8_block: NVIDIA H200, 2026-11-30-run5"


def test_every_bench_file_in_runs_loads_and_other_files_are_refused():
    plot = _plot_module()
    for path in sorted((BENCHMARKS / "runs").glob("*.json")):
        data = json.loads(path.read_text())
        if isinstance(data, dict) and "rows" in data:
            assert plot.load_run(path).tokens, path
        else:  # tuned tables, tuner logs, parallel runs
            with pytest.raises(ValueError, match="not a bench_moe.py result"):
                plot.load_run(path)


def _run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], cwd=BENCHMARKS, capture_output=True, text=True, timeout=120
    )


def test_loading_does_not_import_matplotlib():
    done = _run_python(
        "import sys, plot\n"
        f"plot.load_run({str(RUN5)!r})\n"
        "assert 'matplotlib' not in sys.modules, 'loading imported matplotlib'\n"
    )
    assert done.returncode == 0, done.stderr


def test_without_matplotlib_it_says_how_to_get_it(tmp_path):
    done = _run_python(
        "import sys\n"
        "sys.modules['matplotlib'] = None  # what an environment without it imports\n"
        f"sys.argv = ['plot.py', {str(RUN5)!r}, '-o', {str(tmp_path / 'f.svg')!r}]\n"
        "import plot\n"
        "sys.exit(plot.main())\n"
    )
    assert done.returncode == 2
    assert done.stderr.strip() == 'plot.py: needs matplotlib: pip install -e ".[plot]"'
    assert not (tmp_path / "f.svg").exists()
