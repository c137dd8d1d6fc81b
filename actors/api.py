"""The API endpoint: pearld's one ZeroMQ ROUTER for the CLI, trainers and worker hosts, plus the
PUB socket that streams every logged change to ``pearl watch``.

Requests are served on the server's thread: elastic events go to the ElasticScheduler and are
answered once durable; ``status`` is answered from the latest published view without touching the
Orchestrator; worker hellos and heartbeats go to the RoleSupervisor; ``call`` messages are
delivered to the named local actor. Whatever is malformed gets an error reply (the rpc server's
job) and pearld keeps serving.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any

import msgspec
import zmq

from actors import names
from actors.base import Directory, PearlActor, serve_directory
from actors.messages import (
    BatchReply,
    NextBatch,
    StateChanged,
    WeightsUpload,
    Welcome,
    WorkerBeat,
    WorkerHello,
)
from actors.supervisor import HostsChanged, Liveboard
from pearl.core.errors import PearlError
from pearl.core.schema import to_plain
from pearl.core.status import status_plain
from pearl.core.view import cluster_status
from transports.auth import ServerKeys
from transports.codec import Envelope
from transports.protocol import (
    Ack,
    Call,
    Event,
    Ping,
    Pong,
    Result,
    Status,
    StatusRequest,
    Subscribe,
)
from transports.pubsub import Publisher
from transports.rpc import Observer, Server, dispatch

if TYPE_CHECKING:
    from pearl.rl.trajectory import Batch

log = logging.getLogger(__name__)

EVENT_TIMEOUT_S = 30.0
VIEW_WAIT_S = 5.0
REBIND_S = 5.0  # a restarted API waits this long for ZeroMQ to release its predecessor's port


def pub_address(endpoint: str) -> str:
    """The PUB socket lives next to the API: ``ipc://x.sock`` -> ``ipc://x.sock.pub``, a TCP port
    -> any free port on the same host (announced in the status view)."""
    if endpoint.startswith("ipc://"):
        return endpoint + ".pub"
    host = endpoint.rsplit(":", 1)[0]
    return f"{host}:*"


class BindFailed(PearlError):
    """pearld cannot listen on its endpoint (in use, malformed, not permitted); ``in_use``: the
    address is taken (it may be released in a moment)."""

    def __init__(self, message: str, in_use: bool = False) -> None:
        super().__init__(message)
        self.in_use = in_use


def check_endpoint(endpoint: str) -> None:
    """Refuse, before anything starts, an endpoint pearld could never bind."""
    scheme, sep, rest = endpoint.partition("://")
    if not sep or scheme not in ("tcp", "ipc"):
        raise BindFailed(
            f"cannot listen on {endpoint!r}: expected tcp://HOST:PORT or ipc:///PATH/api.sock; "
            "fix --endpoint (or daemon.endpoint)"
        )
    if scheme == "ipc":
        return  # its directory may be created with the state dir; a missing one fails the bind
    port = rest.rsplit(":", 1)[1] if ":" in rest else ""
    if not (port.isdigit() and int(port) < 65536 or port == "*"):
        raise BindFailed(
            f"cannot listen on {endpoint}: expected tcp://HOST:PORT with a port 1-65535 (or * for "
            "any free one); fix --endpoint (or daemon.endpoint)"
        )


def bind_failed(endpoint: str, address: str, e: zmq.ZMQError) -> BindFailed:
    """One line naming the endpoint, what ZeroMQ said, and what to do about it."""
    why = re.sub(r"\s*\(addr=.*\)$", "", e.strerror or str(e)).rstrip(".")
    what = f"cannot listen on {endpoint}"
    if e.errno == errno.EADDRINUSE:
        if address != endpoint:
            what += f" (its change stream, {address})"
        return BindFailed(
            f"{what}: the address is already in use (another pearld or program listens there); "
            "stop it or pass another --endpoint",
            in_use=True,
        )
    if e.errno in (errno.EACCES, errno.EPERM):
        return BindFailed(f"{what}: {why}; pass an --endpoint this user may bind")
    if e.errno == errno.ENOENT and endpoint.startswith("ipc://"):
        folder = os.path.dirname(endpoint.removeprefix("ipc://")) or "."
        return BindFailed(f"{what}: no directory {folder}; create it or pass another --endpoint")
    return BindFailed(
        f"{what}: ZeroMQ rejects it ({why}); pass --endpoint tcp://127.0.0.1:PORT or "
        "ipc:///PATH/api.sock"
    )


class ApiSockets:
    """The API's ROUTER and PUB sockets, bound and not yet served: pearld binds them before it
    writes anything, so that an address it cannot listen on fails the start with the state
    directory untouched. Requests wait in ZeroMQ's queue until an :class:`ApiEndpoint` serves.

    :meth:`close` is idempotent and may be called from any thread: the endpoint closes them when it
    stops or fails, and pearld before it binds the address again for a restarted endpoint."""

    def __init__(self, endpoint: str, keys: ServerKeys | None, board: Liveboard) -> None:
        self._lock = threading.Lock()
        self.closed = False
        pub = pub_address(endpoint)
        self.publisher: Publisher | None = None
        try:
            self.publisher = Publisher(pub, keys=keys)
            pub = ""  # from here on, a failure is the API endpoint's
            self.server = Server(
                endpoint,
                None,
                keys=keys,
                name="pearld",
                liveness=board.ear,  # any message from a host is a heartbeat
            )
        except BaseException as e:
            if self.publisher is not None:
                self.publisher.close()
            if isinstance(e, zmq.ZMQError):
                raise bind_failed(endpoint, pub or endpoint, e) from None
            raise

    @classmethod
    def bind(
        cls, endpoint: str, keys: ServerKeys | None, board: Liveboard, wait_s: float = 0.0
    ) -> ApiSockets:
        """Bind, retrying for up to ``wait_s`` while the address is in use: ZeroMQ releases a
        closed socket's port asynchronously (a few ms), so a restarted endpoint may find the
        address of the one it replaces still taken for a moment."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                return cls(endpoint, keys, board)
            except BindFailed as e:
                if not e.in_use or time.monotonic() >= deadline:
                    raise
            time.sleep(0.01)

    def close(self) -> None:
        """Stop serving and release both addresses (the publisher's even if the server's
        thread would not stop)."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            try:
                self.server.close()
            finally:
                if self.publisher is not None:
                    self.publisher.close()


@dataclass
class Memo:
    """What an API endpoint leaves its successor: the latest view, so that a restarted endpoint
    answers ``status`` at once instead of after the next logged change."""

    last: StateChanged | None = None


class ApiEndpoint(PearlActor):
    name = names.API

    def __init__(
        self,
        directory: Directory,
        endpoint: str,
        boot_id: str,
        board: Liveboard,
        keys: ServerKeys | None = None,
        batches: Callable[[float], Batch | None] | None = None,
        weights: Callable[[int, bytes], str] | None = None,
        observer: Observer | None = None,  # told every message answered (pearld's metrics)
        bound: ApiSockets | None = None,  # bound by pearld before it started (None: bind here)
        memo: Memo | None = None,  # the latest view, kept across restarts
    ) -> None:
        super().__init__()
        self.batches, self.weights = batches, weights
        self.observer = observer
        self.directory, self.endpoint, self.boot_id, self.keys = directory, endpoint, boot_id, keys
        self.board = board
        self.seq = 0  # of the latest view
        self.view: dict[str, Any] = {}  # its JSON mapping: what subscribers get
        self.last: StateChanged | None = None  # rendered again when the hosts change
        self.status_msg = Status()  # what clients get: no status before the first view
        self._view_seq = threading.Condition()
        self.server: Server | None = None
        self.publisher: Publisher | None = None
        self.memo = memo or Memo()
        # Bound here (unless pearld bound first), on the starting thread, not in on_start: a
        # failed bind is raised to the daemon as a BindFailed it can report in one line.
        self.sockets = bound or ApiSockets(endpoint, keys, board)
        self._serve(self.sockets)
        if self.memo.last is not None:
            self.state_changed(self.memo.last)

    def _serve(self, bound: ApiSockets) -> None:
        self.publisher, self.server = bound.publisher, bound.server
        try:
            self.server.observer = self.observer
            self.server.serve(
                dispatch(
                    {
                        Ping: lambda env: Pong(nonce=env.msg.nonce),
                        Event: self._event,
                        StatusRequest: lambda env: self.status_msg,
                        Subscribe: lambda env: self.publisher.snapshot(lambda: self.view),  # type: ignore[union-attr]
                        WorkerHello: self._hello,
                        WorkerBeat: self._beat,
                        NextBatch: self._next_batch,
                        WeightsUpload: self._upload,
                        Call: serve_directory(self.directory),
                    }
                )
            )
        except BaseException:
            bound.close()
            raise
        log.info(
            "pearld listening on %s (changes on %s)",
            self.server.address,
            self.publisher.address if self.publisher else "",
        )

    @property
    def address(self) -> str:
        assert self.server is not None
        return self.server.address

    def _event(self, env: Envelope) -> Ack:
        ack: Ack = self.directory.get(names.SCHEDULER).ask(env.msg.decoded, EVENT_TIMEOUT_S)
        # Read your writes: the orchestrator tells this actor the new view before it acks, but
        # asynchronously; a status asked right after the ack must already show the event.
        seq = getattr(ack, "seq", 0)
        with self._view_seq:
            self._view_seq.wait_for(lambda: self.seq >= seq, VIEW_WAIT_S)
        return ack

    def _hello(self, env: Envelope) -> Welcome:
        welcome: Welcome = self.directory.get(names.SUPERVISOR).ask(env.msg, 10.0)
        return welcome

    def _beat(self, env: Envelope) -> Welcome:
        # Recorded on the server's thread (the ear beat already): a busy supervisor must not look
        # like a dead host. The reply tells the host whether pearld (this boot) still knows it.
        return Welcome(
            boot_id=self.boot_id, known=self.board.beat(env.msg.worker, env.msg.incarnation)
        )

    def _next_batch(self, env: Envelope) -> BatchReply:
        if self.batches is None:
            raise PearlError("this pearld runs no rollout pipeline (set [rl] env in its config)")
        # Waits only briefly on the server's thread; clients poll until their own deadline.
        batch = self.batches(min(env.msg.timeout_s, 0.5))
        return BatchReply(batch=None if batch is None else to_plain(batch))

    def _upload(self, env: Envelope) -> Result:
        if self.weights is None or len(env.frames) != 1:
            raise PearlError("weights-upload needs one bulk frame and a pearld with a weight store")
        return Result(value=self.weights(env.msg.version, bytes(env.frames[0])))

    def state_changed(self, msg: StateChanged) -> None:
        """The edge: the typed view becomes the ``pearl status`` object here, once a change. A
        view that cannot be rendered is a bug: logged, and the previous status is kept (the
        API must not go down with it: clients, hosts and events all come through here)."""
        if msg.seq < self.seq:
            return  # an older view than the one shown (a predecessor's, handed over)
        try:
            self._render(msg)
        except Exception:
            log.exception(
                "cannot render the status of seq %d; still serving seq %d", msg.seq, self.seq
            )
            return
        self.last = self.memo.last = msg

    def _render(self, msg: StateChanged) -> None:
        metrics = self.board.metrics()
        nodes = self.board.nodes()  # on Ray: the node each worker's host runs on
        status = msgspec.structs.replace(
            cluster_status(msg.view),
            endpoint=self.server.address if self.server else self.endpoint,
            pub_endpoint=self.publisher.address if self.publisher else "",
            # Where each worker's host serves its metrics; beside the table, whose rows stay
            # those of `pearl log replay --json`.
            worker_metrics={str(w): metrics[w] for w in sorted(metrics)},
            worker_nodes={str(w): nodes[w] for w in sorted(nodes)},
            worker_faults={str(w): why for w, why in sorted(self.board.faults().items())},
        )
        view = status_plain(status)
        with self._view_seq:
            self.seq, self.view = msg.seq, view
            self.status_msg = Status(
                payload=status
            )  # one object per change: its encoding is reused
            self._view_seq.notify_all()
        if self.publisher is not None:
            self.publisher.publish(view)

    def hosts_changed(self, _: HostsChanged) -> None:
        if self.last is not None:
            self.state_changed(self.last)

    def on_stop(self) -> None:
        self.sockets.close()

    def on_failure(
        self,
        exception_type: type[BaseException] | None,
        exception_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        super().on_failure(exception_type, exception_value, traceback)
        # Free the address for the endpoint that replaces this one (pykka calls no on_stop).
        try:
            self.sockets.close()
        except Exception as e:
            log.error("api sockets not released: %s", e)

    handles = {StateChanged: state_changed, HostsChanged: hosts_changed}


__all__ = [
    "ApiEndpoint",
    "ApiSockets",
    "BindFailed",
    "Memo",
    "bind_failed",
    "check_endpoint",
    "pub_address",
]
