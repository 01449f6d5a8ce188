"""Every shell command of README.md, run as written on the CPU, in a folder holding a copy of
examples/ with `moec` and `python` (this interpreter) first on PATH.

The commands are the lines of the ```sh / ```bash blocks (a line ending in `\\` continues on the
next; `#` lines are comments) and the `$ ` lines of the ```console blocks, whose other lines are
the output the README shows: each of them must be printed. A command exits 0, or the status
EXITS gives it; one that cannot run here is in SKIPPED with its reason, and a key of either that
no README line holds any more fails the test, so neither list outlives its line.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_spec_hf import DEEPSEEK_V3

ROOT = Path(__file__).resolve().parent.parent

SKIPPED = {
    "make demo": "makes .venv and runs the demo (about 70 s): the commands of it are run here",
    "make test": "the test suite itself",
    "make figures": "writes the repository's figures: test_make_figures_draws_the_plan_picture "
    "runs its moec explain",
    "moec tune": "measures Triton tiles on a CUDA GPU",
    "deepseek_v3_fp8.check": "a package built for CUDA: its self-check needs the GPU",
    "v2_lite.toml": "reads the user's model folder /models/DeepSeek-V2-Lite",
    "torchrun": "two ranks: tests/test_readme_ranks.py runs them",
}
"""A distinctive part of a README command that does not run on a CPU -> why."""

EXITS = {"moec validate bad.toml": 2}
"""A distinctive part of a README command -> the exit status the README says it has ("Mistakes
exit 2")."""

FILES = {
    "bad.toml": "\n".join(
        [
            'name = "bad"',
            "",
            "[model]",
            "hidden_sizee = 3",
            'preset = "deepseek-v3"',
            "",
            "[activation]",
            'kind = "silu_clamped"',
            "swiglu_limit = 7.0",
            "alpha = 3.0",
            "",
        ]
    ),
    "path/to/config.json": json.dumps(DEEPSEEK_V3),
}
"""Files the README's commands read that it does not show: the mistaken spec whose messages it
prints, and DeepSeek-V3's published config.json (its MoE keys)."""


def _blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced block."""
    return re.findall(r"^```(\w*)\n(.*?)^```", text, re.S | re.M)


def _commands(text: str) -> list[tuple[str, list[str]]]:
    """(command, output lines the README shows for it) in README order."""
    commands: list[tuple[str, list[str]]] = []
    for language, body in _blocks(text):
        if language in ("sh", "bash"):
            for line in body.replace("\\\n", " ").splitlines():
                if line.strip() and not line.lstrip().startswith("#"):
                    commands.append((line.strip(), []))
        elif language == "console":
            for line in body.splitlines():
                if line.startswith("$ "):
                    commands.append((line[2:].strip(), []))
                elif commands and line.strip() and line.strip() != "...":
                    commands[-1][1].append(line)
    return commands


README = (ROOT / "README.md").read_text(encoding="utf-8")
COMMANDS = _commands(README)


def test_every_listed_command_is_in_the_readme():
    lines = [command for command, _ in COMMANDS]
    for key in [*SKIPPED, *EXITS]:
        assert any(key in line for line in lines), f"no README command holds {key!r} any more"


def test_shell_lines_are_in_marked_blocks():
    """A command in a block without a language would be left out: the README marks it."""
    for language, body in _blocks(README):
        first = body.lstrip().split("\n", 1)[0]
        if not language:
            assert not re.match(r"(\$ |moec |make |python |torchrun )", first), first


def _bin(folder: Path) -> Path:
    """`moec` and `python` of this interpreter and this checkout, as an installed venv has."""
    folder.mkdir()
    for name, run in (("python", ""), ("moec", " -m moec")):
        script = folder / name  # a script, not a link: a venv's python finds its venv by path
        script.write_text(f'#!/bin/sh\nexec "{sys.executable}"{run} "$@"\n', encoding="utf-8")
        script.chmod(0o755)
    return folder


def _env(tmp_path: Path) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env["PATH"] = f"{_bin(tmp_path / 'bin')}{os.pathsep}{env.get('PATH', '')}"
    env["MOEC_CACHE_DIR"] = str(tmp_path / "cache")
    env.pop("TRITON_INTERPRET", None)  # as a user's shell: the README sets it where it is needed
    return env


def test_readme_commands_run(tmp_path):
    work = tmp_path / "work"
    shutil.copytree(ROOT / "examples", work / "examples")
    for name, text in FILES.items():
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).write_text(text, encoding="utf-8")
    env = _env(tmp_path)
    ran = 0
    for command, shown in COMMANDS:
        if any(key in command for key in SKIPPED):
            continue
        expected = next((code for key, code in EXITS.items() if key in command), 0)
        done = subprocess.run(
            ["bash", "-c", command],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        said = done.stdout + done.stderr
        assert done.returncode == expected, f"{command}: exit {done.returncode}\n{said[-2000:]}"
        for line in shown:
            assert line in said.splitlines(), f"{command}: does not print {line!r}\n{said}"
        ran += 1
    assert ran >= 10


def test_make_figures_draws_the_plan_picture(tmp_path):
    """The plan picture in the README is what `make figures` draws today."""
    if shutil.which("make") is None:
        pytest.skip("no make here")
    drawn = tmp_path / "plan.svg"
    recipe = subprocess.run(
        [
            "make",
            "-n",
            "-s",
            "figures",
            f"BIN={tmp_path / 'bin'}",
            "STAMP=",
            f"PLAN_FIGURE={drawn}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    line = next(line for line in recipe.splitlines() if "moec explain" in line)
    env = _env(tmp_path)
    done = subprocess.run(["bash", "-c", line], cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    committed = ROOT / "docs" / "figures" / "plan-deepseek-v3-fp8.svg"
    assert drawn.read_text(encoding="utf-8") == committed.read_text(encoding="utf-8"), (
        "docs/figures/plan-deepseek-v3-fp8.svg is stale: run make figures"
    )
