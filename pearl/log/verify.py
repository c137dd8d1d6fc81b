"""Check a whole log without changing it: frames, sequence, replay, and every snapshot.

Replays from seq 1 and compares each stored snapshot with the table folded up to its sequence
number, so a snapshot that disagrees with its log is found as surely as a damaged frame.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from pearl.core.errors import InvariantViolation, LogCorrupted
from pearl.core.fold import apply_to
from pearl.core.state import ClusterState
from pearl.log.file import FileLog


@dataclass(frozen=True, slots=True)
class Verdict:
    records: int
    last_seq: int
    segments: int
    snapshots: tuple[int, ...]
    problem: str | None  # None: the log is sound

    @property
    def ok(self) -> bool:
        return self.problem is None

    def __str__(self) -> str:
        if self.problem is not None:
            return self.problem
        seqs = f"seq 1..{self.last_seq}, " if self.records else ""
        snap = f"snapshot at {self.snapshots[-1]}" if self.snapshots else "no snapshot"
        plural = "" if self.segments == 1 else "s"
        return f"ok: {self.records} records, {seqs}{self.segments} segment{plural}, {snap}"


def verify(path: str | os.PathLike[str]) -> Verdict:
    """Open ``path`` read-only and check all of it; damage that stops opening raises."""
    with FileLog(path, readonly=True) as log:
        snaps = log.snapshots()
        nseg = len(log.segments)
        problem = (
            None
            if log.pending_repair is None
            else (
                f"{log.pending_repair} "
                "(a writer would do this on open; nothing acknowledged is lost)"
            )
        )
        builder = ClusterState().thaw()
        todo = [s for s in snaps if s > 0]
        for seq, record in log.read():
            try:
                apply_to(builder, record, seq)
            except InvariantViolation as e:
                raise LogCorrupted(
                    f"{log.path}: record {seq} ({record.KIND}) does not replay: {e}"
                ) from None
            if todo and todo[0] == seq:
                _check_snapshot(log, seq, builder.freeze())
                todo.pop(0)
        return Verdict(
            records=log.last_seq,
            last_seq=log.last_seq,
            segments=nseg,
            snapshots=tuple(snaps),
            problem=problem,
        )


def _check_snapshot(log: FileLog, seq: int, replayed: ClusterState) -> None:
    stored, _ = log.read_snapshot(seq)
    if stored != replayed:
        raise LogCorrupted(
            f"{log.path}: the snapshot at seq {seq} differs from the table replayed from the log; "
            "move the snapshot aside so replay ignores it"
        )


__all__ = ["Verdict", "verify"]
