"""A worker host's files in the state directory's ``workers/`` folder, kept bounded.

Every host incarnation has a log, ``worker-W-I.log`` (its stdout and stderr, opened by the
launcher), and a pid file, ``worker-W-I.pid`` (written by the host, removed when it exits
cleanly). Elastic churn starts hundreds of incarnations a minute, and a host that is killed
leaves its pid file behind: without pruning, 60 s of churn left 565 logs and 551 stale pid files.

- :func:`prune` keeps, per worker slot ``W``, the logs of its newest ``keep`` incarnations and of
  any incarnation whose host still runs, and removes every pid file whose process is gone (or
  whose pid now names a process started after the file was written). A host prunes its own slot
  when it starts; the local launcher prunes the whole folder when pearld starts.
- :class:`LogBound` rotates a host's own log, from the host, once it passes half of
  ``max_bytes``: ``worker-W-I.log`` becomes ``worker-W-I.log.1`` (replacing an older one) and a
  fresh file takes its place on stdout and stderr, so one incarnation holds at most ``max_bytes``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

KEEP = 3  # incarnations whose logs a worker slot keeps
LOG_BYTES = 16 << 20  # what one incarnation's log may hold, its rotated part included
_NAME = re.compile(r"^worker-(\d+)-(\d+)\.(log|log\.1|pid)$")


def log_path(folder: Path, worker: int, incarnation: int) -> Path:
    return folder / f"worker-{worker}-{incarnation}.log"


def pid_path(folder: Path, worker: int, incarnation: int) -> Path:
    return folder / f"worker-{worker}-{incarnation}.pid"


@dataclass(frozen=True, slots=True)
class WorkerFile:
    path: Path
    worker: int
    incarnation: int
    kind: str  # "log", "log.1" or "pid"


def scan(folder: Path) -> list[WorkerFile]:
    """The per-incarnation files in ``folder`` (other files are not ours to touch)."""
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    out = []
    for name in names:
        m = _NAME.match(name)
        if m is not None:
            out.append(
                WorkerFile(path=folder / name, worker=int(m[1]), incarnation=int(m[2]), kind=m[3])
            )
    return out


def write_own(pid_file: Path) -> None:
    """Write this process's pid file whole (a rename): a prune that reads it never sees it
    half-written and takes it for a dead host's."""
    pid_file.parent.mkdir(parents=True, exist_ok=True)
    tmp = pid_file.with_name(f".{pid_file.name}.{os.getpid()}")
    tmp.write_text(f"{os.getpid()}\n")
    os.replace(tmp, pid_file)


def remove_own(pid_file: Path) -> None:
    """Remove this process's pid file, unless another host of the same worker and incarnation
    (a relaunch) has written its own pid there since."""
    with contextlib.suppress(OSError, ValueError):
        if int(pid_file.read_text()) == os.getpid():
            pid_file.unlink()


def host_alive(pid_file: Path) -> bool:
    """Whether the host a pid file names still runs: its pid is live, not a zombie, and not a
    later process that reused the pid (one started after the file was written)."""
    try:
        pid = int(pid_file.read_text())
        written = pid_file.stat().st_mtime
    except (OSError, ValueError):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # someone else's: it exists
    started = _start_time(pid)
    if started is None:
        return True  # no /proc to tell: trust the pid
    state, at = started
    return state != "Z" and at <= written + 1.0  # the host writes its file after it starts


def prune(
    folder: Path,
    worker: int | None = None,
    keep: int = KEEP,
    alive: Callable[[Path], bool] = host_alive,
) -> int:
    """Remove the stale files of worker slot ``worker`` (all slots when None); how many went.

    Kept: the logs of each slot's newest ``keep`` incarnations and of incarnations whose host
    runs (an open log that is unlinked still holds its disk space), and the pid files of hosts
    that run."""
    files = [f for f in scan(folder) if worker is None or f.worker == worker]
    pids = {(f.worker, f.incarnation): f.path for f in files if f.kind == "pid"}
    running = {k for k, p in pids.items() if alive(p)}
    newest: dict[int, set[int]] = {}
    for w in {f.worker for f in files}:
        incs = sorted({f.incarnation for f in files if f.worker == w}, reverse=True)
        newest[w] = set(incs[: max(0, keep)])
    removed = 0
    for f in files:
        key = (f.worker, f.incarnation)
        if f.kind == "pid":
            stale = key not in running
        else:
            stale = key not in running and f.incarnation not in newest[f.worker]
        if stale:
            with contextlib.suppress(FileNotFoundError):
                f.path.unlink()
                removed += 1
    return removed


class LogBound:
    """Rotates this process's log at ``path`` (its stdout and stderr) past ``max_bytes / 2``.

    Does nothing when stdout is not that file (a terminal, a pipe, another file)."""

    def __init__(self, path: Path, max_bytes: int = LOG_BYTES) -> None:
        self.path, self.half = path, max(1, max_bytes // 2)
        self.rotations = 0
        self._failed = False

    def _ours(self) -> bool:
        try:
            out, there = os.fstat(1), os.stat(self.path)
        except OSError:
            return False
        return (out.st_dev, out.st_ino) == (there.st_dev, there.st_ino)

    def check(self) -> bool:
        """Rotate if the log is past its half; True when it did. Never raises."""
        try:
            if os.fstat(1).st_size <= self.half or not self._ours():
                return False
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            os.replace(self.path, self.path.with_name(self.path.name + ".1"))
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.dup2(fd, 1)
                os.dup2(fd, 2)
            finally:
                os.close(fd)
        except OSError as e:
            if not self._failed:  # once: a full disk must not fill the log with this
                log.warning("cannot rotate %s: %s", self.path, e)
                self._failed = True
            return False
        self.rotations += 1
        return True


_TICKS = float(os.sysconf("SC_CLK_TCK")) if hasattr(os, "sysconf") else 100.0


def _start_time(pid: int) -> tuple[str, float] | None:
    """(state, wall-clock start time) of ``pid`` from /proc; None without /proc."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return fields[0], _boot_time() + int(fields[19]) / _TICKS
    except (OSError, IndexError, ValueError):
        return None


def _boot_time() -> float:
    try:
        with open("/proc/stat") as f:
            for line in f:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except OSError:
        pass
    return time.time() - time.monotonic()  # close enough where /proc/stat lacks it


__all__ = [
    "KEEP",
    "LOG_BYTES",
    "LogBound",
    "WorkerFile",
    "host_alive",
    "log_path",
    "pid_path",
    "prune",
    "remove_own",
    "scan",
    "write_own",
]
