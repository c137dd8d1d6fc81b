"""Named crash points for crash tests: ``PEARL_FAILPOINT=<name>:<n>[,<name>:<n>...]``.

At the n-th time the process reaches point ``name`` it writes one line to stderr and leaves with
``os._exit(EXIT_CODE)``: no ``finally`` blocks, no buffered writes flushed, no ``atexit`` — as
close to a power cut as a process can get while the kernel keeps its page cache.

Points: ``before-write`` and ``before-fsync`` (a batch is about to be written / was written but not
yet made durable), ``after-fsync`` (durable, not yet acknowledged) and ``snapshot-rename`` (the
temporary snapshot file is durable, the rename has not happened).

When the variable is unset, :data:`ACTIVE` is False and callers skip :func:`hit` entirely.

Disk faults are the other kind: the log's writes, syncs and truncations go through :func:`write`,
:func:`sync` and :func:`truncate`, which raise the ``OSError`` a failing disk raises instead of
exiting. Tests arm them in process with :func:`disk` (``space``: bytes the disk still takes, then
``ENOSPC``, a short write first as the kernel does; ``sync_errno``: the next sync fails, once, as
the kernel reports a writeback error; ``truncate_errno``: every truncation fails). A live process
arms them with ``PEARL_DISK_FAULT=<flag file>``: while the file exists the disk is full (it holds
``full``, or nothing) or fails its syncs (``eio``), so a test can open and close a disk-full window
from outside. When neither is armed, :data:`DISK` is False and the log calls the ``os`` functions
directly.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable

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


# -- disk faults ----------------------------------------------------------------------------------

DISK_ENV = "PEARL_DISK_FAULT"
DISK = False
_space: int | None = None  # bytes the disk still takes (None: no limit)
_sync_errno: int | None = None
_truncate_errno: int | None = None
_flag: str | None = None  # PEARL_DISK_FAULT: armed while this file exists


def disk(
    space: int | None = None, sync_errno: int | None = None, truncate_errno: int | None = None
) -> None:
    """Arm disk faults in this process (all ``None``: a healthy disk again)."""
    global DISK, _space, _sync_errno, _truncate_errno
    if space is not None and space < 0:
        raise ValueError(f"space must be >= 0 bytes, got {space}")
    _space, _sync_errno, _truncate_errno = space, sync_errno, truncate_errno
    DISK = _flag is not None or any(x is not None for x in (space, sync_errno, truncate_errno))


def _flagged() -> str | None:
    """What the flag file says now: ``"full"``, ``"eio"``, or None (no file: a healthy disk)."""
    if _flag is None:
        return None
    try:
        with open(_flag, encoding="ascii", errors="replace") as f:
            word = f.read(16).strip().lower()
    except FileNotFoundError:
        return None
    except OSError:
        return "full"
    return "eio" if word == "eio" else "full"


def _fail(code: int) -> OSError:
    return OSError(code, os.strerror(code))


def write(fd: int, data: memoryview | bytes) -> int:
    """``os.write`` on a disk that may be full: a short write, then ``ENOSPC``."""
    global _space
    if _flagged() == "full":
        raise _fail(errno.ENOSPC)
    if _space is None:
        return os.write(fd, data)
    if _space == 0 or not data:
        if not data:
            return 0
        raise _fail(errno.ENOSPC)
    n = os.write(fd, data[:_space])
    _space -= n
    return n


def sync(fd: int, real: Callable[[int], None]) -> None:
    """``real(fd)`` (fsync or fdatasync) on a disk that may fail it."""
    global _sync_errno
    if _sync_errno is not None:
        code, _sync_errno = _sync_errno, None  # once, as the kernel reports a writeback error
        raise _fail(code)
    if _flagged() == "eio":
        raise _fail(errno.EIO)
    real(fd)


def truncate(fd: int, size: int) -> None:
    """``os.ftruncate`` on a disk that may fail it."""
    if _truncate_errno is not None:
        raise _fail(_truncate_errno)
    os.ftruncate(fd, size)


def arm_disk_flag(path: str | None) -> None:
    """Arm (a path) or disarm (None) the ``PEARL_DISK_FAULT`` flag file."""
    global _flag
    _flag = path or None
    disk(_space, _sync_errno, _truncate_errno)


arm(os.environ.get(ENV))
arm_disk_flag(os.environ.get(DISK_ENV))

__all__ = [
    "ACTIVE",
    "DISK",
    "DISK_ENV",
    "ENV",
    "EXIT_CODE",
    "POINTS",
    "arm",
    "arm_disk_flag",
    "disk",
    "hit",
    "sync",
    "truncate",
    "write",
]
