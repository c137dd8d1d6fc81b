"""Request/reply over ROUTER/DEALER: a threaded :class:`Server` and a Lazy Pirate :class:`Client`.

A server handler is a plain callable ``handler(env: Envelope) -> reply``: it gets the decoded
request and returns a registered message, a :class:`Reply` (message plus bulk frames), or
``None`` for one-way messages (heartbeats). :func:`dispatch` builds one from a table of message
types. Handlers run on the server's own thread, one at a time.
A server given a ``liveness`` listener beats it for every message it reads (any message is a
heartbeat) and tells it when input waits unread and when it has caught up, so that a slow
handler never makes a peer look silent.

Bad input never stops a server: whatever the codec rejects gets an ``error`` reply with a code
(:class:`~transports.protocol.ErrorCode`); a handler raising :class:`PearlError` gets a
``rejected`` error reply, any other exception an ``internal`` one (logged with its traceback).

Clients retry the *same* request id after a timeout, on a new socket (Lazy Pirate); the server
remembers recent replies by ``(sender, id)`` and answers a retry from that cache, so a handler
never runs twice for one request while it is remembered. A client's ``timeout_s`` bounds each
attempt, or with ``whole_timeout`` the whole request, its retries shared out within it: what an
interactive client promises its user (a dead server is reported within the timeout, not after
``1 + retries`` of them).

Thread safety: ZeroMQ sockets are not thread-safe. A server's socket is touched only by its
thread. A client serialises callers with an internal lock (one request in flight at a time);
give each busy thread its own client for parallel requests.
"""

from __future__ import annotations

import itertools
import logging
import os
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import zmq

from pearl.core.errors import PearlError, ProtocolError
from pearl.core.schema import WireStruct
from transports.auth import (
    ClientKeys,
    ServerKeys,
    check_bind,
    release_server,
    secure_client,
    secure_server,
)
from transports.codec import BadMessage, Codec, Envelope, Frame
from transports.heartbeat import Listener
from transports.protocol import (
    POLL_MS,
    REQUEST_RETRIES,
    REQUEST_TIMEOUT_S,
    Error,
    ErrorCode,
    Limits,
)

log = logging.getLogger(__name__)

MAX_ERROR_TEXT = 2000  # error replies stay small whatever the exception says
REPLY_CACHE = 1024  # recent replies kept for retried requests


@dataclass(frozen=True, slots=True)
class Reply:
    """A reply message with bulk frames sent after its envelope (zero-copy)."""

    msg: WireStruct
    frames: Sequence[Frame] = ()


#: answers a request: its reply (a message, or one with bulk frames), or None for no reply
Handler = Callable[[Envelope], "WireStruct | Reply | None"]
# Told (message kind, outcome, seconds) for every message a Server answers: the outcome is "ok" or
# the error reply's ErrorCode; a message that does not decode has the kind MALFORMED.
Observer = Callable[[str, str, float], None]
MALFORMED = "?"


class RemoteError(PearlError):
    """The server answered with an ``error`` message."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.remote_message = message


class RequestTimeout(PearlError):
    """No reply after every retry."""


def _unserved(env: Envelope) -> NoReturn:
    raise PearlError(f"{env.kind!r} reached a server with no handler")  # never: serve() sets one


def dispatch(table: Mapping[type, Handler]) -> Handler:
    """A handler calling ``table[type(env.msg)]``; other kinds get an ``unexpected`` error."""

    def handle(env: Envelope) -> WireStruct | Reply | None:
        fn = table.get(type(env.msg))
        if fn is None:
            served = sorted(t.KIND for t in table)  # type: ignore[attr-defined]
            raise BadMessage(ErrorCode.UNEXPECTED, f"{env.kind!r} is not served here; {served}")
        return fn(env)

    return handle


def _socket(ctx: zmq.Context[Any], kind: int, limits: Limits) -> zmq.Socket[Any]:
    sock = ctx.socket(kind)
    sock.linger = 0
    sock.setsockopt(zmq.MAXMSGSIZE, limits.max_message)  # libzmq drops larger frames unread
    return sock


class Server:
    """A ROUTER endpoint answering requests on its own thread until :meth:`close`.

    Made with ``handler`` None, it is bound but not served: requests wait in ZeroMQ's queue until
    :meth:`serve` (a daemon binds first, so that a taken address fails it before it changes
    anything, and answers once it can)."""

    def __init__(
        self,
        address: str,
        handler: Handler | None,
        *,
        ctx: zmq.Context[Any] | None = None,
        keys: ServerKeys | None = None,
        limits: Limits | None = None,
        name: str = "server",
        liveness: Listener | None = None,
        observer: Observer | None = None,
    ) -> None:
        check_bind(address, keys)
        self.handler: Handler = handler or _unserved
        self.name = name
        self.liveness = liveness
        self.observer = observer
        self.codec = Codec(limits)
        self.ctx = ctx or zmq.Context.instance()
        self.served = 0  # requests answered by the handler
        self.rejected = 0  # error replies for bad input or failing handlers
        # The server keys its reply cache by (sender, id): a new client under a reused name (a
        # CLI run, a restarted worker host) must not meet the replies of an earlier one.
        self._ids = itertools.count(secrets.randbits(40) + 1)
        self._cache: OrderedDict[tuple[str, int], list[Frame]] = OrderedDict()
        self._domain: str | None = None
        self._sock = _socket(self.ctx, zmq.ROUTER, self.codec.limits)
        self._wake_addr = f"inproc://pearl-server-wake-{id(self)}-{secrets.token_hex(4)}"
        self._wake_rx = self.ctx.socket(zmq.PAIR)
        self._wake_tx = self.ctx.socket(zmq.PAIR)
        try:
            if keys is not None:
                self._domain = secure_server(self._sock, keys)
            self._sock.bind(address)
            self._wake_rx.linger = self._wake_tx.linger = 0
            self._wake_rx.bind(self._wake_addr)
            self._wake_tx.connect(self._wake_addr)
        except BaseException:
            self._close_sockets()
            raise
        self.address: str = self._sock.get_string(zmq.LAST_ENDPOINT)
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"rpc-{name}", daemon=True)
        if handler is not None:
            self._thread.start()

    def serve(self, handler: Handler) -> None:
        """Start answering, with ``handler``, a server made without one."""
        if self._thread.is_alive() or self._closed:
            raise PearlError(f"rpc server {self.name} is already serving or closed")
        self.handler = handler
        self._thread.start()

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop serving, join the thread and close the sockets. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._thread.ident is not None:  # started
            self._wake_tx.send(b"", zmq.NOBLOCK)
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                raise PearlError(f"rpc server {self.name} did not stop within {timeout_s}s")
        self._close_sockets()

    def _close_sockets(self) -> None:
        for s in (self._sock, self._wake_rx, self._wake_tx):
            s.close(linger=0)
        if self._domain is not None:
            release_server(self.ctx, self._domain)
            self._domain = None

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the loop -----------------------------------------------------------------------------

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._wake_rx, zmq.POLLIN)
        while True:
            events = dict(poller.poll(POLL_MS))
            if self._wake_rx in events or self._closed:
                return
            live = self.liveness
            if live is not None:
                if self._sock in events:
                    live.behind()  # until the burst is read, silence is judged no later than now
                else:
                    live.caught_up()  # an empty poll: this loop is not starved, judge at now
                    continue
            # Drain a burst, then look at the wake socket again. EVENTS instead of catching
            # zmq.Again: an exception per request costs more than the check.
            sock = self._sock
            for _ in range(1000):
                if not int(sock.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
                    if live is not None:
                        live.caught_up()
                    break
                parts = sock.recv_multipart(zmq.NOBLOCK, copy=False)
                try:
                    self._serve(parts)
                except Exception:  # never let one message take the server down
                    log.exception("rpc server %s: failed to answer a message", self.name)

    def _serve(self, parts: list[zmq.Frame]) -> None:
        t0 = time.perf_counter()
        kind, outcome = MALFORMED, ErrorCode.INTERNAL  # unless _answer says how it went
        try:
            kind, outcome = self._answer(parts)
        finally:
            if self.observer is not None:
                self.observer(kind, outcome, time.perf_counter() - t0)

    def _answer(self, parts: list[zmq.Frame]) -> tuple[str, str]:
        """Answer one message; (its kind, how it went: "ok" or the error reply's code)."""
        identity = parts[0].bytes
        try:
            env = self.codec.decode(parts[1:])
        except BadMessage as e:
            self._error(identity=identity, code=e.code, text=str(e), corr=e.corr)
            return MALFORMED, e.code
        if self.liveness is not None:
            self.liveness.beat(env.sender)
        key = (env.sender, env.id)
        cached = self._cache.get(key) if env.id else None
        if cached is not None:
            self._sock.send_multipart([identity, *cached], copy=False)
            return env.kind, "ok"
        try:
            out = self.handler(env)
        except BadMessage as e:
            self._error(identity=identity, code=e.code, text=str(e), corr=env.id, key=key)
            return env.kind, e.code
        except PearlError as e:
            self._error(
                identity=identity,
                code=ErrorCode.REJECTED,
                text=f"{type(e).__name__}: {e}",
                corr=env.id,
                key=key,
            )
            return env.kind, ErrorCode.REJECTED
        except Exception as e:
            log.exception("rpc server %s: handler failed on %r", self.name, env.kind)
            self._error(
                identity=identity,
                code=ErrorCode.INTERNAL,
                text=f"{type(e).__name__}: {e}",
                corr=env.id,
                key=key,
            )
            return env.kind, ErrorCode.INTERNAL
        if out is None:
            return env.kind, "ok"
        msg, bulk = (out.msg, out.frames) if isinstance(out, Reply) else (out, ())
        try:
            frames = self.codec.encode(
                msg, id=next(self._ids), corr=env.id, sender=self.name, frames=bulk
            )
        except ProtocolError as e:
            log.error("rpc server %s: handler reply to %r unsendable: %s", self.name, env.kind, e)
            self._error(
                identity=identity, code=ErrorCode.INTERNAL, text=str(e), corr=env.id, key=key
            )
            return env.kind, ErrorCode.INTERNAL
        self.served += 1
        if env.id and not bulk:
            self._remember(key, frames)
        self._sock.send_multipart([identity, *frames], copy=False)
        return env.kind, "ok"

    def _error(
        self, identity: bytes, code: str, text: str, corr: int, key: tuple[str, int] | None = None
    ) -> None:
        self.rejected += 1
        msg = Error(code=code, message=text[:MAX_ERROR_TEXT])
        frames = self.codec.encode(msg, id=next(self._ids), corr=corr, sender=self.name)
        if key is not None and key[1]:
            self._remember(key, frames)
        self._sock.send_multipart([identity, *frames])

    def _remember(self, key: tuple[str, int], frames: list[Frame]) -> None:
        self._cache[key] = frames
        if len(self._cache) > REPLY_CACHE:
            self._cache.popitem(last=False)


def _left(end: float) -> float:
    return max(0.0, end - time.monotonic())


class Client:
    """A DEALER that sends one request at a time and waits for its reply (Lazy Pirate)."""

    def __init__(
        self,
        address: str,
        *,
        ctx: zmq.Context[Any] | None = None,
        keys: ClientKeys | None = None,
        limits: Limits | None = None,
        name: str | None = None,
        timeout_s: float = REQUEST_TIMEOUT_S,
        retries: int = REQUEST_RETRIES,
        backoff_s: float = 0.05,
        max_backoff_s: float = 2.0,
        whole_timeout: bool = False,
    ) -> None:
        self.address = address
        self.whole_timeout = whole_timeout  # timeout_s bounds the request, not each attempt
        self.ctx = ctx or zmq.Context.instance()
        self.keys = keys
        self.codec = Codec(limits)
        self.name = name or f"client-{os.getpid()}-{secrets.token_hex(4)}"
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.reconnects = 0
        # The server keys its reply cache by (sender, id): a new client under a reused name (a
        # CLI run, a restarted worker host) must not meet the replies of an earlier one.
        self._ids = itertools.count(secrets.randbits(40) + 1)
        self._lock = threading.Lock()
        self._sock: zmq.Socket[Any] | None = self._connect()

    def _connect(self) -> zmq.Socket[Any]:
        sock = _socket(self.ctx, zmq.DEALER, self.codec.limits)
        if self.keys is not None:
            secure_client(sock, self.keys)
        self._connecting(sock)
        sock.connect(self.address)
        return sock

    def _connecting(self, sock: zmq.Socket[Any]) -> None:
        """Hook: ``sock`` replaces the client's socket and is about to connect."""

    def _closing(self, sock: zmq.Socket[Any]) -> None:
        """Hook: the client's socket ``sock`` is about to be closed (under the client's lock)."""

    def _request_ends(self) -> None:
        """Hook: a request was answered or given up on (under the client's lock)."""

    def _timeout(self, msg: WireStruct, timeout: float, tries: int) -> RequestTimeout:
        """The error for a request nobody answered (under the client's lock, before the client
        moves to a new socket)."""
        took = (
            f"within {timeout:g}s ({tries} attempt{'s' if tries > 1 else ''})"
            if self.whole_timeout
            else f"after {tries} attempt(s) of {timeout:g}s"
        )
        return RequestTimeout(
            f"no reply from {self.address} to {msg.KIND!r} {took}; is the server running and "
            "is the address right?"
        )

    def _reconnect(self) -> zmq.Socket[Any]:
        if self._sock is not None:
            self._closing(self._sock)
            self._sock.close(linger=0)
        self.reconnects += 1
        self._sock = self._connect()
        return self._sock

    def request(
        self,
        msg: WireStruct,
        timeout_s: float | None = None,
        *,
        retries: int | None = None,
        frames: Sequence[Frame] = (),
    ) -> Any:
        """Send ``msg``, return the reply message; an ``error`` reply raises RemoteError."""
        env = self.request_envelope(msg, timeout_s, retries=retries, frames=frames)
        if isinstance(env.msg, Error):
            raise RemoteError(env.msg.code, env.msg.message)
        return env.msg

    def request_envelope(
        self,
        msg: WireStruct,
        timeout_s: float | None = None,
        *,
        retries: int | None = None,
        frames: Sequence[Frame] = (),
    ) -> Envelope:
        """Like :meth:`request` but returns the whole reply (bulk frames, sender); no raise."""
        timeout = self.timeout_s if timeout_s is None else timeout_s
        tries = 1 + (self.retries if retries is None else retries)
        with self._lock:
            if self._sock is None:
                raise PearlError(f"client of {self.address} is closed")
            rid = next(self._ids)
            out = self.codec.encode(msg, id=rid, sender=self.name, frames=frames)
            try:
                return self._attempts(msg=msg, out=out, rid=rid, timeout=timeout, tries=tries)
            finally:
                self._request_ends()

    def _attempts(
        self, msg: WireStruct, out: list[Frame], rid: int, timeout: float, tries: int
    ) -> Envelope:
        """Send ``out`` (request ``rid``) up to ``tries`` times, under the client's lock: its
        reply, or RequestTimeout."""
        end = time.monotonic() + timeout if self.whole_timeout else None
        backoff = self.backoff_s
        for attempt in range(tries):
            if attempt:
                # The server may be restarting: give it room.
                time.sleep(backoff if end is None else min(backoff, _left(end)))
                backoff = min(backoff * 2, self.max_backoff_s)
                self._reconnect()
            # Whole: this attempt's share of what is left (a retry the server has answered
            # already is answered again from its reply cache: a short share costs nothing).
            wait = timeout if end is None else _left(end) / (tries - attempt)
            sock = self._sock
            assert sock is not None  # under the lock: only close() clears it
            try:
                sock.send_multipart(out, zmq.NOBLOCK, copy=False)
            except zmq.Again:
                time.sleep(wait)  # nowhere to queue it: counts as a lost attempt
                continue
            reply = self._await(sock, rid, time.monotonic() + wait)
            if reply is not None:
                return reply
            log.info(
                "no reply from %s to %r within %.2fs (attempt %d/%d)",
                self.address,
                msg.KIND,
                wait,
                attempt + 1,
                tries,
            )
        error = self._timeout(msg, timeout, tries)
        # The request may still sit in the old socket's queue; never deliver it later.
        self._reconnect()
        raise error

    def _await(self, sock: zmq.Socket[Any], rid: int, deadline: float) -> Envelope | None:
        while True:
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0 or not sock.poll(left_ms, zmq.POLLIN):
                return None
            env = self.codec.decode(sock.recv_multipart(copy=False))
            if env.corr == rid:
                return env
            log.debug("dropping stale reply %d (waiting for %d)", env.corr, rid)

    def send(self, msg: WireStruct, frames: Sequence[Frame] = ()) -> bool:
        """One-way message (heartbeat, event without ack); False if it could not be queued."""
        with self._lock:
            if self._sock is None:
                raise PearlError(f"client of {self.address} is closed")
            out = self.codec.encode(msg, id=next(self._ids), sender=self.name, frames=frames)
            try:
                self._sock.send_multipart(out, zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return False
            return True

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                self._closing(self._sock)
                self._sock.close(linger=0)
                self._sock = None

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = [
    "MALFORMED",
    "Client",
    "Handler",
    "Observer",
    "RemoteError",
    "Reply",
    "RequestTimeout",
    "Server",
    "dispatch",
]
