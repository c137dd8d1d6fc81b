"""Snapshot + numbered changes: nothing lost at join time, gaps detected and healed."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import zmq

from pearl.testing.wait import wait_until
from transports.codec import Envelope
from transports.protocol import Snapshot, Subscribe
from transports.pubsub import GapDetected, Publisher, Subscriber
from transports.rpc import Client, Server, dispatch

Ctx = zmq.Context[Any]


class Owner:
    """The state owner (pearld's Orchestrator in real life): changes state, publishes, snapshots."""

    def __init__(self, pub: Publisher) -> None:
        self.pub = pub
        self.data: dict[str, int] = {}

    def set(self, key: str, value: int) -> int:
        with self.pub.lock:  # state change and publish are one step for snapshots
            self.data[key] = value
            return self.pub.publish({"set": {key: value}})

    def on_subscribe(self, env: Envelope) -> Snapshot:
        return self.pub.snapshot(lambda: {"data": dict(self.data)})


class Mirror:
    def __init__(self) -> None:
        self.data: dict[str, int] = {}
        self.seqs: list[int] = []
        self.snapshots: list[int] = []
        self.gaps: list[GapDetected] = []

    def on_snapshot(self, seq: int, payload: dict[str, Any]) -> None:
        self.data = dict(payload["data"])
        self.snapshots.append(seq)

    def on_change(self, seq: int, payload: dict[str, Any]) -> None:
        self.data.update(payload["set"])
        self.seqs.append(seq)


@pytest.fixture
def endpoints(ctx: Ctx, ipc: Callable[[], str]) -> Iterator[tuple[Owner, Server]]:
    pub = Publisher(ipc(), ctx=ctx, heartbeat_s=0.2)
    owner = Owner(pub)
    server = Server(ipc(), dispatch({Subscribe: lambda env: owner.on_subscribe(env)}), ctx=ctx)
    yield owner, server
    server.close()
    owner.pub.close()


def subscriber(
    ctx: Ctx, owner: Owner, server: Server, mirror: Mirror, client: Client
) -> Subscriber:
    return Subscriber(
        owner.pub.address,
        client,
        ctx=ctx,
        heartbeat_s=0.2,
        on_snapshot=mirror.on_snapshot,
        on_change=mirror.on_change,
        on_gap=mirror.gaps.append,
    )


def pump_until(sub: Subscriber, cond: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        sub.pump(0.02)


@pytest.fixture
def client(ctx: Ctx, endpoints: tuple[Owner, Server]) -> Iterator[Client]:
    with Client(endpoints[1].address, ctx=ctx, timeout_s=2.0) as c:
        yield c


def test_snapshot_then_every_change_in_order(ctx: Ctx, endpoints: Any, client: Client) -> None:
    owner, server = endpoints
    for i in range(5):
        owner.set(f"k{i}", i)
    mirror = Mirror()
    with subscriber(ctx=ctx, owner=owner, server=server, mirror=mirror, client=client) as sub:
        assert sub.sync() == 5
        assert mirror.data == owner.data and mirror.snapshots == [5]
        for i in range(10):
            owner.set(f"k{i % 7}", 100 + i)
        pump_until(sub, lambda: sub.seq == 15)
        assert mirror.seqs == list(range(6, 16))
        assert mirror.data == owner.data
        assert mirror.gaps == [] and sub.alive()


def test_snapshot_waits_until_the_subscription_is_live(
    ctx: Ctx, endpoints: Any, client: Client
) -> None:
    owner, server = endpoints
    seen_at_snapshot: list[int] = []
    on_subscribe = owner.on_subscribe

    def spy(env: Envelope) -> Snapshot:
        seen_at_snapshot.append(owner.pub.subscriptions)
        return on_subscribe(env)

    owner.on_subscribe = spy  # type: ignore[method-assign]
    owner.set("a", 1)  # then a quiet publisher: only its greeting tells the subscriber it is in
    mirror = Mirror()
    with subscriber(ctx=ctx, owner=owner, server=server, mirror=mirror, client=client) as sub:
        assert sub.sync() == 1
    assert seen_at_snapshot == [1]


def test_changes_published_while_joining_are_not_lost(
    ctx: Ctx, endpoints: Any, client: Client
) -> None:
    owner, server = endpoints
    stop = threading.Event()
    n = [0]

    def churn() -> None:
        while not stop.is_set() and n[0] < 20000:
            n[0] += 1
            owner.set(f"k{n[0] % 50}", n[0])
            if n[0] % 20 == 0:
                time.sleep(0.0005)  # stay under the publisher's queue limit for one subscriber

    writer = threading.Thread(target=churn)
    writer.start()
    mirror = Mirror()
    try:
        with subscriber(ctx=ctx, owner=owner, server=server, mirror=mirror, client=client) as sub:
            sub.sync()
            pump_until(sub, lambda: len(mirror.seqs) > 200)
            stop.set()
            writer.join()
            final = owner.pub.seq
            pump_until(sub, lambda: sub.seq == final)
            assert mirror.data == owner.data
            assert mirror.gaps == [] and len(mirror.snapshots) == 1
            assert mirror.seqs == list(range(mirror.snapshots[0] + 1, final + 1))
    finally:
        stop.set()
        writer.join()


def test_missing_number_is_a_gap_and_heals_by_resnapshot(
    ctx: Ctx, endpoints: Any, client: Client
) -> None:
    owner, server = endpoints
    mirror = Mirror()
    with subscriber(ctx=ctx, owner=owner, server=server, mirror=mirror, client=client) as sub:
        owner.set("a", 1)
        sub.sync()
        with owner.pub.lock:  # a change the subscriber never receives (queue overflow)
            owner.data["lost"] = 7
            owner.pub.seq += 1
        owner.set("b", 2)
        pump_until(sub, lambda: mirror.gaps != [])
        assert (mirror.gaps[0].expected, mirror.gaps[0].got) == (2, 3)
        pump_until(sub, lambda: mirror.data == owner.data)
        assert mirror.data["lost"] == 7 and sub.seq == 3 and sub.gaps == 1
        assert len(mirror.snapshots) == 2


def test_lost_last_change_is_seen_through_the_heartbeat(
    ctx: Ctx, endpoints: Any, client: Client
) -> None:
    owner, server = endpoints
    mirror = Mirror()
    with subscriber(ctx=ctx, owner=owner, server=server, mirror=mirror, client=client) as sub:
        sub.sync()
        with owner.pub.lock:
            owner.data["tail"] = 1
            owner.pub.seq += 1
        owner.pub.heartbeat()
        pump_until(sub, lambda: mirror.data == owner.data)
        assert [(g.expected, g.got) for g in mirror.gaps] == [(1, 1)]


def test_publisher_restart_means_a_new_snapshot(
    ctx: Ctx, ipc: Callable[[], str], client: Client, endpoints: Any
) -> None:
    owner, server = endpoints
    mirror = Mirror()
    with subscriber(ctx=ctx, owner=owner, server=server, mirror=mirror, client=client) as sub:
        for i in range(3):
            owner.set("x", i)
        sub.sync()
        address = owner.pub.address
        owner.pub.close()
        owner.pub = Publisher(address, ctx=ctx, heartbeat_s=0.2)  # numbering restarts at 1
        owner.data = {"fresh": 1}
        owner.set("y", 9)
        pump_until(sub, lambda: mirror.data == owner.data)
        assert sub.incarnation == owner.pub.incarnation and len(mirror.gaps) >= 1


def test_background_thread(ctx: Ctx, endpoints: Any, client: Client) -> None:
    owner, server = endpoints
    mirror = Mirror()
    sub = subscriber(ctx=ctx, owner=owner, server=server, mirror=mirror, client=client)
    sub.start()
    try:
        for i in range(20):
            owner.set(f"k{i}", i)
        wait_until(lambda: mirror.data == owner.data, 5, "the mirror to catch up", every=0.01)
    finally:
        sub.close()
    assert mirror.gaps == []


def test_a_second_thread_is_refused(ctx: Ctx, endpoints: Any, client: Client) -> None:
    owner, server = endpoints
    mirror = Mirror()
    errors: list[BaseException] = []
    with subscriber(ctx=ctx, owner=owner, server=server, mirror=mirror, client=client) as sub:
        sub.sync()

        def other() -> None:
            try:
                sub.pump(0)
            except BaseException as e:
                errors.append(e)

        t = threading.Thread(target=other)
        t.start()
        t.join()
    assert len(errors) == 1 and "not thread-safe" in str(errors[0])
