"""scripts/build_deps.sh on a CPU host: its argument handling and the one-line exit-2 messages for
a wrong source folder or a host without CUDA (no build runs: each case stops before the copy)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "build_deps.sh"


def run(*args, env=None):
    full = {**os.environ, "PYTHON": sys.executable, **(env or {})}
    return subprocess.run(
        ["bash", str(SCRIPT), *args], capture_output=True, text=True, env=full, timeout=60
    )


def one_line_exit_2(proc, *needles):
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("build_deps: "), proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert "Traceback" not in proc.stderr


def test_help_prints_the_usage():
    proc = run("--help")
    assert proc.returncode == 0, proc.stderr
    assert "scripts/build_deps.sh [--prefix DIR]" in proc.stdout
    assert "PREFIX/env.sh" in proc.stdout and "Exit 2" in proc.stdout


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--frobnicate"], ["unknown argument '--frobnicate'", "--help"]),
        (["deep_ep_v2"], ["unknown argument 'deep_ep_v2'"]),
        (["--prefix"], ["--prefix needs a folder"]),
        (["--deep-gemm-src"], ["--deep-gemm-src needs a folder"]),
        (["--jobs"], ["--jobs needs a number"]),
        (["--jobs", "many"], ["--jobs must be a positive integer, not 'many'"]),
        (["--jobs", "0"], ["--jobs must be a positive integer, not '0'"]),
        (["--prefix", ""], ["--prefix is empty"]),
    ],
)
def test_bad_arguments(args, needles):
    one_line_exit_2(run(*args), *needles)


def test_missing_source_folder(tmp_path):
    missing = tmp_path / "nowhere"
    proc = run("--deep-gemm-src", str(missing), "deep_gemm")
    one_line_exit_2(proc, f"DeepGEMM source folder '{missing}' does not exist")


def test_wrong_source_folders(tmp_path):
    # a DeepGEMM checkout without its third-party submodules
    gemm = tmp_path / "DeepGEMM"
    for name in ("setup.py", "deep_gemm/__init__.py", "csrc/python_api.cpp"):
        (gemm / name).parent.mkdir(parents=True, exist_ok=True)
        (gemm / name).write_text("")
    proc = run("--deep-gemm-src", str(gemm), "deep_gemm")
    one_line_exit_2(
        proc, f"'{gemm}' is not a DeepGEMM source tree", "third-party/cutlass/include/cute"
    )
    # DeepGEMM's folder given as DeepEP's
    proc = run("--deep-ep-src", str(gemm), "deep_ep")
    one_line_exit_2(proc, f"'{gemm}' is not a DeepEP source tree", "deep_ep/__init__.py")
    # a source folder for a package not asked for is not looked at: the next problem is CUDA's
    proc = run(
        "--deep-ep-src",
        str(gemm),
        "deep_gemm",
        env={"CUDA_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    one_line_exit_2(proc, "no CUDA toolkit here")


def test_no_cuda_toolkit(tmp_path):
    proc = run(
        "--prefix", str(tmp_path / "p"), env={"CUDA_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    )
    one_line_exit_2(proc, "no CUDA toolkit here", "CUDA host only")
    assert not (tmp_path / "p").exists()  # nothing written before the checks pass


def test_cpu_torch_with_a_toolkit(tmp_path):
    # an nvcc is present (a stand-in), but the interpreter's torch is this CPU build
    nvcc = tmp_path / "cuda" / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text("#!/bin/sh\nexit 0\n")
    nvcc.chmod(0o755)
    if torch.version.cuda:
        pytest.skip("this torch is a CUDA build")
    proc = run("--prefix", str(tmp_path / "p"), env={"CUDA_HOME": str(tmp_path / "cuda")})
    one_line_exit_2(proc, "torch is a CPU build")
    proc = run(env={"CUDA_HOME": str(tmp_path / "cuda"), "PYTHON": "/bin/false"})
    one_line_exit_2(proc, "cannot import torch")
    assert not (tmp_path / "p").exists()
