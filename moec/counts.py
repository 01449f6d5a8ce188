"""Counts written on the command line (--tokens, --seed): ASCII digits only.

int() also takes "1_000", "+4", " 7" and other scripts' digits; a count a user types is plain
digits, and one the user did not mean is refused rather than read.
"""

from __future__ import annotations

import re

_DIGITS = re.compile(r"[0-9]{1,19}")  # up to 19 digits: every such number fits an int64


def whole_numbers(text: str) -> list[int] | None:
    """The comma-separated whole numbers of `text` (blanks around each allowed), or None when
    any part is not one."""
    parts = [part.strip() for part in text.split(",")]
    if not all(_DIGITS.fullmatch(part) for part in parts):
        return None
    return [int(part) for part in parts]
