"""benchmarks/tail_gemm.py (run 97's probe): its kernel, with and without tail items, equals an
fp32 reference on the interpreter for bf16 and fp8_block, so the GPU rows it times are of a
correct GEMM."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def test_tail_gemm_matches_its_reference_on_the_interpreter():
    result = subprocess.run(
        [sys.executable, "tail_gemm.py", "--check"],
        cwd=BENCHMARKS,
        env={**os.environ, "TRITON_INTERPRET": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "bf16 TAIL_M=0", "bf16 TAIL_M=32", "fp8_block TAIL_M=0", "fp8_block TAIL_M=32",
    ]  # fmt: skip
