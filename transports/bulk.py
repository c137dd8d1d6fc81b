"""Bulk data peer to peer over ZeroMQ: KV caches prefill -> decode, and weight snapshots.

One message is a multipart ZeroMQ message ``[header, buffer, buffer, ...]``: the header is a small
msgpack mapping (protocol version, transfer id, the sender's meta, a send timestamp and the size of
every buffer), the buffers are raw bytes sent zero-copy (``copy=False``). Nothing is pickled.

:class:`ZmqKVChannel` binds one PULL inbox per engine and drains it, when polled, into a
buffer keyed by transfer id (a transfer may arrive before its decode request; the buffer is bounded
in bytes and entries expire after a TTL), and sends through one PUSH socket per peer.
:class:`LocalKVHub` gives in-process channels with the same behaviour, for unit tests.
``bulk_send`` / ``bulk_recv`` are the raw framing, usable on any PUSH/PULL pair
(weights, baselines); secure such a pair with :func:`transports.auth.secure_server` and
:func:`~transports.auth.secure_client`.

With keys (a worker host's :class:`~transports.auth.HostKeys`), the inbox is a CURVE server that
accepts only the keys it is given, and every push is a CURVE client; without keys the inbox must
bind a local address (:func:`~transports.auth.check_bind`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import msgpack
import zmq

from pearl.core.errors import EngineError, KVTimeout
from transports.auth import (
    ClientKeys,
    ServerKeys,
    check_bind,
    release_server,
    secure_client,
    secure_server,
)

log = logging.getLogger(__name__)

BULK_VERSION = 1
MAX_HEADER_BYTES = 1 << 20  # meta is small; a larger header is a protocol error, not a KV cache

Frames = list[Any]


def bulk_send(
    sock: zmq.Socket, transfer_id: str, meta: dict[str, Any], frames: Sequence[Any]
) -> int:
    """Send one bulk message zero-copy; returns the payload bytes. Buffers must not change after."""
    views = [memoryview(f).cast("B") for f in frames]
    header = msgpack.packb(
        {
            "v": BULK_VERSION,
            "tid": transfer_id,
            "meta": meta,
            "sent_at": time.time(),  # wall clock: comparable across processes of one host
            "sizes": [v.nbytes for v in views],
        }
    )
    sock.send_multipart([header, *views], copy=False)
    return sum(v.nbytes for v in views)


def decode_header(parts: Sequence[Any]) -> tuple[str, dict[str, Any], Frames]:
    """Check one received multipart message; returns (transfer id, meta, payload buffers)."""
    if not parts:
        raise EngineError("bulk message has no frames; expected [header, buffers...]")
    raw = parts[0].bytes if isinstance(parts[0], zmq.Frame) else bytes(parts[0])
    if len(raw) > MAX_HEADER_BYTES:
        raise EngineError(f"bulk header of {len(raw)} bytes exceeds {MAX_HEADER_BYTES}")
    try:
        h = msgpack.unpackb(raw)
    except Exception as e:  # any malformed msgpack
        raise EngineError(f"bulk header is not msgpack: {e}") from None
    if not isinstance(h, dict) or h.get("v") != BULK_VERSION:
        got = h.get("v") if isinstance(h, dict) else type(h).__name__
        raise EngineError(f"bulk header version {got!r}, expected {BULK_VERSION}")
    tid, meta, sizes = h.get("tid"), h.get("meta"), h.get("sizes")
    if not isinstance(tid, str) or not isinstance(meta, dict) or not isinstance(sizes, list):
        raise EngineError("bulk header lacks tid/meta/sizes")
    bufs = [p.buffer if isinstance(p, zmq.Frame) else memoryview(p) for p in parts[1:]]
    if [b.nbytes for b in bufs] != sizes:
        got = [b.nbytes for b in bufs]
        raise EngineError(f"bulk message {tid!r}: frame sizes {got}, header says {sizes}")
    meta = dict(meta)
    meta["sent_at"] = float(h.get("sent_at", 0.0))
    return tid, meta, bufs


def bulk_recv(sock: zmq.Socket, timeout_s: float) -> tuple[str, dict[str, Any], Frames]:
    """Receive one bulk message (zero-copy buffers); raises KVTimeout when none comes in time."""
    if not sock.poll(max(0, int(timeout_s * 1000))):
        raise KVTimeout(f"no bulk message within {timeout_s:.3f}s")
    parts = sock.recv_multipart(copy=False)
    tid, meta, bufs = decode_header(parts)
    meta["arrived_at"] = time.time()
    return tid, meta, bufs


def make_socket(ctx: zmq.Context, kind: int) -> zmq.Socket:
    s = ctx.socket(kind)
    s.setsockopt(zmq.LINGER, 0)
    return s


class _Inbox:
    """Transfers that arrived, keyed by id, bounded in bytes and age; thread-safe."""

    def __init__(self, max_bytes: int, ttl_s: float) -> None:
        self.max_bytes, self.ttl_s = max_bytes, ttl_s
        self.cv = threading.Condition()
        self.items: OrderedDict[str, tuple[dict[str, Any], Frames, int, float]] = OrderedDict()
        self.bytes = 0
        self.dropped = 0

    def put(self, tid: str, meta: dict[str, Any], frames: Frames, age_s: float = 0.0) -> None:
        """Buffer one transfer; ``age_s``: how long ago it was sent (its TTL runs from then)."""
        size = sum(memoryview(f).nbytes for f in frames)
        with self.cv:
            self._expire(time.monotonic())
            if size > self.max_bytes:
                self.dropped += 1
                log.warning("KV transfer %s (%d bytes) exceeds the inbox bound; dropped", tid, size)
                return
            if tid in self.items:
                self._drop(tid, "replaced by a newer transfer with the same id")
            while self.items and self.bytes + size > self.max_bytes:
                self._drop(next(iter(self.items)), "inbox full")
            self.items[tid] = (meta, frames, size, time.monotonic() - max(age_s, 0.0))
            self.bytes += size
            self.cv.notify_all()

    def take(self, tid: str) -> tuple[dict[str, Any], Frames] | None:
        with self.cv:
            return self._take(tid)

    def wait(self, tid: str, timeout_s: float) -> tuple[dict[str, Any], Frames] | None:
        deadline = time.monotonic() + timeout_s
        with self.cv:
            while True:
                got = self._take(tid)
                left = deadline - time.monotonic()
                if got is not None or left <= 0:
                    return got
                self.cv.wait(min(left, 0.5))

    def _take(self, tid: str) -> tuple[dict[str, Any], Frames] | None:
        self._expire(time.monotonic())
        item = self.items.pop(tid, None)
        if item is None:
            return None
        self.bytes -= item[2]
        return item[0], item[1]

    def _expire(self, now: float) -> None:
        while self.items:
            tid, (_, _, _, t) = next(iter(self.items.items()))
            if now - t <= self.ttl_s:
                break
            self._drop(tid, f"unclaimed for {self.ttl_s:.0f}s")

    def _drop(self, tid: str, why: str) -> None:
        _, _, size, _ = self.items.pop(tid)
        self.bytes -= size
        self.dropped += 1
        log.warning("KV transfer %s dropped: %s", tid, why)


def _timeout_error(tid: str, timeout_s: float, address: str) -> KVTimeout:
    return KVTimeout(
        f"no KV cache arrived for transfer {tid!r} within {timeout_s:.3f}s at {address}; the "
        "prefill worker failed, was never sent the request, or sent it to another address: "
        "retry the request on a prefill/decode pair"
    )


class ZmqKVChannel:
    """A KVChannel over ZeroMQ: a PULL inbox bound on loopback (or ipc), PUSH sockets to peers.

    No receiver thread: libzmq's I/O thread takes the bytes off the wire, and ``poll``/``receive``
    move whatever has arrived into the inbox on the caller's thread. On a worker whose engine
    owns one core, a Python receiver thread would fight the engine for the GIL and the core on
    every transfer; here the engine loop drains its inbox between iterations instead.
    """

    def __init__(
        self,
        bind: str = "tcp://127.0.0.1:*",
        *,
        max_buffered_bytes: int = 4 << 30,
        ttl_s: float = 120.0,
        send_timeout_s: float = 30.0,
        context: zmq.Context | None = None,
        keys: ServerKeys | None = None,
        peer_keys: ClientKeys | None = None,
    ) -> None:
        check_bind(bind, keys)
        self._ctx = context or zmq.Context.instance()
        self._inbox = _Inbox(max_buffered_bytes, ttl_s)
        self._peer_keys = peer_keys
        self._domain: str | None = None
        self._pull = make_socket(self._ctx, zmq.PULL)
        try:
            if keys is not None:
                self._domain = secure_server(self._pull, keys)
            self._pull.bind(bind)
        except BaseException:
            self._pull.close(linger=0)
            if self._domain is not None:
                release_server(self._ctx, self._domain)
            raise
        self.address: str = self._pull.getsockopt_string(zmq.LAST_ENDPOINT)
        self._send_timeout_ms = int(send_timeout_s * 1000)
        self._peers: dict[str, zmq.Socket] = {}
        self._send_lock = threading.Lock()
        self._recv_lock = threading.Lock()  # the PULL socket is used by one thread at a time
        self._closed = False

    @property
    def dropped(self) -> int:
        """Transfers dropped unclaimed (expired, evicted from a full inbox, or malformed)."""
        return self._inbox.dropped

    def send(
        self, peer: str, transfer_id: str, meta: dict[str, Any], frames: Sequence[Any]
    ) -> None:
        with self._send_lock:
            if self._closed:
                raise EngineError(f"KV channel {self.address} is closed")
            sock = self._peers.get(peer)
            if sock is None:
                sock = self._peers[peer] = make_socket(self._ctx, zmq.PUSH)
                sock.setsockopt(zmq.SNDTIMEO, self._send_timeout_ms)
                if self._peer_keys is not None:
                    secure_client(sock, self._peer_keys)
                sock.connect(peer)
            try:
                bulk_send(sock=sock, transfer_id=transfer_id, meta=meta, frames=frames)
            except zmq.Again:
                raise EngineError(
                    f"KV send of {transfer_id!r} to {peer} timed out after "
                    f"{self._send_timeout_ms} ms; is the decode worker up?"
                ) from None

    def poll(self, transfer_id: str) -> tuple[dict[str, Any], Frames] | None:
        got = self._inbox.take(transfer_id)
        if got is None:
            self._drain(0)
            got = self._inbox.take(transfer_id)
        return got

    def receive(self, transfer_id: str, timeout_s: float) -> tuple[dict[str, Any], Frames]:
        deadline = time.monotonic() + timeout_s
        while (got := self._inbox.take(transfer_id)) is None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise _timeout_error(transfer_id, timeout_s, self.address)
            self._drain(int(min(left, 0.05) * 1000) + 1)
        return got

    def close(self) -> None:
        """Close every socket. Idempotent."""
        with self._send_lock, self._recv_lock:
            if self._closed:
                return
            self._closed = True
            for s in self._peers.values():
                s.close(linger=0)
            self._peers.clear()
            self._pull.close(linger=0)
            if self._domain is not None:
                release_server(self._ctx, self._domain)

    def _drain(self, wait_ms: int) -> None:
        """Move every message that has arrived into the inbox, waiting up to ``wait_ms`` for one."""
        with self._recv_lock:
            if self._closed:
                raise EngineError(f"KV channel {self.address} is closed")
            if not self._pull.poll(wait_ms):
                return
            while True:
                try:
                    parts = self._pull.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    return
                try:
                    tid, meta, bufs = decode_header(parts)
                except EngineError as e:  # bad input never takes the engine down
                    self._inbox.dropped += 1
                    log.warning("KV inbox %s: dropped a malformed message: %s", self.address, e)
                    continue
                meta["arrived_at"] = time.time()
                self._inbox.put(tid, meta, bufs, age_s=meta["arrived_at"] - meta["sent_at"])


class LocalKVHub:
    """In-process KV channels for unit tests: ``hub.channel("d0")`` has address ``local://d0``."""

    def __init__(self, max_buffered_bytes: int = 1 << 30, ttl_s: float = 120.0) -> None:
        self._bound = (max_buffered_bytes, ttl_s)
        self._inboxes: dict[str, _Inbox] = {}
        self._lock = threading.Lock()

    def channel(self, name: str) -> LocalKVChannel:
        address = f"local://{name}"
        with self._lock:
            if address in self._inboxes:
                raise EngineError(f"{address} is already bound")
            self._inboxes[address] = _Inbox(*self._bound)
        return LocalKVChannel(self, address)

    def _inbox(self, address: str) -> _Inbox:
        with self._lock:
            box = self._inboxes.get(address)
        if box is None:
            raise EngineError(f"no KV channel bound at {address}")
        return box


class LocalKVChannel:
    """A KVChannel between engines of one process; frames are copied like the wire would."""

    def __init__(self, hub: LocalKVHub, address: str) -> None:
        self._hub, self.address = hub, address

    def send(
        self, peer: str, transfer_id: str, meta: dict[str, Any], frames: Sequence[Any]
    ) -> None:
        copied = [memoryview(bytes(memoryview(f).cast("B"))) for f in frames]
        m = dict(meta, sent_at=time.time(), arrived_at=time.time())
        self._hub._inbox(peer).put(transfer_id, m, copied)

    def poll(self, transfer_id: str) -> tuple[dict[str, Any], Frames] | None:
        return self._hub._inbox(self.address).take(transfer_id)

    def receive(self, transfer_id: str, timeout_s: float) -> tuple[dict[str, Any], Frames]:
        got = self._hub._inbox(self.address).wait(transfer_id, timeout_s)
        if got is None:
            raise _timeout_error(transfer_id, timeout_s, self.address)
        return got

    def close(self) -> None:
        """Nothing to release; present for symmetry with ZmqKVChannel."""


__all__ = [
    "BULK_VERSION",
    "LocalKVChannel",
    "LocalKVHub",
    "ZmqKVChannel",
    "bulk_recv",
    "bulk_send",
    "decode_header",
    "make_socket",
]
