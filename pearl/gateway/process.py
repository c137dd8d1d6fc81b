"""One gateway process: ``python -m pearl.gateway.process ...`` (pearld starts ``gateway.processes``
of them, :mod:`pearl.gateway.processes`).

It serves the routes of pearld's in-process gateway (the same app, backend and Router) on the
same port: every process binds ``gateway.listen`` with ``SO_REUSEPORT`` and the kernel spreads the
connections over them. The data path runs here, off pearld's interpreter:

- a Router of its own, fed by pearld's routes feed (:mod:`pearl.gateway.feed`): the table's
  logged changes, the hosts' addresses and the hosts that died; flushed every daemon tick. So a
  reclaim, a notice or a return moves or migrates this process's requests with their prefixes,
  as pearld's Router does its own;
- couriers to the worker hosts, whose answers come back to this process's own rpc server
  (``Generate.reply_to``);
- sessions placed by rendezvous hashing over the serving workers (``Router(hashed=True)``), so
  that every process sends a session's turns to the same worker without sharing state;
- the Tracker hears the sessions' rollout steps, and status, events and ``/health`` are asked of
  pearld's actors, all over pearld's API (with the worker key pair when pearld has keys).

It stops serving and exits 0 on SIGTERM or SIGINT, and exits 1 when its Router dies, so that
pearld starts it again. It exits when pearld does (its parent process changes): a gateway
process never outlives its pearld.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from actors import names
from actors.base import CourierRef, Directory, LocalRef, RemoteRef, serve_directory, start
from actors.messages import Generate, GenerateDone, StateChanged
from actors.router import Flush, KvAddress, Router, WorkerGone
from pearl.config import Config
from pearl.config.loader import from_mapping
from pearl.core.errors import PearlError
from pearl.core.status import ClusterStatus
from pearl.gateway.feed import (
    TOPIC,
    HostUp,
    reachable,
    read_change,
    read_snapshot,
    serving_host,
)
from transports.auth import ClientKeys, DaemonKeys, HostKeys, ServerKeys
from transports.protocol import Status, StatusRequest
from transports.pubsub import Subscriber
from transports.rpc import Client, Server

log = logging.getLogger("pearl.gateway.process")

PARENT_POLL_S = 0.5  # how often the process looks whether pearld is still its parent
SYNC_S = 30.0  # the routes feed's first view, before serving


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="pearl-gateway-process")
    p.add_argument("--config", required=True, help="pearld's config, as JSON")
    p.add_argument("--endpoint", required=True, help="pearld's API")
    p.add_argument("--routes", required=True, help="the routes feed: PUB,RPC addresses")
    p.add_argument("--listen", required=True, help="HOST:PORT, shared with SO_REUSEPORT")
    p.add_argument("--index", type=int, required=True)
    p.add_argument("--ready", required=True, help="a file written once the process serves")
    return p.parse_args(argv)


def strip_none(data: dict[str, Any]) -> dict[str, Any]:
    """A config mapping without its unset (None) fields: those take their defaults."""
    return {
        k: strip_none(v) if isinstance(v, dict) else v for k, v in data.items() if v is not None
    }


@dataclass
class Keys:
    """This process's keys, from pearld's key directory (none on loopback without one)."""

    serve: ServerKeys | None = None  # its reply server: pearld's key pair, trusting the hosts
    to_pearld: ClientKeys | None = None  # the worker key pair, which pearld's API accepts
    to_hosts: ClientKeys | None = None  # pearld's key pair, which the hosts accept

    @classmethod
    def load(cls, keys_dir: str) -> Keys:
        if not keys_dir:
            return cls()
        daemon, host = DaemonKeys.load(keys_dir), HostKeys.load(keys_dir)
        worker = host.to_pearld.public
        serve = ServerKeys(daemon.api.public, daemon.api.secret, frozenset({worker}))
        return cls(serve=serve, to_pearld=host.to_pearld, to_hosts=daemon.hosts)


@dataclass
class Hosts:
    """The couriers to the worker hosts, as the feed says where they serve."""

    directory: Directory
    keys: Keys
    router: LocalRef
    up: dict[int, HostUp] = field(default_factory=dict)
    refs: dict[int, CourierRef] = field(default_factory=dict)

    def add(self, h: HostUp) -> None:
        old = self.up.get(h.worker)
        if old is not None and (old.incarnation, old.address) == (h.incarnation, h.address):
            return
        self.drop(h.worker)
        self.up[h.worker] = h
        ref = CourierRef(
            names.worker_name(h.worker),
            Client(h.address, keys=self.keys.to_hosts, timeout_s=2.0, retries=2),
            self._undeliverable,
        )
        self.refs[h.worker] = ref
        self.directory.register(ref)
        self.router.tell(KvAddress(h.worker, h.kv_address))

    def drop(self, worker: int) -> None:
        self.up.pop(worker, None)
        ref = self.refs.pop(worker, None)
        if ref is not None:
            self.directory.unregister(ref.name, ref)
            ref.close()

    def _undeliverable(self, name: str, msg: object, error: PearlError) -> None:
        """A request that cannot reach its host goes back to the Router, to be routed again
        elsewhere (pearld's supervisor judges the host)."""
        if isinstance(msg, Generate):
            worker = int(name.split("/", 1)[1])
            why = f"worker {worker} unreachable: {error}"
            self.router.tell(
                GenerateDone(
                    worker=worker, rid=msg.request.rid, result=None, error=why, retryable=True
                )
            )

    def close(self) -> None:
        for worker in list(self.refs):
            self.drop(worker)


class PearldStatus:
    """pearld's status as its API serves it, asked as the Orchestrator is in pearld (the
    backend's ``status``, ``/health``, a training event's default step): typed, and never older
    than an event this process saw acknowledged."""

    name = names.ORCHESTRATOR

    def __init__(self, client: Client) -> None:
        self.client = client

    def tell(self, msg: object) -> None:
        raise PearlError(f"a gateway process only asks pearld's status, not {type(msg).__name__}")

    def ask(self, msg: object, timeout_s: float = 30.0) -> ClusterStatus:
        if not isinstance(msg, StatusRequest):
            raise PearlError(f"a gateway process asks pearld's status only, not {msg!r}")
        reply = self.client.request(StatusRequest(), timeout_s)
        if not isinstance(reply, Status) or reply.payload is None:
            raise PearlError("pearld has no status yet")
        return reply.payload


class Feed:
    """Applies the routes feed to this process's Router, hosts and backend."""

    def __init__(self, hosts: Hosts, router: LocalRef, backend: Any) -> None:
        self.hosts, self.router, self.backend = hosts, router, backend
        self.synced = threading.Event()  # a snapshot with a view was applied

    def snapshot(self, seq: int, payload: dict[str, Any]) -> None:
        view, live = read_snapshot(payload)
        now = {h.worker for h in live}
        for worker, h in list(self.hosts.up.items()):
            if worker not in now:  # died while this process did not listen
                self.hosts.drop(worker)
                self.router.tell(WorkerGone(worker, h.incarnation, "gone from the feed"))
        for h in live:
            self.hosts.add(h)
        if view is not None:
            self._view(view)
            self.synced.set()

    def change(self, seq: int, payload: dict[str, Any]) -> None:
        msg = read_change(payload)
        if isinstance(msg, StateChanged):
            self._view(msg)
            self.synced.set()
        elif isinstance(msg, HostUp):
            self.hosts.add(msg)
        elif isinstance(msg, WorkerGone):
            h = self.hosts.up.get(msg.worker)
            if h is not None and h.incarnation == msg.incarnation:
                self.hosts.drop(msg.worker)
            self.router.tell(msg)

    def _view(self, view: StateChanged) -> None:
        self.router.tell(view)
        self.backend.tell(view)


def bind_shared(listen: str) -> socket.socket:
    """``listen`` bound with ``SO_REUSEPORT`` (shared with the other processes), listening."""
    from pearl.gateway.serve import bind

    return bind(listen, reuse_port=True)


def run(a: argparse.Namespace, stop: threading.Event) -> int:
    from pearl.gateway.app import open_gateway
    from pearl.gateway.pool import PoolBackend
    from pearl.gateway.serve import read_api_key

    cfg: Config = from_mapping(strip_none(json.loads(Path(a.config).read_text())))
    keys = Keys.load(cfg.daemon.keys_dir)
    directory = Directory()
    reply = Server(
        f"tcp://{serving_host(a.endpoint)}:*",
        serve_directory(directory),
        keys=keys.serve,
        name=f"gateway-{a.index}",
    )
    router = start(
        directory,
        Router,
        directory=directory,
        wait_s=cfg.gateway.request_timeout_s,
        reply_to=reachable(reply.address),  # hosts on other machines dial it
        hashed=True,
    )
    directory.register(PearldStatus(Client(a.endpoint, keys=keys.to_pearld, timeout_s=30)))
    events = RemoteRef(names.SCHEDULER, Client(a.endpoint, keys=keys.to_pearld, timeout_s=30))
    directory.register(events)
    tracker = CourierRef(
        names.TRACKER,
        Client(a.endpoint, keys=keys.to_pearld, timeout_s=5.0, retries=2),
        lambda name, msg, e: log.warning("the Tracker did not hear a rollout step: %s", e),
    )
    directory.register(tracker)
    backend = PoolBackend(directory, cfg, name=f"gateway-client-{a.index}")
    hosts = Hosts(directory, keys, router)
    feed = Feed(hosts, router, backend)
    pub, rpc = a.routes.split(",")
    subscriber = Subscriber(
        pub,
        Client(rpc, keys=keys.to_pearld, timeout_s=5.0),
        on_snapshot=feed.snapshot,
        on_change=feed.change,
        topic=TOPIC,
        keys=keys.to_pearld,
    )
    subscriber.start()
    server = None
    try:
        if not feed.synced.wait(SYNC_S):  # requests would only wait for the first view
            log.warning("no view from pearld's routes feed in %.0f s; serving anyway", SYNC_S)
        key = read_api_key(cfg.gateway.api_key_file)
        server = open_gateway(backend, cfg.gateway, bind_shared(a.listen), key, process=a.index)
        Path(a.ready).write_text(f"{os.getpid()}\n")
        parent = os.getppid()
        while not stop.wait(min(PARENT_POLL_S, cfg.daemon.tick_s)):
            if os.getppid() != parent:
                log.warning("pearld (pid %d) is gone: gateway process %d exits", parent, a.index)
                return 0
            if not router.ref.is_alive():
                log.error("gateway process %d: its Router stopped; exiting", a.index)
                return 1
            router.tell(Flush())
        return 0
    finally:
        if server is not None:
            server.stop()
        subscriber.close()
        backend.close()
        router.ref.stop(timeout=10)
        hosts.close()
        tracker.close()
        reply.close()


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s gateway-{a.index} %(levelname)s %(name)s: %(message)s",
    )
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        return run(a, stop)
    except PearlError as e:
        log.error("gateway process %d cannot serve: %s", a.index, e)
        return 1


if __name__ == "__main__":
    sys.exit(main())
