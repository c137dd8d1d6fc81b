"""The append-only event log: the single source of truth for the GPU-worker-role table.

State = fold(records). :class:`FileLog` keeps records in checksummed segment files with group
commit and atomic snapshots; :class:`MemoryLog` is the same interface in memory. Replay is the
latest snapshot plus the folded tail (:meth:`EventLog.load`).
"""

from pearl.core.errors import LogCorrupted, LogError, LogLocked, LogWriteFailed, NotALog
from pearl.log.base import EventLog, Loaded, Visitor
from pearl.log.file import SEGMENT_BYTES, FileLog
from pearl.log.framing import MAX_RECORD
from pearl.log.memory import MemoryLog, MemoryStorage
from pearl.log.segments import Repair, Segment
from pearl.log.snapshot import state_from_snapshot, state_to_snapshot
from pearl.log.verify import Verdict, verify

__all__ = [
    "MAX_RECORD",
    "SEGMENT_BYTES",
    "EventLog",
    "FileLog",
    "Loaded",
    "LogCorrupted",
    "LogError",
    "LogLocked",
    "LogWriteFailed",
    "MemoryLog",
    "MemoryStorage",
    "NotALog",
    "Repair",
    "Segment",
    "Verdict",
    "Visitor",
    "state_from_snapshot",
    "state_to_snapshot",
    "verify",
]
