"""The routes feed: what a gateway process needs to route as pearld's own Router does.

With ``gateway.processes = N`` the data path leaves pearld's process: N gateway processes
(:mod:`pearl.gateway.process`) each run a Router of their own and send requests straight to the
worker hosts. They learn where to send them here, from pearld, over the ZeroMQ Clone pattern of
:mod:`transports.pubsub` (topic ``routes``): a snapshot over rpc, then every change in order.

pearld keeps one :class:`RouteFeed`, registered as :data:`actors.names.ROUTES`. It hears

- every logged change of the table (``StateChanged``, as one of the Orchestrator's listeners):
  the routable workers, the notices, the lent workers and the profile;
- every host's hello (:class:`HostUp`, from the RoleSupervisor): the host's command address and
  KV inbox, by worker and incarnation;
- every host that died or stopped (``WorkerGone``, from the RoleSupervisor): what ran there
  will not answer.

A change is applied and published under the publisher's lock, and a snapshot is built under the
same lock, so a subscriber that applies the changes after its snapshot's number holds exactly
pearld's state. The payloads are plain mappings: ``{"view": StateChanged}``,
``{"host": HostUp}``, ``{"gone": {"worker", "incarnation", "reason"}}``; a snapshot is
``{"view": ... | None, "hosts": [HostUp, ...]}`` (records in their wire form).
"""

from __future__ import annotations

import logging
import socket
from typing import Any

from actors import names
from actors.base import decode_value
from actors.messages import StateChanged
from actors.router import WorkerGone
from pearl.core.address import advertised
from pearl.core.errors import PearlError
from pearl.core.schema import WireStruct, to_wire
from transports.auth import ServerKeys
from transports.codec import Envelope
from transports.protocol import MESSAGES, Subscribe
from transports.pubsub import Publisher
from transports.rpc import Server, dispatch

log = logging.getLogger(__name__)

TOPIC = "routes"


@MESSAGES.add
class HostUp(WireStruct, tag="host-up", frozen=True, kw_only=True):
    """A worker host said hello: its commands go to ``address``, KV transfers to ``kv_address``."""

    worker: int
    incarnation: int
    address: str
    kv_address: str = ""


def serving_host(endpoint: str) -> str:
    """The interface the data path binds on beside pearld's API ``endpoint``: its host for
    ``tcp://HOST:PORT``, loopback for any other transport (``ipc://``: one machine)."""
    if not endpoint.startswith("tcp://"):
        return "127.0.0.1"
    return endpoint.removeprefix("tcp://").rsplit(":", 1)[0] or "127.0.0.1"


def reachable(address: str) -> str:
    """A bound ``tcp://HOST:PORT`` as another machine dials it: a wildcard host (pearld bound on
    every interface) becomes this machine's address."""
    return advertised(address, socket.gethostbyname(socket.gethostname()))


class RouteFeed:
    """pearld's side of the feed (see the module): a publisher of changes and an rpc server of
    snapshots, both bound on ``host`` (any free port), with pearld's keys when it has them.
    Thread-safe: ``tell`` comes from the Orchestrator's and the RoleSupervisor's threads."""

    name = names.ROUTES

    def __init__(self, host: str, keys: ServerKeys | None = None) -> None:
        self.view: StateChanged | None = None
        self.hosts: dict[int, HostUp] = {}
        self.publisher = Publisher(f"tcp://{host}:*", topic=TOPIC, keys=keys, name="routes")
        try:
            self.server = Server(
                f"tcp://{host}:*", dispatch({Subscribe: self._snapshot}), keys=keys, name="routes"
            )
        except BaseException:
            self.publisher.close()
            raise

    @property
    def addresses(self) -> tuple[str, str]:
        """Where changes are published, and where snapshots are answered."""
        return reachable(self.publisher.address), reachable(self.server.address)

    def tell(self, msg: object) -> None:
        with self.publisher.lock:
            if isinstance(msg, StateChanged):
                if self.view is not None and msg.seq < self.view.seq:
                    return  # an older view than the one published
                self.view = msg
                self.publisher.publish({"view": to_wire(msg)})
            elif isinstance(msg, HostUp):
                self.hosts[msg.worker] = msg
                self.publisher.publish({"host": to_wire(msg)})
            elif isinstance(msg, WorkerGone):
                up = self.hosts.get(msg.worker)
                if up is not None and up.incarnation == msg.incarnation:
                    del self.hosts[msg.worker]
                gone = {"worker": msg.worker, "incarnation": msg.incarnation}
                self.publisher.publish({"gone": {**gone, "reason": msg.reason}})

    def ask(self, msg: object, timeout_s: float = 0.0) -> None:
        self.tell(msg)

    def _snapshot(self, env: Envelope) -> Any:
        if env.msg.topic != TOPIC:
            raise PearlError(f"this server answers the {TOPIC!r} topic, not {env.msg.topic!r}")
        return self.publisher.snapshot(self.payload)

    def payload(self) -> dict[str, Any]:
        """The whole state (call under the publisher's lock)."""
        view = None if self.view is None else to_wire(self.view)
        return {"view": view, "hosts": [to_wire(h) for h in self.hosts.values()]}

    def close(self) -> None:
        self.server.close()
        self.publisher.close()


def read_change(payload: dict[str, Any]) -> StateChanged | HostUp | WorkerGone | None:
    """One published change as its record; None for a payload this version does not know."""
    if "view" in payload:
        view = decode_value(payload["view"])
        return view if isinstance(view, StateChanged) else None
    if "host" in payload:
        host = decode_value(payload["host"])
        return host if isinstance(host, HostUp) else None
    if "gone" in payload:
        g = payload["gone"]
        return WorkerGone(int(g["worker"]), int(g["incarnation"]), str(g.get("reason", "")))
    return None


def read_snapshot(payload: dict[str, Any]) -> tuple[StateChanged | None, list[HostUp]]:
    """A snapshot's view (None before the first change) and live hosts."""
    view = decode_value(payload["view"]) if payload.get("view") is not None else None
    hosts = [h for h in map(decode_value, payload.get("hosts", [])) if isinstance(h, HostUp)]
    return (view if isinstance(view, StateChanged) else None), hosts


__all__ = [
    "TOPIC",
    "HostUp",
    "RouteFeed",
    "reachable",
    "read_change",
    "read_snapshot",
    "serving_host",
]
