"""Serve an app with uvicorn on a loopback port in a background thread, for real clients."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn
from fastapi import FastAPI

from pearl.testing.wait import wait_until


@contextmanager
def serve(app: FastAPI) -> Iterator[str]:
    """The app's base URL while it serves; on exit, ``should_exit`` and the thread joined."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # uvicorn leaves Nagle on for a socket it is handed: a response's head and body would then
    # wait on the client's delayed ACK (40 ms each). Accepted sockets inherit this option.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started or not thread.is_alive(), 30, "uvicorn to start")
        assert thread.is_alive(), "uvicorn stopped while starting"
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass  # it accepts
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
        assert not thread.is_alive(), "uvicorn did not stop"
