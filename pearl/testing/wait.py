"""Waiting on an observable condition: the one polling loop tests and benchmarks share.

Prefer an event (a barrier ask, a threading.Event) where one exists; poll only what another
process owns (pearld's status, a file, a port).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def poll(pred: Callable[[], T | None], timeout: float, every: float = 0.01) -> T | None:
    """``pred()``'s first truthy value, or None once ``timeout`` seconds have passed."""
    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        if got:
            return got
        if time.monotonic() >= deadline:
            return None
        time.sleep(every)


def wait_until(pred: Callable[[], T | None], timeout: float, what: str, every: float = 0.05) -> T:
    """``pred()``'s first truthy value; AssertionError naming ``what`` after ``timeout`` s."""
    last: list[T | None] = [None]

    def probe() -> T | None:
        last[0] = pred()
        return last[0]

    got = poll(probe, timeout, every)
    if not got:
        raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last[0]!r})")
    return got


__all__ = ["poll", "wait_until"]
