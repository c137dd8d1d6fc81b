"""One worker host process: ``python -m actors.worker_host --endpoint ... --worker N ...``.

It runs the WorkerActor that owns the engine, serves commands on its own rpc server (and, with
``--metrics HOST:PORT``, its engine's Prometheus metrics over HTTP), says hello to pearld,
heart-beats from a thread of its own (:class:`actors.heart.HostHeart`: neither compute nor
command handling delays a beat), and says hello again whenever pearld's boot id changes (pearld
restarted).
Reports to pearld (step results, generation results, telemetry) leave through one queue and one
thread, so the engine never waits on the network. If pearld stays unreachable for ``--orphan-s``
the host exits.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import queue
import signal
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pykka

from actors import names, worker_files
from actors.base import Directory, LocalRef, serve_directory
from actors.heart import HostHeart, host_name
from actors.messages import WorkerHello
from actors.worker import ReportTelemetry, WorkerActor
from pearl.config import EngineConfig, parse_gpus
from pearl.core.errors import PearlError
from pearl.core.schema import to_wire
from pearl.engines.factory import build_engine
from pearl.metrics import HostMetrics, MetricsServer
from pearl.rl.weights import latest_snapshot
from transports.auth import HostKeys
from transports.bulk import ZmqKVChannel
from transports.protocol import Call
from transports.rpc import Client, Server

if TYPE_CHECKING:
    from pearl.core.state import Role
    from pearl.engines.base import Engine

log = logging.getLogger("pearl.worker_host")

TERM_REPORT_S = 0.5  # reports still queued when SIGTERM stops the host: delivered within this
ENGINE_MODULES = {"sim": "pearl.engines.sim", "torch": "pearl.engines.torch"}


class Reporter:
    """Delivers tells to pearld's actors in order, off the engine's and actor's threads."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.q: queue.Queue[tuple[str, object] | None] = queue.Queue()
        self.thread = threading.Thread(target=self._run, name="reporter", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while (item := self.q.get()) is not None:
            name, msg = item
            for attempt in range(20):
                try:
                    self.client.request(Call(actor=name, method="tell", args={"msg": to_wire(msg)}))
                    break
                except PearlError as e:
                    if attempt == 19:
                        log.warning("dropped %s for %s: %s", type(msg).__name__, name, e)
                    time.sleep(min(2.0, 0.05 * 2**attempt))

    def close(self, timeout_s: float = 5.0) -> None:
        """Deliver what is queued, waiting at most ``timeout_s`` (the rest is dropped)."""
        self.q.put(None)
        self.thread.join(timeout_s)


class QueuedRef:
    def __init__(self, name: str, reporter: Reporter) -> None:
        self.name, self.reporter = name, reporter

    def tell(self, msg: object) -> None:
        self.reporter.q.put((self.name, msg))

    def ask(self, msg: object, timeout_s: float = 10.0) -> Any:
        raise PearlError(f"{self.name} is remote: worker hosts only tell pearld")


class Replies:
    """Couriers to the gateway processes that routed requests here: ``router@ADDRESS``
    (:func:`actors.names.at`) resolves to a reporter of its own to that rpc server, made on
    first use, with the keys that dial pearld (a gateway process serves with pearld's key
    pair). At most ``MAX_PEERS`` are kept: the least recently used is closed beyond them (a
    gateway process restarted serves at a new address)."""

    MAX_PEERS = 64

    def __init__(self, keys: HostKeys | None, name: str) -> None:
        self.keys, self.name = keys, name
        self.peers: OrderedDict[str, QueuedRef] = OrderedDict()
        self._lock = threading.Lock()

    def __call__(self, name: str) -> QueuedRef | None:
        actor, sep, address = name.partition("@")
        if not sep or actor != names.ROUTER or not address:
            return None
        with self._lock:
            ref = self.peers.get(address)
            if ref is None:
                client = Client(
                    address,
                    keys=self.keys.to_pearld if self.keys else None,
                    timeout_s=5.0,
                    retries=2,
                    name=self.name,
                )
                ref = self.peers[address] = QueuedRef(actor, Reporter(client))
                while len(self.peers) > self.MAX_PEERS:
                    _, old = self.peers.popitem(last=False)
                    old.reporter.close(timeout_s=0)  # ends after what it holds; no wait here
            self.peers.move_to_end(address)
            return ref

    def close(self) -> None:
        with self._lock:
            peers, self.peers = list(self.peers.values()), OrderedDict()
        for ref in peers:
            ref.reporter.close()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The host's command line (its launcher writes it: :mod:`actors.launcher`)."""
    p = argparse.ArgumentParser(prog="pearl-worker-host")
    p.add_argument("--endpoint", required=True)
    p.add_argument("--worker", type=int, required=True)
    p.add_argument("--incarnation", type=int, required=True)
    p.add_argument("--gpus", default="")
    p.add_argument("--engine", default="{}")
    p.add_argument("--model", default="qwen3-8b")
    p.add_argument("--gpu", default="H800")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--heartbeat-s", type=float, default=1.0)
    p.add_argument("--orphan-s", type=float, default=120.0)
    p.add_argument("--state-dir", default="")
    p.add_argument(
        "--keys-dir",
        default="",
        help="CURVE keys from `pearl keys generate DIR` (reads worker.key_secret and server.key)",
    )
    p.add_argument(
        "--metrics",
        default="",
        help='serve GET /metrics on HOST:PORT (port 0: a free one; "" or absent: off)',
    )
    p.add_argument(
        "--keys-stdin",
        action="store_true",
        help="read the CURVE keys as one JSON line on stdin (a launcher on another machine)",
    )
    p.add_argument(
        "--bind-host",
        default="127.0.0.1",
        help="where its command server and KV inbox listen (not loopback: needs CURVE keys)",
    )
    p.add_argument("--node-id", default="", help="the Ray node it runs on (said in its hello)")
    p.add_argument("--handle", default="", help="its launcher's name for it (said in its hello)")
    return p.parse_args(argv)


def read_keys(a: argparse.Namespace) -> HostKeys | None:
    """CURVE keys (to pearld, to other hosts, and for this host's own sockets), or None."""
    if a.keys_stdin:  # handed over by the launcher: no key file on this machine
        return HostKeys.of_text(json.loads(sys.stdin.readline()))
    return HostKeys.load(a.keys_dir) if a.keys_dir else None


def weights_source(state_dir: str) -> Callable[[int], tuple[int, str] | None]:
    """Where a joining worker loads weights from: the state dir's published snapshots."""
    weights_dir = Path(state_dir) / "weights" if state_dir else None

    def source(version: int) -> tuple[int, str] | None:
        """The newest published snapshot, whatever its form (a joiner may ask for a version not
        stored yet, or one pruned since); None before the first publish: the initial weights."""
        found = latest_snapshot(weights_dir) if weights_dir is not None else None
        return None if found is None else (found[0], str(found[1]))

    return source


@dataclass(kw_only=True)
class Host:
    """What one worker host runs once set up, and the files that name it to operators."""

    args: argparse.Namespace
    keys: HostKeys | None
    reporter: Reporter
    replies: Replies
    kv: ZmqKVChannel
    actor: pykka.ActorRef[Any]
    server: Server
    exporter: MetricsServer | None
    built: threading.Event  # read by the heart without asking the (maybe busy) actor
    pid_file: Path | None = None
    bound: worker_files.LogBound | None = None

    def hello(self) -> WorkerHello:
        """What the host says to pearld: who it is and where it serves."""
        a = self.args
        return WorkerHello(
            worker=a.worker,
            incarnation=a.incarnation,
            pid=os.getpid(),
            address=self.server.address,
            kv_address=self.kv.address,
            metrics_address=self.exporter.address if self.exporter is not None else "",
            node_id=a.node_id,
            handle=a.handle,
        )

    def claim_files(self) -> None:
        """The pid file and the bounded log, under ``<state-dir>/workers`` when given: operators
        (and tests) find and stop hosts by pid."""
        a = self.args
        if not a.state_dir:
            return
        folder = Path(a.state_dir) / "workers"
        self.pid_file = worker_files.pid_path(folder, a.worker, a.incarnation)
        self.bound = worker_files.LogBound(worker_files.log_path(folder, a.worker, a.incarnation))
        worker_files.write_own(self.pid_file)
        # Earlier incarnations of this slot: their logs beyond the last few, dead pid files.
        worker_files.prune(folder, a.worker)

    def close(self, report_s: float = 5.0) -> None:
        """Stop what :func:`set_up` started, the pid file first (the host is going); reports
        still queued get ``report_s`` to reach pearld."""
        if self.pid_file is not None:
            worker_files.remove_own(self.pid_file)
        self.server.close()
        self.actor.stop(timeout=10)
        self.reporter.close(report_s)
        self.replies.close()
        self.kv.close()
        if self.exporter is not None:
            self.exporter.close()


def set_up(
    a: argparse.Namespace,
    *,
    engine_cfg: EngineConfig,
    keys: HostKeys | None,
    exporter: MetricsServer | None,
    metrics: HostMetrics,
    stop: threading.Event,
) -> Host:
    """The reporter to pearld, the KV inbox, the WorkerActor (its engine is built on its first
    role) and the command server, then the host's files."""
    replies = Replies(keys, host_name(a.worker, a.incarnation, "g"))
    directory = Directory(resolve=replies)
    to_pearld = keys.to_pearld if keys else None
    reporter = Reporter(  # named after the host: pearld counts every report as a heartbeat
        Client(
            a.endpoint,
            keys=to_pearld,
            timeout_s=5.0,
            retries=2,
            name=host_name(a.worker, a.incarnation, "r"),
        )
    )
    for name in (names.ORCHESTRATOR, names.ROUTER, names.TRACKER):
        directory.register(QueuedRef(name, reporter))
    kv = ZmqKVChannel(
        f"tcp://{a.bind_host}:*",
        keys=keys.serve if keys else None,
        peer_keys=keys.to_peers if keys else None,
    )
    built = threading.Event()

    def make_engine(role: Role) -> Engine:
        engine = build_engine(
            engine_cfg, model=a.model, gpu=a.gpu, tp=a.tp, role=role, kv_channel=kv
        )
        built.set()
        return engine

    actor = WorkerActor.start(
        directory,
        a.worker,
        a.incarnation,
        make_engine,
        weights_source(a.state_dir),
        stop.set,
        metrics,
    )
    directory.register(LocalRef(names.worker_name(a.worker), actor))
    server = Server(
        f"tcp://{a.bind_host}:*",
        serve_directory(directory),
        keys=keys.serve if keys else None,
        name=f"worker-{a.worker}",
    )
    host = Host(
        args=a,
        keys=keys,
        reporter=reporter,
        replies=replies,
        kv=kv,
        actor=actor,
        server=server,
        exporter=exporter,
        built=built,
    )
    host.claim_files()
    return host


def heart(host: Host) -> HostHeart:
    """The host's heart: hello, a beat every ``--heartbeat-s`` (each queues a telemetry report
    and keeps the log bounded), hello again when pearld restarts."""
    a = host.args
    telemetry = threading.Event()  # a report is queued: do not pile more behind a busy actor

    def on_beat() -> None:
        if host.bound is not None:
            host.bound.check()  # the log stays within worker_files.LOG_BYTES
        if not telemetry.is_set():
            telemetry.set()
            host.actor.tell(ReportTelemetry(telemetry))

    def on_welcome() -> None:
        # The one host pearld holds for this worker and incarnation names itself in the pid
        # file (a relaunch of the same incarnation may have written its own pid there).
        if host.pid_file is not None:
            worker_files.write_own(host.pid_file)

    return HostHeart(
        a.endpoint,
        host.hello(),
        interval_s=a.heartbeat_s,
        orphan_s=a.orphan_s,
        ready=host.built.is_set,
        on_beat=on_beat,
        on_welcome=on_welcome,
        keys=host.keys.to_pearld if host.keys else None,
    )


def main(argv: list[str] | None = None) -> int:
    """The host's life: parse its arguments, set up, connect to pearld, serve until told to
    stop (SIGTERM, a stop command, or pearld unreachable for ``--orphan-s``), then stop."""
    a = parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s worker-{a.worker} %(levelname)s %(message)s"
    )
    engine_cfg = EngineConfig(**json.loads(a.engine))
    parse_gpus(a.gpus)

    stop, terminated = threading.Event(), threading.Event()
    beats: HostHeart | None = None

    def on_sigterm(*_: object) -> None:
        terminated.set()
        stop.set()
        if beats is not None:
            beats.wake()

    signal.signal(signal.SIGTERM, on_sigterm)
    metrics = HostMetrics(a.worker, a.incarnation, engine_cfg.kind)
    try:
        keys = read_keys(a)
        exporter = MetricsServer(metrics, a.metrics, "--metrics") if a.metrics else None
    except PearlError as e:
        log.error("cannot start: %s", e)
        return 1
    except ValueError as e:  # --keys-stdin: not JSON
        log.error("cannot start: worker host keys on stdin: %s", e)
        return 1
    host = set_up(
        a, engine_cfg=engine_cfg, keys=keys, exporter=exporter, metrics=metrics, stop=stop
    )
    # An import holds the interpreter (torch's shared libraries load under the GIL for about a
    # second): have the engine's imports done before pearld starts counting this host's beats.
    importlib.import_module(ENGINE_MODULES.get(engine_cfg.kind, "pearl.engines.base"))
    beats = heart(host)
    try:
        beats.run(stop)  # beats leave from the heart's own thread, whatever the engine does
    finally:
        # SIGTERM comes from pearld stopping (or killing this host): a report it has not taken
        # in half a second it will not take; a stop command's reports get their full time.
        host.close(report_s=TERM_REPORT_S if terminated.is_set() else 5.0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
