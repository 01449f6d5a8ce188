"""Standard output that its reader may close (`| head`): the exit status and the error of a
failed write, and how to drop what is still buffered. The standard library only: `moec`'s CLI
(which imports no torch) and a generated package's check both use it."""

import os

BROKEN_PIPE = 128 + 13
"""Exit status when the reader of standard output went away: a Unix tool's, killed by SIGPIPE,
and no message."""


class OutputLost(Exception):
    """A write to standard output failed: its errno (None when the OS gave none) and the OS's
    reason."""

    def __init__(self, number: int | None, reason: str) -> None:
        super().__init__(reason)
        self.errno, self.reason = number, reason


def discard(stream) -> None:
    """Point the descriptor of `stream` at /dev/null (as Python's docs advise on a broken pipe):
    what it still buffers is dropped at exit without a second error."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, stream.fileno())
        finally:
            os.close(null)
    except (OSError, ValueError, AttributeError):  # no descriptor (a test's capture): nothing to do
        pass
