"""An engine's lifecycle: one state, the allowed transitions in one table.

::

    NEW ──start──▶ SERVING ◀──drain ends── DRAINING
                    │  ▲  └──drain──────────▶ │
          release   │  │ resume               │ release
                    ▼  │                      ▼
                   RELEASED ◀─────────────────┘
    any of the above ──stop──▶ STOPPING ──▶ STOPPED

DRAINING serves what is in flight and refuses new requests; RELEASED holds no weights or KV
(a lent worker's process stays resident); STOPPED is final. A transition not in
:data:`TRANSITIONS` is a bug in the engine, and :meth:`Lifecycle.to` says which one.
"""

from __future__ import annotations

from enum import Enum

from pearl.core.errors import InvariantViolation


class EngineState(Enum):
    NEW = "new"
    SERVING = "serving"
    DRAINING = "draining"
    RELEASED = "released"
    STOPPING = "stopping"
    STOPPED = "stopped"


S = EngineState
TRANSITIONS: dict[EngineState, frozenset[EngineState]] = {
    S.NEW: frozenset({S.SERVING, S.STOPPING}),
    S.SERVING: frozenset({S.DRAINING, S.RELEASED, S.STOPPING}),
    S.DRAINING: frozenset({S.SERVING, S.RELEASED, S.STOPPING}),
    S.RELEASED: frozenset({S.SERVING, S.STOPPING}),
    S.STOPPING: frozenset({S.STOPPED}),
    S.STOPPED: frozenset(),
}


class Lifecycle:
    """The state of one engine. Not locked: the engine changes it under its own lock."""

    __slots__ = ("kind", "state")

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.state = S.NEW

    def to(self, new: EngineState) -> None:
        if new not in TRANSITIONS[self.state]:
            raise InvariantViolation(
                f"{self.kind} engine: {self.state.value} -> {new.value} is not a lifecycle "
                f"transition (allowed: {sorted(s.value for s in TRANSITIONS[self.state])})"
            )
        self.state = new

    @property
    def running(self) -> bool:
        """Started and not stopping: calls to the engine are accepted."""
        return self.state in (S.SERVING, S.DRAINING, S.RELEASED)

    @property
    def released(self) -> bool:
        return self.state is S.RELEASED

    @property
    def draining(self) -> bool:
        return self.state is S.DRAINING

    @property
    def stopping(self) -> bool:
        return self.state in (S.STOPPING, S.STOPPED)

    def __repr__(self) -> str:
        return f"Lifecycle({self.kind}, {self.state.value})"
