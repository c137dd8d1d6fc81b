"""Liveness bookkeeping, no sockets: who is alive, and when to send the next heartbeat.

Any message from a peer counts as a heartbeat (the ZeroMQ guide's Paranoid Pirate): the owner of
a socket calls :meth:`Liveness.beat` for every message it receives. A peer is dead once
``liveness`` intervals (3 by default) pass without one. The clock is injectable and defaults to
``time.monotonic`` (never the wall clock: it jumps).

Silence is judged only up to the moment the receiver last had nothing left to read: while the
owner of the socket is behind (a slow handler, a starved thread), what waits unread may be the
very heartbeat it would miss, so :meth:`Liveness.behind` freezes the judging clock at that moment
and :meth:`Liveness.caught_up` lets it run again. A busy receiver never makes a peer look dead.

A receiver can also fall behind without knowing it: a thread starved of the CPU (or of the GIL)
never wakes to call ``behind``. So each ``caught_up`` also records when the receiver last had
nothing to read, and a receiver that reports it (a poll loop calls ``caught_up`` at least every
``idle_grace_s``, also when a poll times out empty) has silence judged no later than that moment
plus ``idle_grace_s``: a starved receiver freezes the judging clock too. Until a receiver first
reports, silence is judged at the present.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from typing import Protocol

from transports.protocol import HEARTBEAT_INTERVAL_S, LIVENESS, POLL_MS

Clock = Callable[[], float]


class Listener(Protocol):
    """What a socket's owner tells about what it receives (a :class:`Liveness` is one)."""

    def beat(self, peer: str) -> None:
        """A message from ``peer`` was read."""

    def behind(self) -> None:
        """Input is waiting unread (called when a burst starts; the earliest call counts)."""

    def caught_up(self) -> None:
        """Nothing is left to read."""


class Liveness:
    """Last-heard times of peers. Thread-safe: a socket thread beats, a supervisor reaps."""

    def __init__(
        self,
        interval_s: float = HEARTBEAT_INTERVAL_S,
        liveness: int = LIVENESS,
        clock: Clock = time.monotonic,
        idle_grace_s: float = POLL_MS / 1000,
    ) -> None:
        if interval_s <= 0 or liveness < 1:
            raise ValueError(f"need interval_s > 0 and liveness >= 1, got {interval_s}, {liveness}")
        self.interval_s = interval_s
        self.liveness = liveness
        self.clock = clock
        self.idle_grace_s = idle_grace_s
        self._seen: dict[Hashable, float] = {}
        self._behind: float | None = None  # since when the receiver has had unread input
        self._idle: float | None = None  # when the receiver last had nothing to read
        self._lock = threading.Lock()

    @property
    def timeout_s(self) -> float:
        """Silence after which a peer is dead: ``liveness`` missed intervals."""
        return self.interval_s * self.liveness

    def beat(self, peer: Hashable, now: float | None = None) -> None:
        """``peer`` sent something (any message counts)."""
        t = self.clock() if now is None else now
        with self._lock:
            self._seen[peer] = t

    def behind(self, now: float | None = None) -> None:
        """The receiver has input waiting: judge silence no later than now until it catches up."""
        t = self.clock() if now is None else now
        with self._lock:
            if self._behind is None:
                self._behind = t

    def caught_up(self, now: float | None = None) -> None:
        """The receiver has read everything (or its poll timed out empty): silence is judged at
        the present again, for the next ``idle_grace_s``."""
        t = self.clock() if now is None else now
        with self._lock:
            self._behind = None
            self._idle = t

    def _judged(self, t: float) -> float:
        """The time silence is judged at (lock held): now, or when the receiver fell behind, or
        shortly after it last had nothing to read (a starved receiver), whichever is first."""
        if self._behind is not None:
            t = min(t, self._behind)
        if self._idle is not None:
            t = min(t, self._idle + self.idle_grace_s)
        return t

    def last_seen(self, peer: Hashable) -> float | None:
        with self._lock:
            return self._seen.get(peer)

    def alive(self, peer: Hashable, now: float | None = None) -> bool:
        """Heard from within the timeout; an unknown peer is not alive."""
        t = self.clock() if now is None else now
        with self._lock:
            seen = self._seen.get(peer)
            t = self._judged(t)
        return seen is not None and t - seen < self.timeout_s

    def dead(self, now: float | None = None) -> list[Hashable]:
        """Known peers silent for ``liveness`` intervals or more (still tracked)."""
        t = self.clock() if now is None else now
        with self._lock:
            t = self._judged(t)
            return [p for p, seen in self._seen.items() if t - seen >= self.timeout_s]

    def reap(self, now: float | None = None) -> list[Hashable]:
        """Like :meth:`dead`, and forget them (report each death once)."""
        t = self.clock() if now is None else now
        with self._lock:
            t = self._judged(t)
            gone = [p for p, seen in self._seen.items() if t - seen >= self.timeout_s]
            for p in gone:
                del self._seen[p]
        return gone

    def forget(self, peer: Hashable) -> None:
        with self._lock:
            self._seen.pop(peer, None)

    def peers(self) -> list[Hashable]:
        with self._lock:
            return list(self._seen)

    def next_deadline(self) -> float | None:
        """Clock time at which the quietest peer becomes dead (for poll timeouts)."""
        with self._lock:
            if not self._seen:
                return None
            return min(self._seen.values()) + self.timeout_s


class HeartbeatSender:
    """When to send the next heartbeat; any message sent counts as one."""

    def __init__(self, interval_s: float = HEARTBEAT_INTERVAL_S, clock: Clock = time.monotonic):
        if interval_s <= 0:
            raise ValueError(f"need interval_s > 0, got {interval_s}")
        self.interval_s = interval_s
        self.clock = clock
        self._last: float | None = None

    def sent(self, now: float | None = None) -> None:
        """Something went to the peer: the next heartbeat is an interval from now."""
        self._last = self.clock() if now is None else now

    def time_left(self, now: float | None = None) -> float:
        """Seconds until a heartbeat is due (0 when due; use as a poll timeout)."""
        if self._last is None:
            return 0.0
        t = self.clock() if now is None else now
        return max(0.0, self._last + self.interval_s - t)

    def due(self, now: float | None = None) -> bool:
        return self.time_left(now) == 0.0

    def tick(self, send: Callable[[], object], now: float | None = None) -> bool:
        """Call ``send()`` if a heartbeat is due; True when it did."""
        t = self.clock() if now is None else now
        if not self.due(t):
            return False
        send()
        self.sent(t)
        return True


__all__ = ["Clock", "HeartbeatSender", "Listener", "Liveness"]
