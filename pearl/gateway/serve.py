"""Serving the gateway inside pearld (and the embedded Runtime): uvicorn on a thread of its own,
with its own event loop, so that HTTP never runs on an actor's thread.

:class:`GatewayServer` binds its socket on the caller's thread before anything serves: an address
in use (or malformed, or not permitted) fails the start with one line naming it. ``stop`` asks
uvicorn to finish (open streams are closed) and joins its thread.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import threading
import time
from typing import Any

from pearl.config import read_small_file
from pearl.core.address import parse_address
from pearl.core.errors import ConfigError, PearlError

log = logging.getLogger("pearl.gateway")

START_S = 10.0  # uvicorn's start-up (the app's lifespan) on its thread
STOP_S = 10.0


class GatewayBindFailed(PearlError):
    """The gateway cannot listen on ``gateway.listen``."""


def bind(listen: str) -> socket.socket:
    """A listening TCP socket on ``listen`` (HOST:PORT; port 0: any free one)."""
    host, port = parse_address(listen, "gateway.listen")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # Accepted connections inherit it: uvicorn sets it only on the sockets it binds itself,
        # and without it every small response waits on Nagle's delayed-ACK timer.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((host, port))
        sock.listen(2048)
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

    def __init__(self, app: Any, listen: str, sock: socket.socket | None = None) -> None:
        """``sock``: bound already by :func:`bind` (pearld binds before it writes anything);
        the server owns it from here on."""
        import uvicorn

        self.listen = listen
        self._sock = sock if sock is not None else bind(listen)
        host, port = self._sock.getsockname()[:2]
        self.address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="auto")
        self._server = uvicorn.Server(config)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="gateway", daemon=True)

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
        loop = asyncio.new_event_loop()
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


__all__ = ["GatewayBindFailed", "GatewayServer", "bind", "read_api_key"]
