"""An in-memory :class:`EventLog` for tests and the simulator: same API, no files.

Records are still encoded on append (so an unencodable or oversize record fails here exactly as
it fails in :class:`~pearl.log.file.FileLog`) and snapshots are stored as snapshot bytes. The
storage outlives the log object: ``MemoryLog(storage=old.storage)`` is a restart.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from pearl.core.errors import LogError
from pearl.core.events import Record
from pearl.core.state import ClusterState
from pearl.log import framing, snapshot
from pearl.log.base import EventLog


@dataclass
class MemoryStorage:
    """What a restart keeps: the records (index i holds seq i + 1) and the snapshot bytes."""

    records: list[Record] = field(default_factory=list)
    snapshots: dict[int, bytes] = field(default_factory=dict)


class MemoryLog(EventLog):
    """Durable the moment ``append`` returns, as far as this process lives."""

    def __init__(
        self,
        storage: MemoryStorage | None = None,
        *,
        max_record: int = framing.MAX_RECORD,
        keep_snapshots: int = 3,
    ) -> None:
        self.storage = storage if storage is not None else MemoryStorage()
        self.max_record = max_record
        self.keep_snapshots = max(1, keep_snapshots)
        self._lock = threading.Lock()
        self._closed = False

    def append(self, records: Sequence[Record]) -> list[int]:
        for r in records:
            framing.pack(r, self.max_record)
        with self._lock:
            self._check_open()
            first = len(self.storage.records) + 1
            self.storage.records.extend(records)
            return list(range(first, first + len(records)))

    @property
    def last_seq(self) -> int:
        return len(self.storage.records)

    def read(self, start: int = 1, until: int | None = None) -> Iterator[tuple[int, Record]]:
        self._check_open()
        records = self.storage.records
        stop = len(records) if until is None else min(until, len(records))
        return ((i + 1, records[i]) for i in range(max(start, 1) - 1, stop))

    def write_snapshot(self, state: ClusterState, extra: dict[str, Any] | None = None) -> None:
        self._check_open()
        self._check_snapshot(state)
        data = snapshot.encode(state, extra)
        with self._lock:
            snaps = self.storage.snapshots
            snaps[state.seq] = data
            for old in sorted(snaps)[: -self.keep_snapshots]:
                del snaps[old]

    def snapshots(self) -> list[int]:
        self._check_open()
        return sorted(self.storage.snapshots)

    def read_snapshot(self, seq: int) -> tuple[ClusterState, dict[str, Any] | None]:
        self._check_open()
        data = self.storage.snapshots.get(seq)
        if data is None:
            raise LogError(f"no snapshot at seq {seq}; snapshots: {self.snapshots()}")
        return snapshot.decode(data, f"memory snapshot {seq}")

    def close(self) -> None:
        self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            raise LogError("the log is closed")


__all__ = ["MemoryLog", "MemoryStorage"]
