"""A heartbeat sender with a thread and a socket of its own: :class:`Beacon`.

A beat leaves every ``interval_s`` on a fixed monotonic schedule, whatever the rest of the process
is doing and however slow the answers are: sending never waits for a reply, so a slow peer or a
busy process stretches no interval. Every reply is handed to ``on_reply`` on the beacon's thread.
After ``LIVENESS`` intervals without any reply the socket is replaced by a new one, with
exponential back-off between replacements (the ZeroMQ guide's Paranoid Pirate); ``LINGER=0``,
and no poll waits longer than ``POLL_MS``.

The thread runs only socket calls and the codec; it never takes a lock its owner may hold, so the
owner's compute (a model step, a Python loop) delays it by no more than the interpreter's switch
interval.
"""

from __future__ import annotations

import itertools
import logging
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any

import zmq

from pearl.core.errors import PearlError
from transports.auth import ClientKeys, secure_client
from transports.codec import BadMessage, Codec, Envelope
from transports.heartbeat import Clock
from transports.protocol import LIVENESS, POLL_MS

log = logging.getLogger(__name__)


class Beacon:
    """Sends ``beat()`` to ``address`` every ``interval_s`` while not paused; hands replies on."""

    def __init__(
        self,
        address: str,
        beat: Callable[[], Any],
        on_reply: Callable[[Envelope], None],
        *,
        interval_s: float,
        name: str,
        keys: ClientKeys | None = None,
        ctx: zmq.Context[Any] | None = None,
        clock: Clock = time.monotonic,
        max_backoff_s: float = 2.0,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"need interval_s > 0, got {interval_s}")
        self.address, self.beat, self.on_reply = address, beat, on_reply
        self.interval_s, self.name, self.keys = interval_s, name, keys
        self.ctx = ctx or zmq.Context.instance()
        self.clock = clock
        self.max_backoff_s = max_backoff_s
        self.codec = Codec()
        self.paused = True  # the owner says when beats make sense (after its hello)
        self.sent = 0
        self.last_id = 0  # id of the last beat sent (replies carry it as ``corr``)
        self.replies = 0
        self.reconnects = 0
        self.last_reply: float | None = None
        self.started = clock()
        self._ids = itertools.count(secrets.randbits(40) + 1)
        self._sock: zmq.Socket[Any] | None = None  # touched only by the beacon's thread
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"beacon {name}", daemon=True)

    def start(self) -> Beacon:
        self._thread.start()
        return self

    def close(self, timeout_s: float = 2.0) -> None:
        """Stop beating; prompt (no poll waits longer than POLL_MS)."""
        self._halt.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def silent_s(self) -> float:
        """Seconds since the last reply (since start when none came yet)."""
        last = self.last_reply if self.last_reply is not None else self.started
        return self.clock() - last

    # -- the thread ------------------------------------------------------------------------------

    def _connect(self) -> zmq.Socket[Any]:
        sock = self.ctx.socket(zmq.DEALER)
        sock.linger = 0
        sock.setsockopt(zmq.MAXMSGSIZE, self.codec.limits.max_message)
        if self.keys is not None:
            secure_client(sock, self.keys)
        sock.connect(self.address)
        return sock

    def _run(self) -> None:
        try:
            self._loop()
        finally:
            if self._sock is not None:
                self._sock.close(linger=0)
                self._sock = None

    def _loop(self) -> None:
        sock = self._sock = self._connect()
        due = self.clock()
        heard = due  # last reply, or the last time the socket was replaced
        backoff = 0.05
        while not self._halt.is_set():
            now = self.clock()
            if self.paused:
                heard = now  # silence while paused is not the peer's
            if now >= due:
                if not self.paused:
                    self._send(sock)
                # A fixed schedule; after a stall, one beat now, not a burst of late ones.
                due = (
                    due + self.interval_s if now - due < self.interval_s else now + self.interval_s
                )
            if now - heard >= LIVENESS * self.interval_s + backoff:
                sock.close(linger=0)
                sock = self._sock = self._connect()
                self.reconnects += 1
                heard = now
                backoff = min(backoff * 2, self.max_backoff_s)
            wait_ms = max(0, min(int((due - self.clock()) * 1000) + 1, POLL_MS))
            if sock.poll(wait_ms, zmq.POLLIN) and self._drain(sock):
                heard = self.clock()
                backoff = 0.05

    def _send(self, sock: zmq.Socket[Any]) -> None:
        try:
            rid = next(self._ids)
            frames = self.codec.encode(self.beat(), id=rid, sender=self.name)
            sock.send_multipart(frames, zmq.NOBLOCK, copy=False)
            self.sent, self.last_id = self.sent + 1, rid
        except zmq.Again:
            pass  # nowhere to queue it (peer gone): the next one tries again
        except (PearlError, zmq.ZMQError) as e:
            log.warning("beacon %s: cannot send a beat: %s", self.name, e)

    def _drain(self, sock: zmq.Socket[Any]) -> bool:
        """Read every waiting reply; True when at least one came."""
        got = False
        while int(sock.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
            frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            try:
                env = self.codec.decode(frames)
            except BadMessage as e:
                log.warning("beacon %s: bad reply from %s: %s", self.name, self.address, e)
                continue
            got = True
            self.replies += 1
            self.last_reply = self.clock()
            try:
                self.on_reply(env)
            except Exception:  # the owner's bug must not stop the heart
                log.exception("beacon %s: on_reply failed", self.name)
        return got


__all__ = ["Beacon"]
