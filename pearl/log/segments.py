"""The on-disk layout of a log directory: marker, lock, segment files, and tail repair.

::

    DIR/PEARL-LOG                      "pearl-log 1": marks the directory as a log, format version
    DIR/LOCK                           flock()ed by the one writer
    DIR/0000000000000001.seg           frames, named by the first sequence number they hold
    DIR/0000000000052817.seg
    DIR/snapshot-0000000000050000.snap
    DIR/repair/0000000000052817.seg.<UTC time>   a torn segment as it was before truncation

Opening scans every segment: frames must verify and sequence numbers must run last + 1 across
segments. Damage at the very end of the last segment with nothing valid after it is a torn write
(:class:`Repair`: back up, truncate, once); any other damage raises :class:`LogCorrupted` naming
the file and byte offset, and nothing is touched.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from pearl.core.errors import LogCorrupted, LogError, LogLocked, NotALog
from pearl.log import framing
from pearl.log.snapshot import fsync_dir

MARKER = "PEARL-LOG"
FORMAT = 1
LOCK = "LOCK"
REPAIR_DIR = "repair"
SUFFIX = ".seg"


def log_dir(path: str) -> str:
    """A pearld state directory stands for the log inside it (``DIR/log``)."""
    inner = os.path.join(path, "log")
    here = os.path.exists(os.path.join(path, MARKER))
    return inner if not here and os.path.exists(os.path.join(inner, MARKER)) else path


@dataclass
class Segment:
    """One segment file and the frames it holds (``size`` bytes of valid frames)."""

    path: Path
    first_seq: int
    last_seq: int
    size: int

    @property
    def count(self) -> int:
        return self.last_seq - self.first_seq + 1


@dataclass(frozen=True, slots=True)
class Repair:
    """A torn tail: the last segment is valid up to ``offset`` of its ``size`` bytes."""

    path: Path
    offset: int
    size: int
    problem: str

    def __str__(self) -> str:
        return (
            f"torn tail in {self.path} at byte offset {self.offset}: {self.problem}, nothing valid "
            f"after it; {self.size - self.offset} bytes to back up and truncate"
        )


def segment_name(first_seq: int) -> str:
    return f"{first_seq:016d}{SUFFIX}"


def _seq_of(name: str) -> int | None:
    stem = name[: -len(SUFFIX)]
    return int(stem) if name.endswith(SUFFIX) and len(stem) == 16 and stem.isdigit() else None


# -- the directory --------------------------------------------------------------------------------


def open_dir(path: Path, create: bool) -> None:
    """Check that ``path`` is a log of a known format; make a new one there if allowed."""
    marker = path / MARKER
    if not path.exists():
        if not create:
            raise NotALog(f"{path}: no such directory (expected a PEARL event log)")
        _mkdirs(path)
    elif not path.is_dir():
        raise NotALog(f"{path}: not a directory (expected a PEARL event log)")
    if not marker.exists():
        if not create:
            raise NotALog(f"{path}: not a PEARL event log (no {MARKER} file)")
        if any(path.iterdir()):
            raise NotALog(
                f"{path}: the directory holds other files and no {MARKER} marker; refusing to "
                "make it a log (use an empty or new directory)"
            )
        _write_marker(path)
    try:
        text = marker.read_text(encoding="ascii", errors="replace").split()
    except OSError as e:
        raise LogError(f"{marker}: cannot read the log marker: {e.strerror}") from None
    if len(text) != 2 or text[0] != "pearl-log" or not text[1].isdigit():
        raise NotALog(f"{marker}: not a PEARL log marker (expected 'pearl-log {FORMAT}')")
    if int(text[1]) != FORMAT:
        raise LogError(f"{path}: log format {text[1]}, this PEARL reads format {FORMAT}")


def _mkdirs(path: Path) -> None:
    try:
        path.mkdir(parents=True)
    except FileExistsError:
        pass
    except OSError as e:
        raise LogError(f"{path}: cannot create the log directory: {e.strerror}") from None
    fsync_dir(path.parent)


def _write_marker(path: Path) -> None:
    tmp = path / (MARKER + ".tmp")
    tmp.write_text(f"pearl-log {FORMAT}\n", encoding="ascii")
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path / MARKER)
    fsync_dir(path)


class DirLock:
    """An exclusive ``flock`` on ``DIR/LOCK``: one writer per log, across processes and objects."""

    def __init__(self, path: Path) -> None:
        lock = path / LOCK
        self._fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self._fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(self._fd)
            raise LogLocked(
                f"{path}: the log is open for writing elsewhere (pid {holder}, see {lock}); stop "
                "that writer or open the log read-only"
            ) from None
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, f"{os.getpid()}\n".encode(), 0)

    def release(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)  # closing the last descriptor drops the flock


# -- segments -----------------------------------------------------------------------------------


def list_segments(path: Path) -> list[tuple[int, Path]]:
    """(first_seq, path) of every segment file, in order."""
    out = []
    for p in path.iterdir():
        if p.name.endswith(SUFFIX):
            seq = _seq_of(p.name)
            if seq is None:
                raise LogCorrupted(f"{p}: segment file name is not a 16-digit sequence number")
            out.append((seq, p))
    return sorted(out)


def create_segment(path: Path, first_seq: int) -> Segment:
    """A new empty segment, its directory entry durable."""
    p = path / segment_name(first_seq)
    os.close(os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    fsync_dir(path)
    return Segment(path=p, first_seq=first_seq, last_seq=first_seq - 1, size=0)


def scan(path: Path, max_record: int = framing.MAX_RECORD) -> tuple[list[Segment], Repair | None]:
    """Verify every segment; return them and the repair the last one needs (if any)."""
    files = list_segments(path)
    segments: list[Segment] = []
    expected = 1
    for i, (first, p) in enumerate(files):
        if first != expected:
            if i == 0:
                raise LogCorrupted(
                    f"{p}: the first segment starts at seq {first}, but a log "
                    f"starts at seq 1 ({segment_name(1)} is missing)"
                )
            raise LogCorrupted(
                f"{p}: segment starts at seq {first}, but {files[i - 1][1].name} ends at seq "
                f"{expected - 1}; expected {segment_name(expected)} (a segment is missing, "
                "misnamed or truncated)"
            )
        buf = p.read_bytes()
        s = framing.scan(buf, first, max_record)
        segments.append(Segment(path=p, first_seq=first, last_seq=s.last_seq, size=s.end))
        expected = s.last_seq + 1
        if s.problem is None:
            continue
        last = i == len(files) - 1
        after = framing.find_frame(buf, s.end + 1, max_record)
        if last and after is None and not s.problem.startswith("sequence"):
            return segments, Repair(path=p, offset=s.end, size=len(buf), problem=s.problem)
        if after is not None:
            why = f"valid records follow at byte offset {after}"
        elif not last:
            why = "later segments follow"
        else:
            why = "a sequence break is never a torn write"
        raise LogCorrupted(
            f"{p}: {s.problem} at byte offset {s.end} (record seq {expected}) and {why}: the "
            "log is damaged before its end and will not be replayed. Restore the directory from "
            "a backup, or copy it aside and cut this file at that offset to keep what precedes it"
        )
    return segments, None


def repair(log_dir: Path, r: Repair) -> Path:
    """Copy the torn segment to ``DIR/repair/`` (durably), then truncate it to ``r.offset``."""
    backup_dir = log_dir / REPAIR_DIR
    with contextlib.suppress(FileExistsError):
        backup_dir.mkdir()
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    backup = backup_dir / f"{r.path.name}.{stamp}"
    shutil.copyfile(r.path, backup)
    with open(backup, "rb") as f:
        os.fsync(f.fileno())
    fsync_dir(backup_dir)
    fsync_dir(log_dir)
    fd = os.open(r.path, os.O_WRONLY)
    try:
        os.ftruncate(fd, r.offset)
        os.fsync(fd)
    finally:
        os.close(fd)
    return backup


__all__ = [
    "FORMAT",
    "MARKER",
    "DirLock",
    "Repair",
    "Segment",
    "create_segment",
    "list_segments",
    "open_dir",
    "repair",
    "scan",
    "segment_name",
]
