"""The HTTP side of PEARL's metrics: ``GET /metrics`` on one port, a bounded surface.

The port has no authentication, so it follows the API's bind rule: loopback only, unless the
operator says otherwise (``daemon.metrics_public``, :func:`check_exposure`). Every other path is
404 and no other method is served. One thread per connection, at most :data:`MAX_CONNECTIONS` at
once: at the cap a new connection displaces the oldest one that has not yet sent a whole request
(a scrape sends its request at once, an idle or stalled socket never does), and when every
connection is answering one, the accept loop waits for a slot while newer connections queue in
the kernel's backlog, with no thread or file. A connection silent for :data:`READ_TIMEOUT_S` is
dropped. So idle sockets cost pearld at most the cap in threads, and a scrape still answers.
"""

from __future__ import annotations

import contextlib
import http.server
import socket
import socketserver
import threading
from typing import Protocol, TypeAlias

from prometheus_client.exposition import CONTENT_TYPE_LATEST

from pearl.core.address import check_exposure, parse_address
from pearl.core.errors import ConfigError

MAX_CONNECTIONS = 64  # connection threads of one metrics server
READ_TIMEOUT_S = 5.0  # a connection silent this long is dropped (a scrape sends at once)


#: what socketserver hands a server (a TCP server's is always the socket)
Request: TypeAlias = "socket.socket | tuple[bytes, socket.socket]"


def _socket(request: Request) -> socket.socket:
    return request if isinstance(request, socket.socket) else request[1]


class Exposition(Protocol):
    def exposition(self) -> bytes: ...


class MetricsServer:
    """``GET /metrics`` of ``metrics`` over HTTP on a daemon thread; 404 for any other path.
    ``where`` names the setting of ``address`` in errors. At most ``max_connections`` connection
    threads; a connection silent for ``read_timeout_s`` is dropped."""

    def __init__(
        self,
        metrics: Exposition,
        address: str,
        where: str = "daemon.metrics",
        *,
        max_connections: int = MAX_CONNECTIONS,
        read_timeout_s: float = READ_TIMEOUT_S,
    ) -> None:
        host, port = parse_address(address, where)
        handler = _handler(metrics, read_timeout_s)
        server = _Server6 if ":" in host else _Server
        try:
            self._server = server((host, port), handler, max_connections)
        except OSError as e:
            raise ConfigError(f"{where} = {address!r}: cannot listen there: {e}") from None
        bound = self._server.server_address[1]
        self.address = f"[{host}]:{bound}" if ":" in host else f"{host}:{bound}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="metrics-http", daemon=True
        )
        self._thread.start()

    @property
    def connections(self) -> int:
        """Connections being served now (each on its own thread)."""
        return self._server.busy

    def wait_connections(self, n: int, timeout_s: float) -> bool:
        """True once exactly ``n`` connections are being served; False after ``timeout_s``."""
        with self._server.slots:
            return self._server.slots.wait_for(lambda: self._server.busy == n, timeout_s)

    def close(self) -> None:
        self._server.closing()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5.0)


class _Server(http.server.ThreadingHTTPServer):
    """One thread per connection, at most ``cap`` at once (see the module's docstring)."""

    daemon_threads = True
    # The listen backlog: connections that wait in the kernel (no thread, no file) while every
    # slot answers a request; one queued here is served in turn instead of having its SYN
    # dropped and retried after 1, 3, 7 s.
    request_queue_size = 128

    def __init__(
        self, address: tuple[str, int], handler: type[http.server.BaseHTTPRequestHandler], cap: int
    ) -> None:
        self.cap, self.busy, self._closing = cap, 0, False
        self.slots = threading.Condition()
        # Connections whose request has not fully arrived, oldest first: the ones to displace.
        self._waiting: dict[Request, None] = {}
        super().__init__(address, handler)

    def process_request(self, request: Request, client_address: tuple[str, int]) -> None:
        with self.slots:
            while self.busy >= self.cap and not self._closing:
                if self._waiting:  # displace the oldest silent one: its thread ends at once
                    oldest = next(iter(self._waiting))
                    del self._waiting[oldest]
                    with contextlib.suppress(OSError):
                        _socket(oldest).shutdown(socket.SHUT_RDWR)
                self.slots.wait(0.5)  # a slot frees within READ_TIMEOUT_S; close() wakes it
            if self._closing:
                self.shutdown_request(request)
                return
            self.busy += 1
            self._waiting[request] = None
            self.slots.notify_all()
        try:
            super().process_request(request, client_address)
        except BaseException:  # no thread started (out of threads): give the slot back
            self.shutdown_request(request)
            self._release()
            raise

    def process_request_thread(self, request: Request, client_address: tuple[str, int]) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._release()

    def request_arrived(self, request: Request) -> None:
        """The connection sent a whole request: it is answered, never displaced."""
        with self.slots:
            self._waiting.pop(request, None)

    def shutdown_request(self, request: Request) -> None:
        # Under the lock a displacing shutdown() never meets a socket being closed here (whose
        # file number could already belong to another).
        with self.slots:
            self._waiting.pop(request, None)
            super().shutdown_request(request)

    def _release(self) -> None:
        with self.slots:
            self.busy -= 1
            self.slots.notify_all()

    def closing(self) -> None:
        """Stop waiting for slots: shutdown() must not wait behind a full server."""
        with self.slots:
            self._closing = True
            self.slots.notify_all()

    def server_bind(self) -> None:
        # HTTPServer.server_bind asks DNS for the host's full name: slow or hanging on a machine
        # without a resolver, and only used for a CGI variable.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)


class _Server6(_Server):
    address_family = socket.AF_INET6


def _handler(
    metrics: Exposition, read_timeout_s: float
) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        timeout = read_timeout_s  # per socket read: an idle or stalled client is dropped

        def parse_request(self) -> bool:
            ok = super().parse_request()  # the request line and the headers have arrived
            if ok:
                self.server.request_arrived(self.connection)  # type: ignore[attr-defined]
            return ok

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if self.path.split("?", 1)[0] != "/metrics":
                self.send_error(404, "only /metrics is served here")
                return
            body = metrics.exposition()
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE_LATEST)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass  # scrapes every few seconds would drown pearld's log

    return Handler


__all__ = [
    "MAX_CONNECTIONS",
    "READ_TIMEOUT_S",
    "Exposition",
    "MetricsServer",
    "check_exposure",
    "parse_address",
]
