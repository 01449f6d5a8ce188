"""A progress line on stderr for long work, drawn only when stderr is a terminal.

One line, redrawn in place (`\\r`): its label, a bar when the work has a count, a note (what it
is doing now) and the seconds since it started; a new note is drawn at once, a count at most every
INTERVAL seconds; closing it draws it a last time and ends it with a newline. Nothing is written
when stderr is not a terminal (a log, a pipe), nor for work that ends within `delay` seconds. A
line that `ticks` is redrawn every INTERVAL seconds by a thread, for work that reports no steps
(its seconds still move).

    with Progress("loading weights", total=len(shards), ticks=True) as line:
        for number, shard in enumerate(shards, start=1):
            ...
            line.update(number, shard)

Work that runs inside an open line reports on it (`current()`) instead of drawing a second one.
"""

import sys
import threading
import time

INTERVAL = 0.2
"""Seconds between two redraws of a line."""
DELAY = 1.0
"""Seconds of work before a line with the default delay is first drawn."""
BAR = 30
"""Characters of the bar."""

_open: list["Progress"] = []
"""The lines entered (`with`) and not yet closed, innermost last."""


def current() -> "Progress | None":
    """The innermost open line, if any."""
    return _open[-1] if _open else None


def _is_terminal(stream) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False


class Progress:
    """A line about `label`'s work: `total` steps (0: not counted)."""

    def __init__(
        self,
        label: str,
        total: int = 0,
        *,
        delay: float | None = None,
        ticks: bool = False,
        on: bool | None = None,
        stream=None,
    ) -> None:
        self.stream = sys.stderr if stream is None else stream
        self.on = _is_terminal(self.stream) if on is None else on
        self.label, self.total, self.done, self.note = label, total, 0, ""
        self.started = time.monotonic()
        self.shown_at = self.started + (DELAY if delay is None else delay)
        self.drawn_at: float | None = None  # when the line was last drawn (None: never)
        self.text = ""  # what it shows
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.ticker = None
        if self.on:
            self._draw(self.started)  # at once when there is no delay
        if self.on and ticks:
            self.ticker = threading.Thread(target=self._tick, name="progress", daemon=True)
            self.ticker.start()

    def update(self, done: int | None = None, note: str | None = None, total: int | None = None):
        """`done` steps of `total` finished; `note` what the work does now."""
        if not self.on:
            return
        with self.lock:
            moved = note is not None and note != self.note
            if total is not None:
                self.total = total
            if done is not None:
                self.done = done
            if note is not None:
                self.note = note
            now = time.monotonic()
            if moved or self.drawn_at is None or now - self.drawn_at >= INTERVAL:
                self._draw(now)

    def close(self, note: str = "done") -> None:
        """The last drawing of the line (if it was ever drawn), ended by a newline."""
        if not self.on:
            return
        self.stop.set()
        if self.ticker is not None:
            self.ticker.join()
        with self.lock:
            if self.drawn_at is not None:
                self.note = note
                self._draw(time.monotonic(), final=True)
            if self.on and self.drawn_at is not None:
                try:
                    self.stream.write("\n")
                    self.stream.flush()
                except (OSError, ValueError):
                    pass
            self.on = False

    def __enter__(self):  # -> this line (typing.Self is Python 3.11)
        _open.append(self)
        return self

    def __exit__(self, kind, error, trace) -> None:
        _open.remove(self)
        self.close("done" if kind is None else "stopped")

    def _tick(self) -> None:
        while not self.stop.wait(INTERVAL):
            with self.lock:
                self._draw(time.monotonic())

    def _draw(self, now: float, final: bool = False) -> None:
        if now < self.shown_at and not final:
            return
        parts = [self.label + (":" if self.total or self.note else "")]
        if self.total:
            filled = BAR * min(self.done, self.total) // self.total
            parts.append(f"[{'#' * filled}{'.' * (BAR - filled)}] {self.done}/{self.total}")
        if self.note:
            parts.append(self.note[:60])
        parts.append(f"({now - self.started:.0f} s)")
        text = " ".join(parts)
        if text != self.text:  # a tick that changes nothing writes nothing
            try:
                self.stream.write("\r\033[K" + text)
                self.stream.flush()
            except (OSError, ValueError):  # stderr went away: the work goes on without its line
                self.on = False
                self.stop.set()
                return
            self.text = text
        self.drawn_at = now
