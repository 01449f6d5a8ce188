"""Progress on stderr: drawn on a terminal (a pseudo-terminal here), nothing on a pipe, for
`moec run` and for a generated package's random_ and load_weights of a folder."""

from __future__ import annotations

import io
import os
import pty
import re
import sys
import time

import pytest
import torch
from safetensors.torch import save_file

from moec.cli import main
from moec.runtime import progress
from moec.runtime.progress import Progress

TINY = os.path.join(os.path.dirname(__file__), "..", "examples", "tiny-cpu.toml")


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_line_on_a_terminal_only():
    log = io.StringIO()
    with Progress("work", total=3, delay=0, stream=log) as line:
        line.update(1, "a")
    assert log.getvalue() == ""
    terminal = Terminal()
    with Progress("work", total=3, delay=0, stream=terminal) as line:
        for done in range(1, 4):
            line.update(done, f"step {done}")
    text = terminal.getvalue()
    assert text.startswith("\r\033[Kwork: [") and "3/3 step 3" in text
    assert text.endswith("3/3 done (0 s)\n") and text.count("\n") == 1


def test_work_shorter_than_the_delay_draws_nothing():
    terminal = Terminal()
    with Progress("quick", total=2, delay=60, stream=terminal) as line:
        line.update(1, "a")
        line.update(2, "b")
    assert terminal.getvalue() == ""


def test_a_ticking_line_shows_its_seconds_and_the_open_line_is_current():
    terminal = Terminal()
    with Progress("long", delay=0, ticks=True, stream=terminal) as line:
        assert progress.current() is line
        time.sleep(1.3)  # the thread redraws it: 0 s, then 1 s
    assert progress.current() is None
    text = terminal.getvalue()
    assert "\r\033[Klong (0 s)" in text and "\r\033[Klong (1 s)" in text
    assert text.endswith("long: done (1 s)\n")


def _read_all(fd: int) -> str:
    out = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # the pseudo-terminal closed
            break
        if not chunk:
            break
        out += chunk
    return out.decode()


def _stderr_on(kind: str, monkeypatch):
    """sys.stderr on a pseudo-terminal or a pipe; returns (read end, the stream)."""
    reader, writer = pty.openpty() if kind == "terminal" else os.pipe()
    stream = open(writer, "w", encoding="utf-8", closefd=True)  # closed by _done
    monkeypatch.setattr(sys, "stderr", stream)
    assert stream.isatty() == (kind == "terminal")
    return reader, stream


def _done(reader: int, stream) -> str:
    stream.close()
    text = _read_all(reader)
    os.close(reader)
    return text.replace("\r\n", "\n")  # a terminal's newline


@pytest.mark.parametrize("kind", ["terminal", "pipe"])
def test_moec_run_tells_its_steps_on_a_terminal(kind, monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("MOEC_CACHE_DIR", str(tmp_path))
    reader, stream = _stderr_on(kind, monkeypatch)
    assert main(["run", TINY, "--tokens", "2"]) == 0
    said = _done(reader, stream)
    assert "checksum" in capsys.readouterr().out
    if kind == "pipe":
        assert said == ""
    else:
        assert "moec run: [" in said and "building the package" in said
        assert "random weights (seed 0)" in said and "4/4 done" in said and said.endswith("\n")


def _checkpoint(folder) -> None:
    """tiny-cpu's layer as a bf16 checkpoint in two shards (the router and shared expert; the
    routed experts)."""
    generator = torch.Generator().manual_seed(3)

    def weight(*shape):
        return (torch.randn(*shape, generator=generator) / 16).bfloat16()

    common = {"gate.weight": weight(16, 256), "gate.e_score_correction_bias": weight(16).float()}
    experts = {}
    for owner, tensors in [("shared_experts", common)] + [
        (f"experts.{e}", experts) for e in range(16)
    ]:
        for proj, shape in (("gate", (128, 256)), ("up", (128, 256)), ("down", (256, 128))):
            tensors[f"{owner}.{proj}_proj.weight"] = weight(*shape)
    save_file(common, folder / "a.safetensors")
    save_file(experts, folder / "b.safetensors")


@pytest.mark.parametrize("kind", ["terminal", "pipe"])
def test_a_package_draws_its_line_on_a_terminal(kind, load_layer, monkeypatch, tmp_path):
    package = load_layer(TINY)
    # the package's own copy of progress.py (it imports no moec), told to draw at once
    monkeypatch.setattr(package.layer.progress, "DELAY", 0)
    assert package.layer.progress is not progress
    _checkpoint(tmp_path)
    reader, stream = _stderr_on(kind, monkeypatch)
    layer = package.MoELayer(device="cpu").random_(0)
    layer.load_weights(tmp_path)
    said = _done(reader, stream)
    if kind == "pipe":
        assert said == ""
        return
    lines = said.split("\n")
    assert len(lines) == 3 and lines[2] == ""  # two lines, each ended
    assert lines[0].startswith("\r\033[Ktiny_cpu: random weights") and "done" in lines[0]
    assert re.search(r"\b(\d+)/\1 done", lines[0])  # random_ counts the experts it made
    # the folder's shards are counted on the layer's own line: no second line
    assert "tiny_cpu: loading weights: [" in lines[1] and "2/2 b.safetensors" in lines[1]
    assert re.search(r"2/2 done \(\d+ s\)$", lines[1])


def test_a_terminal_that_goes_away_stops_the_line_not_the_work():
    class Gone(Terminal):
        def write(self, text):
            raise OSError(5, "Input/output error")

    with Progress("work", total=2, delay=0, ticks=True, stream=Gone()) as line:
        line.update(1, "a")
        line.update(2, "b")
    assert not line.on
