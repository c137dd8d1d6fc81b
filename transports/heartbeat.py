"""Liveness bookkeeping, no sockets: who is alive, and when to send the next heartbeat.

Any message from a peer counts as a heartbeat (the ZeroMQ guide's Paranoid Pirate): the owner of
a socket calls :meth:`Liveness.beat` for every message it receives. A peer is dead once
``liveness`` intervals (3 by default) pass without one. The clock is injectable and defaults to
``time.monotonic`` (never the wall clock: it jumps).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable

from transports.protocol import HEARTBEAT_INTERVAL_S, LIVENESS

Clock = Callable[[], float]


class Liveness:
    """Last-heard times of peers. Thread-safe: a socket thread beats, a supervisor reaps."""

    def __init__(
        self,
        interval_s: float = HEARTBEAT_INTERVAL_S,
        liveness: int = LIVENESS,
        clock: Clock = time.monotonic,
    ) -> None:
        if interval_s <= 0 or liveness < 1:
            raise ValueError(f"need interval_s > 0 and liveness >= 1, got {interval_s}, {liveness}")
        self.interval_s = interval_s
        self.liveness = liveness
        self.clock = clock
        self._seen: dict[Hashable, float] = {}
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

    def last_seen(self, peer: Hashable) -> float | None:
        with self._lock:
            return self._seen.get(peer)

    def alive(self, peer: Hashable, now: float | None = None) -> bool:
        """Heard from within the timeout; an unknown peer is not alive."""
        t = self.clock() if now is None else now
        with self._lock:
            seen = self._seen.get(peer)
        return seen is not None and t - seen < self.timeout_s

    def dead(self, now: float | None = None) -> list[Hashable]:
        """Known peers silent for ``liveness`` intervals or more (still tracked)."""
        t = self.clock() if now is None else now
        with self._lock:
            return [p for p, seen in self._seen.items() if t - seen >= self.timeout_s]

    def reap(self, now: float | None = None) -> list[Hashable]:
        """Like :meth:`dead`, and forget them (report each death once)."""
        t = self.clock() if now is None else now
        with self._lock:
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


__all__ = ["Clock", "HeartbeatSender", "Liveness"]
