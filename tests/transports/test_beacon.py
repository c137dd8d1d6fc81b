"""The Beacon: beats on a fixed schedule from its own thread whatever the replies do, pauses,
replaces its socket after a silence; and a server that falls behind makes no peer look dead."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import zmq

from pearl.testing.wait import wait_until
from transports.beacon import Beacon
from transports.codec import Envelope
from transports.heartbeat import Liveness
from transports.protocol import Ping, Pong
from transports.rpc import Client, Server, dispatch


@pytest.fixture
def replies() -> list[Envelope]:
    return []


def beacon(address: str, ctx: Any, got: list[Envelope], interval_s: float = 0.1) -> Beacon:
    n = iter(range(1, 10**6))
    return Beacon(
        address,
        lambda: Ping(nonce=next(n)),
        got.append,
        interval_s=interval_s,
        name="host-beat",
        ctx=ctx,
    )


@pytest.fixture
def slow_server(ctx: zmq.Context[Any]) -> Iterator[tuple[Server, Liveness, threading.Event]]:
    """Answers pings at once, except that a ping with nonce 0 holds the server for 1.5 s."""
    live = Liveness(interval_s=0.1)
    release = threading.Event()

    def ping(env: Any) -> Pong:
        if env.msg.nonce == 0:
            release.wait(1.5)
        return Pong(nonce=env.msg.nonce)

    s = Server("tcp://127.0.0.1:*", dispatch({Ping: ping}), ctx=ctx, liveness=live)
    yield s, live, release
    s.close()


def test_beats_keep_their_schedule_and_a_server_behind_judges_no_one(
    ctx: zmq.Context[Any], slow_server: Any, replies: list[Envelope]
) -> None:
    server, live, _ = slow_server
    b = beacon(server.address, ctx, replies).start()
    b.paused = False
    stuck: list[float] = []

    def hold_the_server() -> None:
        with Client(server.address, ctx=ctx, timeout_s=5.0, retries=0) as other:
            t0 = time.monotonic()
            other.request(Ping(nonce=0))  # the server is stuck for 1.5 s: 15 intervals
            stuck.append(time.monotonic() - t0)

    try:
        wait_until(lambda: live.alive("host-beat") and b.sent >= 5, 5, "the first beats")
        t = threading.Thread(target=hold_the_server)
        t.start()
        time.sleep(1.0)  # no event: the point is 1 s of silence while the server is stuck
        # The beats wait unread behind the stuck handler: 1 s of silence is 10 missed intervals,
        # yet silence is judged only up to when the server fell behind.
        assert live.last_seen("host-beat") < time.monotonic() - 0.9  # type: ignore[operator]
        assert live.dead() == [] and live.alive("host-beat")
        t.join()
        assert stuck[0] >= 1.4
        # the server has read the waiting beats and new ones
        now = time.monotonic()
        wait_until(lambda: (live.last_seen("host-beat") or 0) > now, 5, "a beat after the stall")
        assert live.alive("host-beat") and "host-beat" not in live.dead()
        assert 15 <= b.sent <= 30, b.sent  # one per 0.1 s over ~1.8 s, replies slow or not
        assert b.replies > 0 and all(isinstance(e.msg, Pong) for e in replies)
    finally:
        b.close()


def test_a_paused_beacon_sends_nothing(
    ctx: zmq.Context[Any], slow_server: Any, replies: list[Envelope]
) -> None:
    server, live, _ = slow_server
    b = beacon(server.address, ctx, replies).start()
    try:
        time.sleep(0.35)  # no event: the point is that nothing is sent over 3 intervals
        assert b.sent == 0 and live.last_seen("host-beat") is None
        b.paused = False
        wait_until(lambda: b.sent >= 2 and live.alive("host-beat"), 5, "two beats")
    finally:
        b.close()


def test_silence_replaces_the_socket_and_beats_resume_when_the_peer_comes(
    ctx: zmq.Context[Any], replies: list[Envelope]
) -> None:
    probe = ctx.socket(zmq.ROUTER)
    port = probe.bind_to_random_port("tcp://127.0.0.1")
    probe.close(linger=0)
    address = f"tcp://127.0.0.1:{port}"
    b = beacon(address, ctx, replies, interval_s=0.05).start()
    b.paused = False
    try:
        # nobody there: > 3 intervals of silence, more than once
        wait_until(lambda: b.reconnects >= 1 and b.silent_s() >= 0.5, 5, "a reconnect")
        assert b.replies == 0
        with Server(address, dispatch({Ping: lambda env: Pong(nonce=env.msg.nonce)}), ctx=ctx):
            wait_until(lambda: b.replies > 0, 3.0, "a reply", every=0.02)
            assert b.silent_s() < 0.5
    finally:
        b.close()
