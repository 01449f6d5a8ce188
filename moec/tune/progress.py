"""Progress of a tuning run on stderr: a line when each bucket starts and ends; on a terminal,
also a bar over every candidate of the run, redrawn in place."""

from __future__ import annotations

import sys
import time
from typing import TextIO

BAR_WIDTH = 30


class Progress:
    """Counts candidates out of `total` and prints lines about them."""

    def __init__(self, total: int, stream: TextIO | None = None):
        self.total, self.done = total, 0
        self.stream = stream or sys.stderr
        self.bar = self.stream.isatty()
        self.label = ""
        self.started = time.perf_counter()

    def line(self, text: str) -> None:
        """A line of its own (the bar, if any, redrawn below it)."""
        if self.bar:
            self.stream.write("\r\033[K")
        self.stream.write(text + "\n")
        self._draw()

    def begin(self, label: str, candidates: int) -> None:
        """A step of the run starts: `candidates` trials under `label`."""
        self.label = label
        self.line(f"{label}: {candidates} candidates")

    def step(self) -> None:
        """One candidate is done."""
        self.done += 1
        self._draw()

    def finish(self) -> None:
        if self.bar:
            self.stream.write("\r\033[K")
        self.stream.flush()

    def _draw(self) -> None:
        if not self.bar:
            self.stream.flush()
            return
        filled = BAR_WIDTH * self.done // max(self.total, 1)
        elapsed = time.perf_counter() - self.started
        self.stream.write(
            f"\r\033[K[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {self.done}/{self.total} "
            f"{self.label} ({elapsed:.0f} s)"
        )
        self.stream.flush()
