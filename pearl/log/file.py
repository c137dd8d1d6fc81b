"""The durable :class:`EventLog`: segment files in a directory, group commit, snapshots.

Group commit (leader/follower): every ``append`` frames its records under the lock and queues
them; the first caller that finds no flush running becomes the leader, writes everything queued
and makes it durable with one ``fdatasync`` outside the lock, then opens its gate (a plain lock
it held during the flush) and the followers whose records that flush covered return. Callers
arriving meanwhile queue up for the next flush, so one sync covers every record that waited for
it. (The gate replaced a Condition: its wait/notify bookkeeping in Python cost more per append
than the rest of the append.) ``group_commit=False`` syncs every record on its own (the
benchmark baseline).

When the last flush carried more appends than are queued now, the new leader keeps yielding
(a bounded gather window: at most half the last flush's duration, 1 ms at most) until as many
appends are queued or the window closes: the writers it just released are about to append again
and join this flush instead of the next. A single writer never waits.

A failed write or sync leaves the log exactly as it was before the flush: the segment is cut back
to its last durable offset and synced before any caller hears of the failure, every append the
flush carried (and every one queued behind it) raises :class:`LogWriteFailed`, and their sequence
numbers are given again. No record that was not acknowledged is ever replayed. The log stays
usable: once the disk takes writes again, appends succeed with no reopen. Only when the cut
itself fails are the bytes on disk unknown: the object is then poisoned (every call raises
:class:`LogError`) until :meth:`FileLog.reopen` cuts the tail it knows was never acknowledged.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from pearl.core.errors import LogCorrupted, LogError, LogWriteFailed
from pearl.core.events import Record
from pearl.core.state import ClusterState
from pearl.log import failpoints, framing, reader, segments, snapshot
from pearl.log.base import EventLog
from pearl.log.segments import Repair, Segment

log = logging.getLogger(__name__)

SEGMENT_BYTES = 64 << 20
GATHER_MAX_S = 1e-3  # longest gather window of a group-commit leader
_sync = getattr(os, "fdatasync", os.fsync)  # the file size is data: fdatasync covers appends


def _write(fd: int, data: memoryview) -> int:
    return failpoints.write(fd, data) if failpoints.DISK else os.write(fd, data)


def _sync_fd(fd: int) -> None:
    if failpoints.DISK:
        failpoints.sync(fd, _sync)
    else:
        _sync(fd)


def _truncate(fd: int, size: int) -> None:
    if failpoints.DISK:
        failpoints.truncate(fd, size)
    else:
        os.ftruncate(fd, size)


def _why(e: BaseException) -> str:
    if isinstance(e, OSError) and e.strerror:
        return f"{e.strerror} ({errno.errorcode.get(e.errno or 0, e.errno)})"
    return repr(e)


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
        self._error: str | None = None  # set when the bytes on disk are unknown (poisoned)
        # Bumped by every failed flush: an append queued under an older epoch was not logged.
        self._epoch = 0
        self._failure = ""  # why the last flush failed: what those appends raise
        self._mu = threading.Lock()  # guards the queue, the sequence numbers and the segments
        self._gate: threading.Lock | None = None  # held by the leader while its flush runs
        self._snap_lock = threading.Lock()
        self._pending: list[bytes] = []
        self._last_group = 1
        self._sync_s = 0.0  # how long the last flush took (write + sync)
        # Told the seconds of every data sync (pearld's metrics); called by the flushing thread.
        self.on_sync: Callable[[float], None] | None = None
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
        pack, max_record = framing.pack, self.max_record
        payloads = [pack(r, max_record) for r in records]
        mu = self._mu
        mu.acquire()
        try:
            self._check_writable()
            first, epoch = self._next, self._epoch
            if not self.group_commit:
                for i, payload in enumerate(payloads):
                    self._next = first + i + 1
                    self._flush_one(framing.frame(first + i, payload), first + i)
                    if self._epoch != epoch:
                        self._failed(first, first + i - 1)
                return list(range(first, self._next))
            frame = framing.frame
            self._pending.append(b"".join([frame(first + i, p) for i, p in enumerate(payloads)]))
            last = self._next = first + len(payloads)
            last -= 1
            while self._durable < last:
                if self._epoch != epoch:
                    self._failed(first, first - 1)
                self._check_writable()
                gate = self._gate
                if gate is None:
                    self._lead()
                else:  # a flush is running: wait for it outside the lock, then look again
                    mu.release()
                    gate.acquire()
                    gate.release()
                    mu.acquire()
            return list(range(first, last + 1))
        finally:
            mu.release()

    def _failed(self, first: int, kept: int) -> None:
        """Raise for an append whose records from ``first`` on were not logged (``_mu`` held);
        ``kept``: the last of its records a single-record flush made durable before."""
        if kept >= first:  # group_commit=False: the records before the failed one are durable
            raise LogWriteFailed(f"{self._failure} (its records {first}..{kept} were logged)")
        raise LogWriteFailed(self._failure)

    def _lead(self) -> None:
        """Flush everything queued (``_mu`` held on entry and exit, released during the write
        and the sync). Followers wait on the leader's gate, a plain lock it releases when the
        flush is published or undone: one C-level handoff per follower."""
        gate = self._gate = threading.Lock()
        gate.acquire()
        self._gather()
        batch, upto = b"".join(self._pending), self._next - 1
        self._last_group = len(self._pending)
        self._pending.clear()
        self._mu.release()
        failure: BaseException | None = None
        new = None
        try:
            t0 = time.perf_counter()
            new = self._flush(batch, upto)
            self._sync_s = time.perf_counter() - t0
        except BaseException as e:
            failure = e
        self._mu.acquire()
        try:
            if failure is None:
                self._done(len(batch), upto, new)
            else:
                self._undo(failure)
        finally:
            self._gate = None
            gate.release()

    def _gather(self) -> None:
        """The bounded gather window (``_mu`` held): while fewer appends are queued than the last
        flush carried, yield so the writers it released can append again and join this flush.
        It lasts at most half the last flush's duration (capped at :data:`GATHER_MAX_S`): a
        writer that does not come back in that time costs this flush at most half a sync."""
        target = self._last_group
        if len(self._pending) >= target:
            return
        deadline = time.perf_counter() + min(GATHER_MAX_S, 0.5 * self._sync_s)
        while True:
            self._mu.release()
            _yield()
            self._mu.acquire()
            if len(self._pending) >= target or time.perf_counter() >= deadline:
                return

    def _flush_one(self, data: bytes, upto: int) -> None:
        """``group_commit=False``: write and sync one frame (``_mu`` held throughout)."""
        try:
            new = self._flush(data, upto)
        except BaseException as e:
            self._undo(e)
            return
        self._done(len(data), upto, new)

    def _undo(self, e: BaseException) -> None:
        """A flush failed (``_mu`` held): cut the segment back to its last durable offset, so
        the disk holds exactly what was acknowledged, and fail every append not yet durable.
        If the cut fails too, nothing on disk can be vouched for: poison until reopened."""
        self._epoch += 1
        self._pending.clear()
        self._next = self._durable + 1
        seg = self._segments[-1]
        try:
            _truncate(self._fd, seg.size)
            _sync_fd(self._fd)
        except OSError as cut:
            self._error = self._failure = (
                f"{self.path}: write failed ({_why(e)}) and the unacknowledged tail of "
                f"{seg.path.name} could not be cut ({_why(cut)}); whether the last event was "
                "logged is unknown until the log is reopened"
            )
            log.error("%s", self._error)
            return
        self._failure = (
            f"{self.path}: not logged: {_why(e)}; the log is as it was at seq {self._durable} "
            "and takes events again once the disk does"
        )
        log.warning("%s", self._failure)

    def reopen(self) -> None:
        """Make a poisoned log usable again: cut what follows the last acknowledged record
        (which this object knows, unlike a scan that would keep whole frames never
        acknowledged), then go on appending. A no-op on a healthy log; raises LogError if
        the disk still refuses."""
        with self._mu:
            if self._closed or self.readonly or self._error is None:
                return
            seg = self._segments[-1]
            try:
                for first, p in segments.list_segments(self.path):
                    if first > seg.first_seq:  # a rotation that never published
                        p.unlink()
                if self._fd >= 0:
                    os.close(self._fd)
                    self._fd = -1
                self._fd = os.open(seg.path, os.O_WRONLY | os.O_APPEND)
                _truncate(self._fd, seg.size)
                _sync_fd(self._fd)
            except OSError as e:
                raise LogError(f"{self.path}: cannot reopen the log: {_why(e)}") from e
            self._error = None
            log.warning("%s: reopened at seq %d", self.path, self._durable)

    def _flush(self, data: bytes, upto: int) -> Segment | None:
        """Write and sync ``data`` (frames through seq ``upto``); the new segment if it rotated.

        Only the one flushing thread runs this; it publishes under the lock via :meth:`_done`.
        """
        if failpoints.ACTIVE:
            failpoints.hit("before-write")
        view = memoryview(data)
        while view:
            view = view[_write(self._fd, view) :]
        if failpoints.ACTIVE:
            failpoints.hit("before-fsync")
        t0 = time.perf_counter()
        _sync_fd(self._fd)
        if self.on_sync is not None:
            try:  # an observer's failure must not look like a failed write
                self.on_sync(time.perf_counter() - t0)
            except Exception:
                log.exception("%s: the sync observer failed", self.path)
        if failpoints.ACTIVE:
            failpoints.hit("after-fsync")
        if self._segments[-1].size + len(data) < self.segment_bytes:
            return None
        return self._rotate(upto + 1)

    def _rotate(self, first_seq: int) -> Segment | None:
        """Start the next segment. The records are durable already: a rotation that fails is
        retried at the next flush, never reported as a failed write."""
        p = self.path / segments.segment_name(first_seq)
        try:
            new = segments.create_segment(self.path, first_seq)
            fd = os.open(new.path, os.O_WRONLY | os.O_APPEND)
        except OSError as e:
            log.warning("%s: cannot start segment %s (%s); will retry", self.path, p.name, _why(e))
            with contextlib.suppress(OSError):
                p.unlink(missing_ok=True)
            return None
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
        with self._mu:
            if self._closed:
                raise LogError(f"{self.path}: the log is closed")
            last = self._durable
            view = [(s.path, s.first_seq, min(s.last_seq, last), s.size) for s in self._segments]
        until = last if until is None else min(until, last)
        return self._read(view, max(start, 1), until)

    def _read(
        self, view: list[tuple[Path, int, int, int]], start: int, until: int
    ) -> Iterator[tuple[int, Record]]:
        for path, first, last, size in view:
            if last < start or size == 0:
                continue
            if first > until:
                return
            buf = self._read_segment(path, size)
            yield from reader.records(
                buf=buf,
                path=path,
                first=first,
                start=start,
                until=until,
                size=size,
                max_record=self.max_record,
            )

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
        with self._mu:
            return [
                Segment(path=s.path, first_seq=s.first_seq, last_seq=s.last_seq, size=s.size)
                for s in self._segments
            ]

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
        with self._mu:
            self._closed = True  # no new leader from now on
            gate = self._gate
        if gate is not None:  # let the flush in flight finish and publish
            gate.acquire()
            gate.release()
        with self._mu:
            self._release()

    def _release(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)
        if self._lock is not None:
            self._lock.release()
            self._lock = None


__all__ = ["SEGMENT_BYTES", "FileLog"]
