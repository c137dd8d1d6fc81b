"""Named crash points for crash tests: ``PEARL_FAILPOINT=<name>:<n>[,<name>:<n>...]``.

At the n-th time the process reaches point ``name`` it writes one line to stderr and leaves with
``os._exit(EXIT_CODE)``: no ``finally`` blocks, no buffered writes flushed, no ``atexit`` — as
close to a power cut as a process can get while the kernel keeps its page cache.

Points: ``before-write`` and ``before-fsync`` (a batch is about to be written / was written but not
yet made durable), ``after-fsync`` (durable, not yet acknowledged) and ``snapshot-rename`` (the
temporary snapshot file is durable, the rename has not happened).

When the variable is unset, :data:`ACTIVE` is False and callers skip :func:`hit` entirely.
"""

from __future__ import annotations

import os

ENV = "PEARL_FAILPOINT"
EXIT_CODE = 86
POINTS = frozenset({"before-write", "before-fsync", "after-fsync", "snapshot-rename"})

_armed: dict[str, int] = {}  # point -> hit number that crashes
_hits: dict[str, int] = {}
ACTIVE = False


def arm(spec: str | None) -> None:
    """Arm points from a spec like ``"before-fsync:3"``; ``None`` or ``""`` disarms all."""
    global ACTIVE
    armed: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in (spec or "").split(","))):
        name, sep, count = part.partition(":")
        if name not in POINTS or not sep or not count.isdigit() or int(count) < 1:
            raise ValueError(
                f"{ENV}: expected <point>:<n> with n >= 1 and point one of {sorted(POINTS)}, "
                f"got {part!r}"
            )
        armed[name] = int(count)
    _armed.clear()
    _armed.update(armed)
    _hits.clear()
    ACTIVE = bool(armed)


def hit(name: str) -> None:
    """Count one pass through ``name``; exit abruptly if this is the armed pass."""
    if name not in _armed:
        return
    n = _hits.get(name, 0) + 1
    _hits[name] = n
    if n == _armed[name]:
        os.write(2, f"pearl: failpoint {name}:{n} hit, exiting\n".encode())
        os._exit(EXIT_CODE)


arm(os.environ.get(ENV))

__all__ = ["ACTIVE", "ENV", "EXIT_CODE", "POINTS", "arm", "hit"]
