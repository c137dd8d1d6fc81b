"""Argument types the CLI shares: numbers as an operator types them, in ASCII digits.

Python's ``int()`` also takes other scripts' digits (``"٣"``) and underscores (``"1_000"``): an
id or a count typed that way is more likely a paste error than a number, so it is refused.
"""

from __future__ import annotations

import argparse
import re
from typing import TypeAlias

#: what ``register(subparsers)`` of every sub-command module receives
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"

_INT = re.compile(r"-?[0-9]+", re.ASCII)


def integer(text: str) -> int:
    """An ``int`` in ASCII digits, with an optional leading minus (ranges are the caller's)."""
    s = text.strip()
    if _INT.fullmatch(s) is None:
        shown = s if len(s) <= 40 else s[:37] + "..."
        raise argparse.ArgumentTypeError(
            f"{shown!r} is not an integer in ASCII digits 0-9 (no underscores or other scripts)"
        )
    try:
        return int(s)
    except ValueError:  # more digits than int() converts
        raise argparse.ArgumentTypeError(f"{s[:37]!r}... has too many digits") from None


__all__ = ["Subparsers", "integer"]
