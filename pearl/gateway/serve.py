"""Serving the gateway inside pearld (and the embedded Runtime): uvicorn on a thread of its own,
with its own event loop, so that HTTP never runs on an actor's thread. The loop is uvloop's and
the HTTP/1.1 parser httptools' (llhttp): both C, where asyncio's own loop and h11 are Python.

:class:`GatewayServer` binds its socket on the caller's thread before anything serves: an address
in use (or malformed, or not permitted) fails the start with one line naming it. ``stop`` asks
uvicorn to finish (open streams are closed) and joins its thread.

Connections are bounded before any request is read (``BoundedHttpTools``, uvicorn's httptools
protocol):
- at most ``max_connections`` are open at once, never more than a quarter of the process's
  open-file limit. One more is answered 429 with ``Retry-After`` and closed at once, without
  reading it. Connections are accepted at most ``cap / 2`` at a time, and a refused one holds
  its descriptor for a few turns of the event loop, so the gateway's descriptors stay below
  two thirds of the limit: the rest is pearld's own (ZeroMQ, worker hosts, the event log);
- a request's head (request line and headers, at most ``MAX_HEAD_BYTES``) must arrive within
  ``header_timeout_s`` of the connection's open or of the previous response's end: else 408 and
  the connection closes (silently when no byte of a next request came: an idle keep-alive
  connection). The body's own deadline is the app's (:class:`pearl.gateway.app.Guard`).

pearld raises its soft open-file limit to the hard one at start (:func:`raise_fd_limit`).
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import resource
import socket
import threading
import time
from typing import Any

import uvloop

from pearl.config import read_small_file
from pearl.core.address import parse_address
from pearl.core.errors import ConfigError, PearlError

log = logging.getLogger("pearl.gateway")

START_S = 10.0  # uvicorn's start-up (the app's lifespan) on its thread
STOP_S = 10.0
MAX_HEAD_BYTES = 64 << 10  # a request line and its headers
KEEP_ALIVE_S = 5  # seconds: an idle connection between requests is closed after this


def fd_limit() -> int:
    """The process's soft limit on open files."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def raise_fd_limit() -> int:
    """Raise the soft open-file limit to the hard one (pearld at start); the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (ValueError, OSError) as e:  # e.g. above the kernel's nr_open
            log.warning("cannot raise the open-file limit from %d to %d: %s", soft, want, e)
    return fd_limit()


def connection_cap(max_connections: int) -> int:
    """``max_connections``, but never more than a quarter of the open-file limit (at least 1)."""
    return max(1, min(max_connections, fd_limit() // 4))


def _raw_response(status: int, reason: str, message: str, extra: str = "") -> bytes:
    """A whole HTTP/1.1 response that closes the connection, with OpenAI's error body."""
    kind = "rate_limit_error" if status == 429 else "invalid_request_error"
    body = json.dumps(
        {"error": {"message": message, "type": kind, "param": None, "code": None}}
    ).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n{extra}connection: close\r\n\r\n"
    )
    return head.encode() + body


def bounded_protocol(max_connections: int, header_timeout_s: float) -> type[Any]:
    """uvicorn's httptools protocol with these bounds (see the module); one class per server."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    full = _raw_response(
        status=429,
        reason="Too Many Requests",
        message=f"too many open connections (limit {max_connections}); retry later",
        extra="retry-after: 1\r\n",
    )
    late = _raw_response(
        408, "Request Timeout", f"the request head did not arrive within {header_timeout_s:g} s"
    )
    big = _raw_response(
        431,
        "Request Header Fields Too Large",
        f"the request line and headers are over {MAX_HEAD_BYTES >> 10} KiB",
    )

    class BoundedHttpTools(HttpToolsProtocol):
        """One connection; refused at once beyond the cap, closed when a head is late or over
        its bound. A head is due (its timer armed) from the connection's open, and from each
        response's end, until the parser has read all of it."""

        refused = False
        head_timer: asyncio.TimerHandle | None = None
        head_bytes = 0  # bytes received since the head timer was armed

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            if len(self.connections) >= max_connections:
                self.refused = True
                transport.write(full)
                transport.close()
                return
            super().connection_made(transport)
            self.arm()

        def connection_lost(self, exc: Exception | None) -> None:
            if self.refused:
                return
            self.disarm()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.head_timer is None:  # no head due, or this data completed it
                return
            self.head_bytes += len(data)
            if self.head_bytes > MAX_HEAD_BYTES and not self.transport.is_closing():
                self.disarm()
                self.transport.write(big)
                self.transport.close()

        def on_headers_complete(self) -> None:
            self.disarm()  # the head is whole: the body's deadline is the app's
            super().on_headers_complete()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.pipeline and not self.transport.is_closing():
                self.arm()  # the next request's head is due

        def arm(self) -> None:
            self.disarm()
            self.head_bytes = 0
            self.head_timer = self.loop.call_later(header_timeout_s, self.head_late)

        def disarm(self) -> None:
            if self.head_timer is not None:
                self.head_timer.cancel()
                self.head_timer = None

        def head_late(self) -> None:
            self.head_timer = None
            if self.transport.is_closing():
                return
            if self.head_bytes:  # part of a request came: say why it is closed
                self.transport.write(late)
            self.transport.close()

    return BoundedHttpTools


class GatewayBindFailed(PearlError):
    """The gateway cannot listen on ``gateway.listen``."""


def bind(listen: str, *, reuse_port: bool = False, backlog: int | None = 2048) -> socket.socket:
    """A TCP socket bound on ``listen`` (HOST:PORT; port 0: any free one) and listening with
    ``backlog``. ``reuse_port``: shared with other sockets bound so (``SO_REUSEPORT``): the
    kernel spreads connections over those that listen. ``backlog`` None: bound, not listening
    (pearld holds the port of its gateway processes so)."""
    host, port = parse_address(listen, "gateway.listen")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        # Accepted connections inherit it: uvicorn sets it only on the sockets it binds itself,
        # and without it every small response waits on Nagle's delayed-ACK timer.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((host, port))
        if backlog is not None:
            sock.listen(backlog)
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            why = "the address is already in use (another program listens there)"
        else:
            why = e.strerror or str(e)
        raise GatewayBindFailed(
            f"cannot serve gateway.listen on {listen}: {why}; stop it or set another gateway.listen"
        ) from None
    sock.setblocking(False)
    return sock


def read_api_key(path: str) -> str | None:
    """The API key in ``path`` (surrounding whitespace stripped); None when no file is set."""
    if not path:
        return None
    # Bounded: a device (/dev/zero) or a FIFO would block pearld's start forever.
    key = read_small_file(path, "gateway.api_key_file").strip()
    if not key:
        raise ConfigError(f"gateway.api_key_file = {path!r} is empty: write the API key in it")
    return key


class GatewayServer:
    """One ASGI app served by uvicorn on its own thread and event loop (see the module)."""

    def __init__(
        self,
        app: Any,
        listen: str,
        sock: socket.socket | None = None,
        *,
        max_connections: int = 1024,
        header_timeout_s: float = 10.0,
    ) -> None:
        """``sock``: bound already by :func:`bind` (pearld binds before it writes anything);
        the server owns it from here on. The bounds are the module's."""
        import uvicorn

        self.listen = listen
        self._sock = sock if sock is not None else bind(listen)
        host, port = self._sock.getsockname()[:2]
        self.address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self.max_connections = connection_cap(max_connections)
        config = uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,
            lifespan="auto",
            http=bounded_protocol(self.max_connections, header_timeout_s),
            timeout_keep_alive=KEEP_ALIVE_S,
            # Connections accepted in one go (and the listen queue): beyond the cap each holds
            # a descriptor until it is refused (see the module).
            backlog=max(16, min(2048, self.max_connections // 2)),
        )
        self._server = uvicorn.Server(config)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="gateway", daemon=True)

    @property
    def open_connections(self) -> int:
        """HTTP connections open now (those refused over the cap not counted)."""
        return len(self._server.server_state.connections)

    def start(self) -> GatewayServer:
        """Serve; returns once uvicorn is up (raises, in one line, when it is not)."""
        self._thread.start()
        # uvicorn marks itself started on its thread; a failed start-up ends the thread.
        pause, deadline = threading.Event(), time.monotonic() + START_S
        while not self._server.started and self._thread.is_alive():
            if time.monotonic() > deadline:
                break
            pause.wait(0.01)
        if not self._server.started:
            self.stop()
            why = self._error or "its start-up failed (see the log above)"
            raise PearlError(f"the gateway on {self.address} did not start: {why}")
        log.info("gateway at http://%s/v1", self.address)
        return self

    def _run(self) -> None:
        loop = uvloop.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._server.serve(sockets=[self._sock]))
        except BaseException as e:  # reported by start(), or logged when serving stops
            self._error = e
            log.warning("gateway on %s stopped: %s", self.address, e)
        finally:
            loop.close()

    def stop(self) -> None:
        """Ask uvicorn to finish and wait for its thread; the socket is closed."""
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(STOP_S)
            if self._thread.is_alive():
                self._server.force_exit = True
                self._thread.join(STOP_S)
        self._sock.close()


__all__ = [
    "GatewayBindFailed",
    "GatewayServer",
    "bind",
    "bounded_protocol",
    "connection_cap",
    "raise_fd_limit",
    "read_api_key",
]
