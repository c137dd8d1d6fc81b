"""The routes feed (pearld's side) and the pieces a gateway process routes with: a subscriber
holds exactly pearld's state, whether it joins before or after the changes; a worker host
answers each request to the Router that sent it; the rendezvous home is shared by Routers that
never talk."""

from __future__ import annotations

import threading
from typing import Any

from actors import names
from actors.base import Directory
from actors.messages import Generate
from actors.router import Router, WorkerGone
from actors.worker_host import QueuedRef, Replies
from pearl.core.routing import hashed_home
from pearl.gateway.feed import HostUp, RouteFeed, read_change, read_snapshot
from pearl.testing.wait import wait_until
from tests.actors.test_router import changed, turn
from transports.pubsub import Subscriber
from transports.rpc import Client


class Copy:
    """A gateway process's copy of the feed, applied as it arrives."""

    def __init__(self) -> None:
        self.view: Any = None
        self.hosts: dict[int, HostUp] = {}
        self.gone: list[WorkerGone] = []
        self.lock = threading.Lock()

    def snapshot(self, seq: int, payload: dict[str, Any]) -> None:
        view, hosts = read_snapshot(payload)
        with self.lock:
            self.view, self.hosts = view, {h.worker: h for h in hosts}

    def change(self, seq: int, payload: dict[str, Any]) -> None:
        msg = read_change(payload)
        with self.lock:
            if isinstance(msg, HostUp):
                self.hosts[msg.worker] = msg
            elif isinstance(msg, WorkerGone):
                self.gone.append(msg)
                if (
                    msg.worker in self.hosts
                    and self.hosts[msg.worker].incarnation == msg.incarnation
                ):
                    del self.hosts[msg.worker]
            elif msg is not None:
                self.view = msg


def subscribe(feed: RouteFeed, copy: Copy) -> Subscriber:
    pub, rpc = feed.addresses
    sub = Subscriber(
        pub, Client(rpc, timeout_s=5.0), on_snapshot=copy.snapshot, on_change=copy.change,
        topic="routes",
    )  # fmt: skip
    sub.start()
    return sub


def test_a_subscriber_holds_pearlds_routes_whenever_it_joins() -> None:
    feed = RouteFeed("127.0.0.1")
    early, late = Copy(), Copy()
    subs = [subscribe(feed, early)]
    try:
        wait_until(lambda: early.view is None and subs[0].synced, 10, "the first snapshot")
        first = HostUp(worker=1, incarnation=1, address="tcp://127.0.0.1:1", kv_address="kv1")
        feed.tell(first)
        feed.tell(HostUp(worker=2, incarnation=1, address="tcp://127.0.0.1:2"))
        feed.tell(changed([1, 2]))
        feed.tell(WorkerGone(2, 1, "exited"))
        feed.tell(WorkerGone(1, 0, "an older incarnation"))  # not the live host: it stays
        view = changed([1])
        feed.tell(view)
        subs.append(subscribe(feed, late))
        for copy in (early, late):
            wait_until(lambda c=copy: c.view == view, 10, "the last view")
            assert copy.hosts == {1: first}
        assert [g.reason for g in early.gone] == ["exited", "an older incarnation"]
        assert late.gone == []  # a joiner gets the state, not the history
    finally:
        for s in subs:
            s.close()
        feed.close()


class Sink:
    name = "sink"

    def __init__(self) -> None:
        self.got: list[object] = []

    def tell(self, msg: object) -> None:
        self.got.append(msg)

    def ask(self, msg: object, timeout_s: float = 0.0) -> None:
        self.tell(msg)


def test_a_host_resolves_a_gateway_routers_name_to_one_courier_per_address() -> None:
    replies = Replies(None, "worker-1.1-g")
    try:
        directory = Directory(resolve=replies)
        a = directory.find(names.at(names.ROUTER, "tcp://127.0.0.1:5001"))
        assert isinstance(a, QueuedRef) and a.name == names.ROUTER
        assert directory.find(names.at(names.ROUTER, "tcp://127.0.0.1:5001")) is a
        assert directory.find(names.at(names.ROUTER, "tcp://127.0.0.1:5002")) is not a
        assert directory.find(names.at(names.TRACKER, "tcp://127.0.0.1:5001")) is None
        assert directory.find("router") is None  # pearld's Router is registered, not resolved
        for port in range(Replies.MAX_PEERS):
            directory.find(names.at(names.ROUTER, f"tcp://127.0.0.1:{6000 + port}"))
        assert len(replies.peers) == Replies.MAX_PEERS  # the least recently used were closed
        assert "tcp://127.0.0.1:5001" not in replies.peers
    finally:
        replies.close()


def test_a_gateway_router_asks_hosts_to_answer_at_its_own_address() -> None:
    directory = Directory()
    sent: list[Generate] = []

    class Worker(Sink):
        def tell(self, msg: object) -> None:
            assert isinstance(msg, Generate)
            sent.append(msg)

    for w in (1, 2, 3):
        worker = Worker()
        worker.name = names.worker_name(w)
        directory.register(worker)
    directory.register(Sink())
    r = Router(directory, reply_to="tcp://127.0.0.1:7001", hashed=True)
    r.state_changed(changed([1, 2, 3]))
    assert turn(r, "session-a") == hashed_home("session-a", [1, 2, 3])  # not the least loaded
    assert sent[-1].reply_to == "tcp://127.0.0.1:7001"
    home = hashed_home("session-b", [1, 2, 3])
    r.load = {w: 1 if w == home else 0 for w in (1, 2, 3)}  # home is busier, within the slack
    assert turn(r, "session-b") == home
    plain = Router(directory)  # pearld's: a new trajectory goes least loaded, answered by name
    plain.state_changed(changed([1, 2, 3]))
    plain.load = {w: 1 if w == home else 0 for w in (1, 2, 3)}
    assert turn(plain, "session-b") != home and sent[-1].reply_to == ""


def test_a_wildcard_address_is_given_as_one_another_machine_can_dial() -> None:
    from pearl.gateway.feed import reachable, serving_host

    assert reachable("tcp://127.0.0.1:5001") == "tcp://127.0.0.1:5001"
    assert reachable("ipc:///tmp/pearl.sock") == "ipc:///tmp/pearl.sock"
    host, _, port = reachable("tcp://0.0.0.0:5001").removeprefix("tcp://").rpartition(":")
    assert port == "5001" and host not in ("0.0.0.0", "*", "")
    assert serving_host("tcp://10.0.0.5:7440") == "10.0.0.5"
    assert serving_host("ipc:///tmp/pearld.sock") == "127.0.0.1"
