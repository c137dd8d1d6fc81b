"""The gateway's bounds on a real uvicorn server: connections over the cap refused at once, a
late head or body answered 408 and closed, generation requests of every kind counted, and a
request aborted in the pool when its client leaves, streamed or not."""

from __future__ import annotations

import resource
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from pearl.gateway.app import build_app
from pearl.gateway.serve import GatewayServer, connection_cap, fd_limit, raise_fd_limit
from pearl.testing.wait import wait_until
from tests.gateway.scripted import ScriptedBackend

MODEL = "scripted-model"


@contextmanager
def gateway(backend: ScriptedBackend, **bounds: object) -> Iterator[GatewayServer]:
    """The app over ``backend`` served by :class:`GatewayServer` on a free loopback port."""
    app_keys = {"api_key", "max_streams", "body_timeout_s", "allowed_origins", "max_body_bytes"}
    app = build_app(backend, **{k: v for k, v in bounds.items() if k in app_keys})  # type: ignore[arg-type]
    server_keys = {k: v for k, v in bounds.items() if k not in app_keys}
    server = GatewayServer(app, "127.0.0.1:0", **server_keys).start()  # type: ignore[arg-type]
    try:
        yield server
    finally:
        server.stop()


def head(server: GatewayServer) -> bytes:
    """The start of a request's head to ``server``, its headers to follow."""
    return b"POST /v1/completions HTTP/1.1\r\nHost: %s\r\n" % server.address.encode()


def connect(server: GatewayServer) -> socket.socket:
    host, port = server.address.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=10)


def response(sock: socket.socket) -> bytes:
    """One whole response (its head and a Content-Length body)."""
    out = b""
    while b"\r\n\r\n" not in out:
        out += sock.recv(65536)
    head, _, body = out.partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body


def until_closed(sock: socket.socket) -> bytes:
    """Every byte the server sends until it closes the connection (10 s at most)."""
    out = b""
    while chunk := sock.recv(65536):
        out += chunk
    return out


def test_connections_over_the_cap_are_answered_429_and_closed_without_a_read() -> None:
    with gateway(ScriptedBackend(), max_connections=2, header_timeout_s=60) as server:
        held = [connect(server), connect(server)]
        for s in held:
            s.sendall(head(server))  # half a head: the connection stays open
        wait_until(lambda: server.open_connections == 2, 10, "two connections open")
        with connect(server) as extra:  # it sends nothing: the refusal comes unasked
            answer = until_closed(extra)
        top, _, body = answer.partition(b"\r\n\r\n")
        assert top.startswith(b"HTTP/1.1 429 ") and b"retry-after: 1" in top
        assert b"rate_limit_error" in body and b"limit 2" in body
        assert server.open_connections == 2
        held.pop().close()
        wait_until(lambda: server.open_connections == 1, 10, "the closed connection gone")
        assert httpx.get(f"http://{server.address}/v1/models", timeout=10).status_code == 200
        for s in held:
            s.close()


def test_the_connection_cap_stays_within_a_quarter_of_the_fd_limit() -> None:
    assert connection_cap(1 << 40) == fd_limit() // 4
    assert connection_cap(3) == min(3, fd_limit() // 4)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    raised = raise_fd_limit()
    assert raised >= soft and (hard == resource.RLIM_INFINITY or raised == hard)


def test_a_late_head_is_answered_408_and_an_idle_connection_closed() -> None:
    with gateway(ScriptedBackend(), header_timeout_s=0.3) as server:
        with connect(server) as slow:
            slow.sendall(head(server) + b"X-Slow: ")
            answer = until_closed(slow)
        assert answer.startswith(b"HTTP/1.1 408 ") and b"did not arrive within 0.3 s" in answer
        with connect(server) as idle:  # connected, silent: closed without an answer
            assert until_closed(idle) == b""
        with connect(server) as kept:  # the next head on a kept-alive connection is due too
            kept.sendall(b"GET /v1/models HTTP/1.1\r\nHost: %s\r\n\r\n" % server.address.encode())
            assert response(kept).startswith(b"HTTP/1.1 200 ")
            kept.sendall(b"GET /v1/models HTTP/1.1\r\n")
            assert until_closed(kept).startswith(b"HTTP/1.1 408 ")
        wait_until(lambda: server.open_connections == 0, 10, "every connection closed")


def test_a_head_over_its_bound_is_refused() -> None:
    with gateway(ScriptedBackend(), header_timeout_s=60) as server, connect(server) as big:
        big.sendall(head(server) + b"X-Big: " + b"a" * (80 << 10))  # and still no end of the head
        assert until_closed(big).startswith(b"HTTP/1.1 431 ")


@pytest.mark.parametrize("key", [None, "sk-k"])
def test_a_late_body_is_answered_408_and_closed_with_or_without_a_key(key: str | None) -> None:
    backend = ScriptedBackend()
    with gateway(backend, api_key=key, body_timeout_s=0.3, header_timeout_s=60) as server:
        with connect(server) as slow:
            auth = f"Authorization: Bearer {key}\r\n".encode() if key else b""
            slow.sendall(head(server) + auth + b"Content-Length: 100\r\n\r\n" + b'{"model": ')
            answer = until_closed(slow)
        assert answer.startswith(b"HTTP/1.1 408 ")
        assert b"body did not arrive within 0.3 s" in answer
    assert backend.calls == []


def test_generation_requests_streamed_or_not_share_one_bound_and_a_429_names_when() -> None:
    gate = threading.Event()
    backend = ScriptedBackend(gate=gate)
    body = {"model": MODEL, "prompt": "hi"}
    with gateway(backend, max_streams=2) as server, httpx.Client() as http:
        url = f"http://{server.address}"
        done: list[int] = []
        waiting = [  # two requests that do not stream, held by the backend's gate
            threading.Thread(
                target=lambda: done.append(
                    http.post(f"{url}/v1/completions", json=body, timeout=30).status_code
                )
            )
            for _ in range(2)
        ]
        for t in waiting:
            t.start()
        wait_until(lambda: len(backend.calls) == 2, 10, "two requests in the backend")
        for path, extra in [("/v1/completions", {}), ("/v1/completions", {"stream": True})]:
            r = http.post(f"{url}{path}", json={**body, **extra}, timeout=10)
            assert r.status_code == 429 and r.headers["retry-after"] == "1"
            assert r.json()["error"]["type"] == "rate_limit_error"
        r = http.post(f"{url}/generate", json={"input_ids": [1]}, timeout=10)
        assert r.status_code == 429
        assert http.get(f"{url}/pearl/v1/status", timeout=10).status_code == 200
        gate.set()
        for t in waiting:
            t.join(30)
        assert done == [200, 200]
        assert http.post(f"{url}/v1/completions", json=body, timeout=10).status_code == 200


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_leaves_aborts_its_request_in_the_pool(stream: bool) -> None:
    gate = threading.Event()
    backend = ScriptedBackend(gate=gate, replies=["a long reply that waits on the gate"])
    try:
        with gateway(backend, max_streams=1, header_timeout_s=60) as server:
            with connect(server) as client:
                body = b'{"model": "%s", "prompt": "hi", "stream": %s}' % (
                    MODEL.encode(),
                    b"true" if stream else b"false",
                )
                client.sendall(
                    head(server) + b"Content-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n" % len(body) + body
                )
                wait_until(lambda: len(backend.calls) == 1, 10, "the request in the backend")
            # The client left: the backend's generator is closed (PoolBackend's cancels the
            # request in the pool), and its slot is free.
            wait_until(lambda: backend.closed == [backend.calls[0].rid], 10, "the abort")
            gate.set()
            r = httpx.post(
                f"http://{server.address}/v1/completions",
                json={"model": MODEL, "prompt": "hi"},
                timeout=10,
            )
            assert r.status_code == 200
    finally:
        gate.set()


def test_a_body_is_not_counted_in_the_head_and_a_head_sent_slowly_still_is() -> None:
    """A 300 KiB body arriving with its head is the app's to judge, not a 431; a head over its
    bound arriving 1 KiB at a time is refused all the same."""
    with gateway(ScriptedBackend(), header_timeout_s=60) as server:
        with connect(server) as big:
            body = b'{"model": "m", "prompt": "' + b"a" * (300 << 10) + b'"}'
            big.sendall(head(server) + b"Content-Type: application/json\r\n"
                        + b"Content-Length: %d\r\n\r\n" % len(body) + body)  # fmt: skip
            assert not response(big).startswith(b"HTTP/1.1 431 ")
        with connect(server) as slow:
            slow.sendall(head(server) + b"X-Slow: ")
            for _ in range(65):  # just over 64 KiB in all: nothing follows the refusal
                slow.sendall(b"a" * 1024)
            assert until_closed(slow).startswith(b"HTTP/1.1 431 ")
