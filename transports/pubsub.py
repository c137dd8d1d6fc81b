"""Numbered state changes over PUB/SUB, with snapshot + catch-up (the ZeroMQ guide's Clone pattern).

The :class:`Publisher` numbers every change 1, 2, 3, ... and publishes ``[topic, envelope]``.
It uses an XPUB socket so it sees each new subscription and greets it at once with a
``heartbeat`` carrying its newest sequence number; it also sends that heartbeat every interval,
so a subscriber notices a lost last change, and a silent publisher.

A :class:`Subscriber` avoids the slow-joiner race in this order: subscribe; wait until the first
message arrives (the subscription is then live at the publisher, so every later change reaches
it); ask the server for a snapshot over RPC (``subscribe`` -> ``snapshot`` with its sequence
number); drop buffered changes at or below it; apply each later change in order. A missing
number is a gap: it is reported (``on_gap``) and the subscriber re-snapshots.

The owner of the state must make snapshots and publishes consistent: build the snapshot with
:meth:`Publisher.snapshot`, and change the state and publish under :attr:`Publisher.lock`.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import zmq

from pearl.core.errors import PearlError
from pearl.core.schema import WireStruct
from transports.auth import (
    ClientKeys,
    ServerKeys,
    check_bind,
    release_server,
    secure_client,
    secure_server,
)
from transports.codec import BadMessage, Codec
from transports.heartbeat import Liveness
from transports.protocol import HEARTBEAT_INTERVAL_S, Change, Heartbeat, Limits, Snapshot, Subscribe
from transports.rpc import Client

log = logging.getLogger(__name__)

Payload = dict[str, Any]


class GapDetected(PearlError):
    """A subscriber missed change numbers (publisher overflowed its queue, or restarted)."""

    def __init__(self, expected: int, got: int) -> None:
        super().__init__(f"expected change {expected}, got {got}: re-snapshotting")
        self.expected = expected
        self.got = got


class Publisher:
    """Publishes numbered changes of one topic. Thread-safe (one lock around the socket)."""

    def __init__(
        self,
        address: str,
        *,
        topic: str = "state",
        ctx: zmq.Context[Any] | None = None,
        keys: ServerKeys | None = None,
        limits: Limits | None = None,
        name: str = "publisher",
        heartbeat_s: float = HEARTBEAT_INTERVAL_S,
        greet_poll_s: float = 0.02,
    ) -> None:
        check_bind(address, keys)
        self.topic = topic
        self.name = name
        self.codec = Codec(limits)
        self.ctx = ctx or zmq.Context.instance()
        self.lock = threading.RLock()  # hold it to change state + publish atomically
        self.seq = 0
        self.subscriptions = 0  # subscribe requests seen (XPUB), for status and tests
        # Distinguishes runs: numbering restarts at 1 after a restart. Wall-clock nanoseconds
        # so that a later run has a larger number (an identity stamp, not used for timing).
        self.incarnation = time.time_ns()
        self._topic = topic.encode()
        self._ids = itertools.count(1)
        self._domain: str | None = None
        self._sock = self.ctx.socket(zmq.XPUB)
        self._sock.linger = 0
        self._sock.setsockopt(zmq.XPUB_VERBOSE, 1)  # see every subscriber, not just the first
        try:
            if keys is not None:
                self._domain = secure_server(self._sock, keys)
            self._sock.bind(address)
        except BaseException:
            self._sock.close(linger=0)
            if self._domain is not None:
                release_server(self.ctx, self._domain)
            raise
        self.address: str = self._sock.get_string(zmq.LAST_ENDPOINT)
        self._stop = threading.Event()
        self._heartbeat_s = heartbeat_s
        self._greet_poll_s = greet_poll_s
        self._thread = threading.Thread(target=self._run, name=f"pub-{name}", daemon=True)
        self._thread.start()

    def publish(self, payload: Payload) -> int:
        """Publish the next change; returns its sequence number."""
        with self.lock:
            self.seq += 1
            self._send(Change(seq=self.seq, payload=payload, incarnation=self.incarnation))
            return self.seq

    def snapshot(self, build: Callable[[], Payload]) -> Snapshot:
        """``build()`` under the lock, tagged with the number of the last change it includes."""
        with self.lock:
            return Snapshot(
                seq=self.seq, payload=build(), topic=self.topic, incarnation=self.incarnation
            )

    def heartbeat(self) -> None:
        with self.lock:
            self._send(Heartbeat(incarnation=self.incarnation, seq=self.seq))

    def _send(self, msg: WireStruct) -> None:
        frames = self.codec.encode(msg, id=next(self._ids), sender=self.name)
        self._sock.send_multipart([self._topic, *frames])

    def _run(self) -> None:
        # Greets new subscribers (XPUB shows subscriptions as b"\x01topic") and beats.
        next_beat = time.monotonic()
        while not self._stop.wait(self._greet_poll_s):
            greet = False
            with self.lock:
                while True:
                    try:
                        sub = self._sock.recv(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    if sub[:1] == b"\x01":
                        greet = True
                        self.subscriptions += 1
            now = time.monotonic()
            if greet or now >= next_beat:
                self.heartbeat()
                next_beat = now + self._heartbeat_s

    def close(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join()
        with self.lock:
            self._sock.close(linger=0)
        if self._domain is not None:
            release_server(self.ctx, self._domain)

    def __enter__(self) -> Publisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Subscriber:
    """Keeps a copy of a topic's state: snapshot over RPC, then every change from SUB in order.

    Not thread-safe: drive it with :meth:`pump` from one thread, or :meth:`start` a thread that
    does. Callbacks run on that thread: ``on_snapshot(seq, payload)`` replaces the state,
    ``on_change(seq, payload)`` applies one change, ``on_gap(GapDetected)`` reports a gap
    (a re-snapshot follows). ``keys`` are the SUB socket's CURVE client keys; by default those of
    the ``snapshots`` client, since the publisher and the snapshot server are one program with one
    key pair (a SUB without them never hears a CURVE publisher: it gets snapshots, no changes).
    """

    def __init__(
        self,
        pub_address: str,
        snapshots: Client,
        *,
        on_snapshot: Callable[[int, Payload], None],
        on_change: Callable[[int, Payload], None],
        on_gap: Callable[[GapDetected], None] | None = None,
        topic: str = "state",
        ctx: zmq.Context[Any] | None = None,
        keys: ClientKeys | None = None,
        limits: Limits | None = None,
        join_timeout_s: float = 2.0,
        heartbeat_s: float = HEARTBEAT_INTERVAL_S,
    ) -> None:
        self.snapshots = snapshots
        self.on_snapshot = on_snapshot
        self.on_change = on_change
        self.on_gap = on_gap
        self.topic = topic
        self.codec = Codec(limits)
        self.join_timeout_s = join_timeout_s
        self.publisher = Liveness(heartbeat_s)  # any message from the publisher counts
        self.seq = -1  # last change applied; -1 until the first snapshot
        self.incarnation = -1  # of the publisher the snapshot came from
        self.gaps = 0
        self._topic = topic.encode()
        self._buffer: deque[Any] = deque()
        self._need_snapshot = True
        self._applied = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._owner: int | None = None  # the one thread allowed to touch the SUB socket
        ctx = ctx or zmq.Context.instance()
        self._sock = ctx.socket(zmq.SUB)
        self._sock.linger = 0
        self._sock.setsockopt(zmq.MAXMSGSIZE, self.codec.limits.max_message)
        keys = keys if keys is not None else snapshots.keys
        if keys is not None:
            secure_client(self._sock, keys)
        self._sock.setsockopt(zmq.SUBSCRIBE, self._topic)
        self._sock.connect(pub_address)

    @property
    def synced(self) -> bool:
        return self.seq >= 0

    def alive(self) -> bool:
        """Heard from the publisher within 3 heartbeat intervals."""
        return self.publisher.alive("pub")

    def sync(self) -> int:
        """Wait until the subscription is live, take a snapshot, apply buffered changes."""
        self._check_thread()
        deadline = time.monotonic() + self.join_timeout_s
        while not self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                # Publisher silent: go on; a change we missed shows up as a gap later.
                log.warning("no message from the publisher within %.1fs", self.join_timeout_s)
                break
            self._read(min(left, 0.1))
        self._need_snapshot = True
        self._drain()
        return self.seq

    def pump(self, timeout_s: float = 0.1) -> int:
        """Apply what arrives within ``timeout_s`` (syncing first if needed); returns the count."""
        self._check_thread()
        self._applied = 0
        if not self.synced:
            self.sync()
        self._read(timeout_s)
        self._drain()
        return self._applied

    def _check_thread(self) -> None:
        me = threading.get_ident()
        if self._owner is None:
            self._owner = me
        elif self._owner != me:
            raise PearlError(
                "Subscriber used from two threads: ZeroMQ sockets are not thread-safe; "
                "pump it from one thread (or use start())"
            )

    def _drain(self) -> None:
        while True:
            if self._need_snapshot:
                self._snapshot()
            if not self._buffer:
                return
            self._apply(self._buffer.popleft())

    def _snapshot(self) -> None:
        snap = self.snapshots.request(Subscribe(topic=self.topic))
        if not isinstance(snap, Snapshot):
            raise PearlError(f"expected a snapshot reply to subscribe, got {snap.KIND!r}")
        self._need_snapshot = False
        self.seq, self.incarnation = snap.seq, snap.incarnation
        self.on_snapshot(snap.seq, snap.payload)

    def _read(self, timeout_s: float) -> None:
        """Move every message that arrives within ``timeout_s`` into the buffer."""
        if not self._sock.poll(int(timeout_s * 1000), zmq.POLLIN):
            return
        while True:
            try:
                parts = self._sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if parts[0] != self._topic:
                continue  # another topic sharing our prefix
            try:
                env = self.codec.decode(parts[1:])
            except BadMessage as e:
                log.warning("dropping a bad message from the publisher: %s", e)
                continue
            self.publisher.beat("pub")
            if isinstance(env.msg, Change | Heartbeat):
                self._buffer.append(env.msg)

    def _apply(self, msg: Change | Heartbeat) -> None:
        if msg.incarnation < self.incarnation:
            return  # from an earlier run of the publisher, older than our snapshot
        if msg.incarnation > self.incarnation:
            self._gap(msg.seq)  # the publisher restarted: its numbers start again
        elif isinstance(msg, Change):
            if msg.seq == self.seq + 1:
                self.seq = msg.seq
                self._applied += 1
                self.on_change(msg.seq, msg.payload)
            elif msg.seq > self.seq + 1:
                self._gap(msg.seq)
            # msg.seq <= self.seq: already in the snapshot
        elif msg.seq > self.seq:
            # Messages arrive in publish order, so change msg.seq came before this heartbeat
            # and it is not here: lost (the publisher's queue for us overflowed).
            self._gap(msg.seq)

    def _gap(self, got: int) -> None:
        gap = GapDetected(self.seq + 1, got)
        self.gaps += 1
        self._need_snapshot = True
        log.warning("subscriber of %r: %s", self.topic, gap)
        if self.on_gap is not None:
            self.on_gap(gap)

    def start(self) -> None:
        """Run :meth:`pump` on a background thread until :meth:`close` (it becomes the owner)."""
        self._owner = None
        self._thread = threading.Thread(target=self._loop, name="sub", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.pump(0.05)
            except PearlError as e:  # snapshot timed out: try again on the next round
                log.warning("subscriber of %r: %s", self.topic, e)
                self._stop.wait(0.2)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._sock.close(linger=0)

    def __enter__(self) -> Subscriber:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["GapDetected", "Payload", "Publisher", "Subscriber"]
