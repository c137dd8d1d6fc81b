"""An engine's lifecycle: one state, the allowed transitions in one table.

::

    NEW ──start──▶ SERVING ◀──drain ends── DRAINING
                    │  ▲  └──drain──────────▶ │
          release   │  │ resume               │ release
                    ▼  │                      ▼
                   RELEASED ◀── RELEASING ◀───┘ (and from SERVING)
    any of the above ──stop──▶ STOPPING ──▶ STOPPED

DRAINING serves what is in flight and refuses new requests; RELEASING refuses them while an
engine that must wait for its server to go idle frees its memory (an engine that frees it at
once goes straight to RELEASED); RELEASED holds no weights or KV (a lent worker's process stays
resident); STOPPED is final. A transition not in :data:`TRANSITIONS` is a bug in the engine, and
:meth:`Lifecycle.to` says which one.

An engine that drives a server process also tracks the server (:class:`Server`): UP, or
RELAUNCHING after a crash, or GONE when the watchdog gave up. The lifecycle holds both, and
:meth:`Lifecycle.refusal` says why a new request is refused, if it is.
"""

from __future__ import annotations

from enum import Enum

from pearl.core.errors import InvariantViolation


class EngineState(Enum):
    NEW = "new"
    SERVING = "serving"
    DRAINING = "draining"
    RELEASING = "releasing"
    RELEASED = "released"
    STOPPING = "stopping"
    STOPPED = "stopped"


class Server(Enum):
    """The server process of an engine that drives one (always UP for in-process engines)."""

    UP = "up"
    RELAUNCHING = "relaunching"  # it crashed; the watchdog is starting a new one
    GONE = "gone"  # the watchdog gave up: final


S = EngineState
TRANSITIONS: dict[EngineState, frozenset[EngineState]] = {
    S.NEW: frozenset({S.SERVING, S.STOPPING}),
    S.SERVING: frozenset({S.DRAINING, S.RELEASING, S.RELEASED, S.STOPPING}),
    S.DRAINING: frozenset({S.SERVING, S.RELEASING, S.RELEASED, S.STOPPING}),
    S.RELEASING: frozenset({S.RELEASED, S.SERVING, S.DRAINING, S.STOPPING}),
    S.RELEASED: frozenset({S.SERVING, S.STOPPING}),
    S.STOPPING: frozenset({S.STOPPED}),
    S.STOPPED: frozenset(),
}
SERVER_TRANSITIONS: dict[Server, frozenset[Server]] = {
    Server.UP: frozenset({Server.RELAUNCHING, Server.GONE}),
    Server.RELAUNCHING: frozenset({Server.UP, Server.GONE}),
    Server.GONE: frozenset(),
}


class Lifecycle:
    """The state of one engine. Not locked: the engine changes it under its own lock."""

    __slots__ = ("gone_why", "kind", "server", "state")

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.state = S.NEW
        self.server = Server.UP
        self.gone_why = ""  # why the server is GONE, with where its log is

    def to(self, new: EngineState) -> None:
        if new not in TRANSITIONS[self.state]:
            raise InvariantViolation(
                f"{self.kind} engine: {self.state.value} -> {new.value} is not a lifecycle "
                f"transition (allowed: {sorted(s.value for s in TRANSITIONS[self.state])})"
            )
        self.state = new

    def server_to(self, new: Server, why: str = "") -> None:
        """The server's health changes; ``why`` says why it is GONE."""
        if new not in SERVER_TRANSITIONS[self.server]:
            raise InvariantViolation(
                f"{self.kind} engine: server {self.server.value} -> {new.value} is not a transition"
            )
        self.server = new
        if new is Server.GONE:
            self.gone_why = why

    @property
    def running(self) -> bool:
        """Started and not stopping: calls to the engine are accepted."""
        return self.state in (S.SERVING, S.DRAINING, S.RELEASING, S.RELEASED)

    @property
    def released(self) -> bool:
        return self.state is S.RELEASED

    @property
    def draining(self) -> bool:
        return self.state is S.DRAINING

    @property
    def stopping(self) -> bool:
        return self.state in (S.STOPPING, S.STOPPED)

    def refusal(self) -> str:
        """Why a running engine refuses new requests for now; "" when it takes them."""
        if self.server is Server.GONE:
            return f"the {self.kind} server is gone ({self.gone_why})"
        if self.server is Server.RELAUNCHING:
            return f"the {self.kind} server is being relaunched after a crash"
        if self.state is S.RELEASING:
            return f"the {self.kind} engine is releasing its memory"
        if self.state is S.DRAINING:
            return f"the {self.kind} engine is draining"
        return ""

    def __repr__(self) -> str:
        return f"Lifecycle({self.kind}, {self.state.value}, server {self.server.value})"
