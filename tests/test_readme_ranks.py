"""The README's "Several GPUs" commands, run as written (on the CPU: two gloo ranks)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _commands() -> list[list[str]]:
    """The shell lines of the section's fenced block, continuation lines joined."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Several GPUs\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    return [shlex.split(line) for line in block.replace("\\\n", " ").splitlines() if line.strip()]


def test_readme_runs_two_ranks(tmp_path):
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    runners = {
        "moec": [sys.executable, "-m", "moec"],
        "torchrun": [sys.executable, "-m", "torch.distributed.run"],
    }
    commands = _commands()
    assert [command[0] for command in commands] == ["moec", "torchrun"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    outputs = []
    for command in commands:
        done = subprocess.run(
            runners[command[0]] + command[1:],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        outputs.append(done.stdout)
    # the two ranks write to one pipe: their lines may interleave, so find each line's words
    ranks = sorted(re.findall(r"rank \d of 2: \d+ tokens -> \[\d+, \d+\]", outputs[1]))
    assert ranks == ["rank 0 of 2: 8 tokens -> [8, 256]", "rank 1 of 2: 9 tokens -> [9, 256]"]
