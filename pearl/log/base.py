"""The one interface both log stores implement, and replay (latest snapshot + folded tail)."""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

from pearl.core.errors import InvariantViolation, LogCorrupted, LogError
from pearl.core.events import Record
from pearl.core.fold import fold_into
from pearl.core.state import ClusterState

log = logging.getLogger(__name__)

Visitor = Callable[[int, Record], None]


@dataclass(frozen=True, slots=True)
class Loaded:
    """What replay rebuilt: the table, the snapshot's extra data, and where the tail began."""

    state: ClusterState
    extra: dict[str, Any] | None
    snapshot_seq: int  # 0: no snapshot was used; the tail starts at snapshot_seq + 1


class EventLog(ABC):
    """An append-only, sequence-numbered log of records with snapshots of the folded table.

    ``append`` returns only once the records are durable. Sequence numbers start at 1 and run
    last + 1. Appending records the table would reject is the caller's job to prevent (the
    Orchestrator folds before it logs); the log does not fold on append.
    """

    @abstractmethod
    def append(self, records: Sequence[Record]) -> list[int]:
        """Durably append ``records``; return their sequence numbers."""

    @property
    @abstractmethod
    def last_seq(self) -> int:
        """Sequence number of the last durable record (0 for an empty log)."""

    @abstractmethod
    def read(self, start: int = 1, until: int | None = None) -> Iterator[tuple[int, Record]]:
        """(seq, record) for ``start <= seq <= until`` (``until`` defaults to the last record)."""

    @abstractmethod
    def write_snapshot(self, state: ClusterState, extra: dict[str, Any] | None = None) -> None:
        """Durably store ``state`` (as of ``state.seq``, which must be durable) and ``extra``."""

    @abstractmethod
    def snapshots(self) -> list[int]:
        """Sequence numbers of the stored snapshots, ascending."""

    @abstractmethod
    def read_snapshot(self, seq: int) -> tuple[ClusterState, dict[str, Any] | None]:
        """The (state, extra) stored by the snapshot at ``seq``."""

    def reopen(self) -> None:
        """Make the log writable again after a failed write left its disk state unknown; a
        no-op on a healthy log (the default, for stores whose writes cannot half-fail)."""
        return None

    @abstractmethod
    def close(self) -> None:
        """Release the log; later calls raise LogError. Idempotent."""

    def load(self, until: int | None = None, visit: Visitor | None = None) -> Loaded:
        """The table as of ``until`` (default: the last record): snapshot + folded tail.

        ``visit(seq, record)`` is called for every tail record folded after the snapshot, in
        order (the controller refits its profile from the telemetry among them). A snapshot that
        does not load is skipped with a warning for the next older one, or the whole log.
        """
        last = self.last_seq
        if until is None:
            until = last
        elif not 0 <= until <= last:
            raise LogError(f"cannot replay to seq {until}: the log holds seq 1..{last}")
        snap, state, extra = self._newest_readable([s for s in self.snapshots() if s <= until])
        builder = state.thaw()
        try:
            fold_into(builder, self.read(snap + 1, until), visit)
        except InvariantViolation as e:
            raise LogCorrupted(
                f"record {builder.seq + 1} cannot be replayed onto the table as of seq "
                f"{builder.seq}: {e}"
            ) from e
        if builder.seq != until:
            raise LogCorrupted(f"replay stopped at seq {builder.seq}, expected {until}")
        return Loaded(builder.freeze(), extra, snap)

    def _newest_readable(self, seqs: list[int]) -> tuple[int, ClusterState, dict[str, Any] | None]:
        """(seq, state, extra) of the newest of the snapshots at ``seqs`` that loads; a damaged
        one is skipped with a warning naming it, and (0, empty table, None) when none loads: the
        log holds every record, a snapshot only shortens replay."""
        for i in range(len(seqs) - 1, -1, -1):
            try:
                state, extra = self.read_snapshot(seqs[i])
            except LogError as e:  # LogCorrupted too: damaged, unreadable, gone
                instead = f"the snapshot at seq {seqs[i - 1]}" if i else "the start of the log"
                log.warning("%s; replaying from %s instead", e, instead)
                continue
            return seqs[i], state, extra
        return 0, ClusterState(), None

    def _check_snapshot(self, state: ClusterState) -> None:
        last = self.last_seq
        if not 0 <= state.seq <= last:
            raise LogError(
                f"cannot snapshot the table as of seq {state.seq}: the log is durable to seq {last}"
            )

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


__all__ = ["EventLog", "Loaded", "Visitor"]
