"""The metrics port is a bounded surface (issue 35): connections cost at most MAX_CONNECTIONS
threads, a scrape displaces the oldest silent connection (never one being answered), a silent one
is dropped after the read timeout, close() is prompt with the cap held, and ``daemon.metrics``
binds beyond loopback only with ``daemon.metrics_public``."""

from __future__ import annotations

import contextlib
import socket
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from pearl import config as config_mod
from pearl.core.errors import ConfigError
from pearl.metrics import MAX_CONNECTIONS, HostMetrics, MetricsServer, check_exposure

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "sim-32.toml"
FLOOD = 200  # idle sockets: the cap, the backlog (128), and some whose SYNs are retried


@contextlib.contextmanager
def idle_sockets(address: str, n: int) -> Iterator[list[socket.socket]]:
    """``n`` TCP connections to ``address`` that never send a byte (connects left in flight:
    beyond the server's backlog the kernel keeps retrying them)."""
    host, _, port = address.rpartition(":")
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex((host, int(port)))
            socks.append(s)
        yield socks
    finally:
        for s in socks:
            s.close()


def scrape(address: str, timeout_s: float = 60.0) -> bytes:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=timeout_s) as r:
        body: bytes = r.read()
    return body


def test_idle_connections_take_at_most_the_cap_of_threads_and_a_scrape_answers() -> None:
    """200 sockets that never send a byte, held open: the server runs the cap of threads, and a
    scrape displaces the oldest idle one, answered long before any read timeout frees a slot."""
    server = MetricsServer(HostMetrics(3, 7, "sim"), "127.0.0.1:0", read_timeout_s=120.0)
    base = threading.active_count()
    most, done = [0], threading.Event()

    def sample() -> None:
        while not done.wait(0.005):
            most[0] = max(most[0], threading.active_count() - base)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        with idle_sockets(server.address, FLOOD):
            assert server.wait_connections(MAX_CONNECTIONS, 30.0), server.connections
            assert b"pearl_worker_info" in scrape(server.address, timeout_s=60.0)
            assert server.connections <= MAX_CONNECTIONS
        assert server.wait_connections(0, 30.0), server.connections  # the flood closed: all go
    finally:
        done.set()
        sampler.join()
        server.close()
    assert most[0] <= MAX_CONNECTIONS + 1, most[0]  # + the sampler


class Gate:
    """An exposition that answers only once let through, counting those waiting."""

    def __init__(self) -> None:
        self.open, self.waiting = threading.Event(), threading.Semaphore(0)

    def exposition(self) -> bytes:
        self.waiting.release()
        self.open.wait(30.0)
        return b"# nothing\n"


def test_connections_answering_a_request_are_never_displaced() -> None:
    gate = Gate()
    server = MetricsServer(gate, "127.0.0.1:0", max_connections=2, read_timeout_s=30.0)
    got: list[bytes] = []
    threads = [
        threading.Thread(target=lambda: got.append(scrape(server.address))) for _ in range(3)
    ]
    try:
        for t in threads[:2]:
            t.start()
        assert gate.waiting.acquire(timeout=30.0) and gate.waiting.acquire(timeout=30.0)
        threads[2].start()  # waits for a slot: both are answering
        assert server.connections == 2
        gate.open.set()
        for t in threads:
            t.join(30.0)
        assert got == [b"# nothing\n"] * 3
    finally:
        gate.open.set()
        server.close()


def test_an_idle_connection_is_dropped_after_the_read_timeout() -> None:
    server = MetricsServer(HostMetrics(3, 7, "sim"), "127.0.0.1:0", read_timeout_s=0.2)
    host, _, port = server.address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=30.0) as s:
            assert s.recv(1) == b""  # the server closed it; no request was ever sent
        assert server.wait_connections(0, 30.0)
    finally:
        server.close()


def test_close_is_prompt_with_the_cap_held() -> None:
    server = MetricsServer(
        HostMetrics(3, 7, "sim"), "127.0.0.1:0", max_connections=2, read_timeout_s=60.0
    )
    with idle_sockets(server.address, 10):
        assert server.wait_connections(2, 30.0)
        closer = threading.Thread(target=server.close)
        closer.start()
        closer.join(10.0)  # not the 60 s a held slot would take to free
        assert not closer.is_alive()


@pytest.mark.parametrize(
    "address", ["127.0.0.1:9440", "127.3.4.5:0", "localhost:9440", "[::1]:9440"]
)
def test_loopback_metrics_need_no_flag(address: str) -> None:
    check_exposure(address, public=False)
    cfg = config_mod.load(CONFIG, [f"daemon.metrics={address}"])
    assert cfg.daemon.metrics == address and not cfg.daemon.metrics_public


@pytest.mark.parametrize("address", ["0.0.0.0:9440", "10.1.2.3:9440", "[::]:9440", "host:9440"])
def test_metrics_beyond_loopback_need_the_explicit_flag(address: str) -> None:
    with pytest.raises(ConfigError) as e:
        config_mod.load(CONFIG, [f"daemon.metrics={address}"])
    msg = str(e.value)
    assert "\n" not in msg, msg
    assert f"refusing to serve daemon.metrics on {address}" in msg, msg
    assert "--set daemon.metrics_public=true" in msg and "127.0.0.1:PORT" in msg, msg
    cfg = config_mod.load(CONFIG, [f"daemon.metrics={address}", "daemon.metrics_public=true"])
    assert cfg.daemon.metrics_public
