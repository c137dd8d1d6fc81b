"""The durable :class:`EventLog`: segment files in a directory, group commit, snapshots.

Group commit (leader/follower): every ``append`` frames its records under the lock and queues
them; the first caller that finds no flush running becomes the leader, writes everything queued
and makes it durable with one ``fdatasync`` outside the lock, then wakes the followers whose
records that flush covered. Callers arriving meanwhile queue up for the next flush, so one sync
covers every record that waited for it. ``group_commit=False`` syncs every record on its own (the
benchmark baseline).

When the last flush carried more appends than are queued now, the new leader yields once before
taking the queue: the writers it just released are about to append again and join this flush
instead of the next (a single writer never waits).

A failed write or sync poisons the log object: the bytes on disk are unknown, so every later call
raises :class:`LogError` and the owner must reopen, which repairs a torn tail.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import msgspec

from pearl.core import events
from pearl.core.errors import LogCorrupted, LogError
from pearl.core.events import Record
from pearl.core.state import ClusterState
from pearl.log import failpoints, framing, segments, snapshot
from pearl.log.base import EventLog
from pearl.log.framing import HEADER_SIZE
from pearl.log.segments import Repair, Segment

SEGMENT_BYTES = 64 << 20
_sync = getattr(os, "fdatasync", os.fsync)  # the file size is data: fdatasync covers appends


def _yield() -> None:
    time.sleep(0)  # releases the GIL and the CPU, so threads about to append get to run


class FileLog(EventLog):
    """A log directory opened for writing (one writer, ``LOCK``ed) or ``readonly``.

    A read-only log takes no lock and changes nothing: a torn tail it finds is reported in
    :attr:`pending_repair` and left alone; a writer repairs it on open and reports it in
    :attr:`repaired`.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        readonly: bool = False,
        create: bool = True,
        group_commit: bool = True,
        segment_bytes: int = SEGMENT_BYTES,
        max_record: int = framing.MAX_RECORD,
        keep_snapshots: int = 3,
    ) -> None:
        self.path = Path(path)
        self.readonly = readonly
        self.group_commit = group_commit
        self.segment_bytes = segment_bytes
        self.max_record = max_record
        self.keep_snapshots = max(1, keep_snapshots)
        self.pending_repair: Repair | None = None
        self.repaired: Repair | None = None
        self.repair_backup: Path | None = None
        self._lock: segments.DirLock | None = None
        self._fd = -1
        self._closed = False
        self._error: str | None = None
        self._cond = threading.Condition(threading.Lock())
        self._snap_lock = threading.Lock()
        self._pending: list[bytes] = []
        self._flushing = False
        self._last_group = 1
        try:
            self._open(create and not readonly)
        except OSError as e:
            self._release()
            raise LogError(f"{self.path}: cannot open the log: {e}") from e
        except BaseException:
            self._release()
            raise

    def _open(self, create: bool) -> None:
        segments.open_dir(self.path, create)
        if not self.readonly:
            self._lock = segments.DirLock(self.path)
        segs, torn = segments.scan(self.path, self.max_record)
        if torn is not None:
            if self.readonly:
                self.pending_repair = torn
            else:
                self.repair_backup = segments.repair(self.path, torn)
                self.repaired = torn
        snaps = self._list_snapshots()
        last = segs[-1].last_seq if segs else 0
        if snaps and snaps[-1] > last:
            raise LogCorrupted(
                f"{self.path / snapshot.file_name(snaps[-1])}: snapshot at seq {snaps[-1]} is "
                f"ahead of the log, which ends at seq {last}"
            )
        if not self.readonly:
            for p in self.path.glob(f"{snapshot.PREFIX}*{snapshot.TMP}"):
                p.unlink()  # a snapshot that crashed before its rename
            if not segs:
                segs = [segments.create_segment(self.path, 1)]
            self._fd = os.open(segs[-1].path, os.O_WRONLY | os.O_APPEND)
        self._segments = segs
        self._snapshots = snaps
        self._durable, self._next = last, last + 1

    # -- appending ----------------------------------------------------------------------------

    @property
    def last_seq(self) -> int:
        return self._durable

    def append(self, records: Sequence[Record]) -> list[int]:
        if not records:
            return []
        payloads = [framing.pack(r, self.max_record) for r in records]
        with self._cond:
            self._check_writable()
            first = self._next
            if not self.group_commit:
                for i, payload in enumerate(payloads):
                    self._next = first + i + 1
                    self._flush_guarded(framing.frame(first + i, payload), first + i)
                return list(range(first, self._next))
            frames = [framing.frame(first + i, p) for i, p in enumerate(payloads)]
            self._pending.append(b"".join(frames))
            self._next = first + len(payloads)
            last = self._next - 1
            while self._durable < last:
                self._check_writable()
                if self._flushing:
                    self._cond.wait()
                else:
                    self._lead()
            return list(range(first, last + 1))

    def _lead(self) -> None:
        """Flush everything queued, with the lock released during the write and the sync."""
        self._flushing = True
        if len(self._pending) < self._last_group:
            # The last flush carried more appends than are queued now: their writers are
            # likely about to append again. Yield once so they join this flush, not the next.
            self._cond.release()
            _yield()
            self._cond.acquire()
        batch, upto = b"".join(self._pending), self._next - 1
        self._last_group = len(self._pending)
        self._pending.clear()
        self._cond.release()
        failure: BaseException | None = None
        new = None
        try:
            new = self._flush(batch, upto)
        except BaseException as e:
            failure = e
        self._cond.acquire()
        self._flushing = False
        if failure is None:
            self._done(len(batch), upto, new)
        else:
            self._poison(failure)
        self._cond.notify_all()
        if failure is not None:
            raise LogError(self._error) from failure

    def _flush_guarded(self, data: bytes, upto: int) -> None:
        try:
            new = self._flush(data, upto)
        except BaseException as e:
            self._poison(e)
            raise LogError(self._error) from e
        self._done(len(data), upto, new)

    def _poison(self, e: BaseException) -> None:
        self._error = f"{self.path}: write failed ({e!r}); reopen the log to repair it"

    def _flush(self, data: bytes, upto: int) -> Segment | None:
        """Write and sync ``data`` (frames through seq ``upto``); the new segment if it rotated.

        Only the one flushing thread runs this; it publishes under the lock via :meth:`_done`.
        """
        if failpoints.ACTIVE:
            failpoints.hit("before-write")
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view) :]
        if failpoints.ACTIVE:
            failpoints.hit("before-fsync")
        _sync(self._fd)
        if failpoints.ACTIVE:
            failpoints.hit("after-fsync")
        if self._segments[-1].size + len(data) < self.segment_bytes:
            return None
        new = segments.create_segment(self.path, upto + 1)
        fd = os.open(new.path, os.O_WRONLY | os.O_APPEND)
        os.close(self._fd)
        self._fd = fd
        return new

    def _done(self, size: int, upto: int, new: Segment | None) -> None:
        """Publish a durable flush (lock held): segment bookkeeping, then the durable seq."""
        seg = self._segments[-1]
        seg.size += size
        seg.last_seq = upto
        if new is not None:
            self._segments.append(new)
        self._durable = upto

    def _check_writable(self) -> None:
        if self._closed:
            raise LogError(f"{self.path}: the log is closed")
        if self.readonly:
            raise LogError(f"{self.path}: the log is open read-only")
        if self._error is not None:
            raise LogError(self._error)

    # -- reading ------------------------------------------------------------------------------

    def read(self, start: int = 1, until: int | None = None) -> Iterator[tuple[int, Record]]:
        with self._cond:
            if self._closed:
                raise LogError(f"{self.path}: the log is closed")
            last = self._durable
            view = [(s.path, s.first_seq, min(s.last_seq, last), s.size) for s in self._segments]
        until = last if until is None else min(until, last)
        return self._read(view, max(start, 1), until)

    def _read(
        self, view: list[tuple[Path, int, int, int]], start: int, until: int
    ) -> Iterator[tuple[int, Record]]:
        cache: dict[bytes, Record] = {}
        for path, first, last, size in view:
            if last < start or size == 0:
                continue
            if first > until:
                return
            buf = self._read_segment(path, size)
            yield from _records(buf, path, first, start, until, size, self.max_record, cache)

    @staticmethod
    def _read_segment(path: Path, size: int) -> bytes:
        try:
            with open(path, "rb") as f:
                buf = f.read(size)
        except OSError as e:
            raise LogError(f"{path}: cannot read segment: {e.strerror}") from None
        if len(buf) < size:
            raise LogCorrupted(f"{path}: segment shrank to {len(buf)} bytes, {size} were verified")
        return buf

    @property
    def segments(self) -> list[Segment]:
        """The segment files as scanned, with what has been appended since (a copy)."""
        with self._cond:
            return [Segment(s.path, s.first_seq, s.last_seq, s.size) for s in self._segments]

    # -- snapshots ----------------------------------------------------------------------------

    def write_snapshot(self, state: ClusterState, extra: dict[str, Any] | None = None) -> None:
        self._check_writable()
        self._check_snapshot(state)
        data = snapshot.encode(state, extra)
        with self._snap_lock:
            snapshot.write_file(self.path, state.seq, data)
            snaps = sorted(set(self._snapshots) | {state.seq})
            for old in snaps[: -self.keep_snapshots]:
                (self.path / snapshot.file_name(old)).unlink(missing_ok=True)
            self._snapshots = snaps[-self.keep_snapshots :]

    def snapshots(self) -> list[int]:
        return list(self._snapshots)

    def read_snapshot(self, seq: int) -> tuple[ClusterState, dict[str, Any] | None]:
        p = self.path / snapshot.file_name(seq)
        try:
            data = p.read_bytes()
        except FileNotFoundError:
            raise LogError(f"{p}: no snapshot at seq {seq}; snapshots: {self._snapshots}") from None
        except OSError as e:
            raise LogError(f"{p}: cannot read snapshot: {e.strerror}") from None
        return snapshot.decode(data, str(p))

    def _list_snapshots(self) -> list[int]:
        seqs = (snapshot.parse_name(p.name) for p in self.path.iterdir())
        return sorted(s for s in seqs if s is not None)

    # -- closing ------------------------------------------------------------------------------

    def close(self) -> None:
        with self._cond:
            self._closed = True
            while self._flushing:
                self._cond.wait()
            self._release()

    def _release(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)
        if self._lock is not None:
            self._lock.release()
            self._lock = None


_CACHE_PAYLOAD = 64  # small payloads repeat (activity and role changes): decode each once
_CACHE_ENTRIES = 4096


def _records(
    buf: bytes,
    path: Path,
    first: int,
    start: int,
    until: int,
    size: int,
    max_record: int,
    cache: dict[bytes, Record],
) -> Iterator[tuple[int, Record]]:
    """Decode the frames of one segment (the replay hot loop, kept flat). Every byte up to
    ``size`` had its CRC checked when the log was opened, or was written by this process, so only
    the framing is re-checked here.

    Records are immutable and decoding is deterministic, so equal small payloads share one
    decoded record through ``cache``.
    """
    mv = memoryview(buf)
    unpack_from, decode = framing.HEADER.unpack_from, events.decode_bytes
    off, expected = 0, first
    while off < size:
        if size - off < HEADER_SIZE:
            raise LogCorrupted(f"{path}: short header at byte offset {off}")
        length, _crc, seq = unpack_from(buf, off)
        stop = off + HEADER_SIZE + length
        if seq >= start:
            if seq > until:
                return
            if seq != expected or not 0 < length <= max_record or stop > size:
                raise _bad(path, mv, off, size, max_record, expected)
            payload = buf[off + HEADER_SIZE : stop]
            record = cache.get(payload)
            if record is None:
                try:
                    record = decode(payload)
                except msgspec.MsgspecError as e:
                    raise LogCorrupted(
                        f"{path}: record seq {seq} at byte offset {off} does not decode: {e}"
                    ) from None
                if length <= _CACHE_PAYLOAD:
                    if len(cache) >= _CACHE_ENTRIES:
                        cache.clear()
                    cache[payload] = record
            yield seq, record
        elif seq != expected or not 0 < length <= max_record or stop > size:
            raise _bad(path, mv, off, size, max_record, expected)
        off, expected = stop, expected + 1


def _bad(
    path: Path, mv: memoryview, off: int, size: int, max_record: int, seq: int
) -> LogCorrupted:
    problem = framing.check(mv, off, size, max_record) or f"sequence break (expected {seq})"
    return LogCorrupted(f"{path}: {problem} at byte offset {off} (record seq {seq})")


__all__ = ["SEGMENT_BYTES", "FileLog"]
