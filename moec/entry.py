"""The `moec` command (its console script and `python -m moec`): moec.cli loaded under a Ctrl-C
guard.

Loading moec.cli and what it imports (pydantic, the spec models) takes a moment; a Ctrl-C then
printed a traceback. Here it ends the command as a Ctrl-C later does (moec.cli.main): exit
status 130, nothing printed. This module imports only the standard library before the guard.
"""

from __future__ import annotations

INTERRUPTED = 130
"""The exit status of a command stopped by Ctrl-C (128 + SIGINT), as moec.cli.main returns."""


def main() -> int:
    """Run the moec command line on sys.argv; a Ctrl-C at any point is exit status 130."""
    try:
        from moec.cli import main as cli_main

        return cli_main()
    except KeyboardInterrupt:
        return INTERRUPTED
