"""``pearld``: the long-running PEARL daemon.

``pearld --config FILE [--state-dir DIR] [--set section.key=value ...] [--endpoint ADDR]``

The API listens on ``--endpoint``, else ``PEARL_ENDPOINT`` (where ``pearl`` looks for it), else
the config's ``daemon.endpoint``.

Start-up: bind the API's sockets (an address pearld cannot listen on fails the start before
anything is written; requests wait until the API serves), open (or create) the event log in the
state directory (a second pearld on the same directory is refused), replay it (latest snapshot +
tail) and refit the workload profile from the logged telemetry, let the controller recover
(resend the commands of started steps, cancel an expansion that never committed, complete a
shrink or a GPU return), then start the actors in dependency order, confirming each is alive; the
API serves last but one. Worker hosts that survived a restart re-register and are adopted;
unknown ones are stopped.

Signals: SIGTERM/SIGINT stop the actors in reverse order and the worker hosts with them;
SIGUSR1 dumps every thread's traceback to stderr. Logs are one structured line per event.
"""

from __future__ import annotations

import argparse
import faulthandler
import logging
import os
import secrets
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pykka

from actors import names
from actors.messages import RouterRestarted
from actors.rollout_client import RolloutClient
from pearl import config as config_mod
from pearl.core import events as ev
from pearl.core.controller import Controller, ControllerConfig, Output
from pearl.core.errors import ConfigError, LogLocked, PearlError
from pearl.core.policy import Policy
from pearl.core.profile import prior_profile
from pearl.log import FileLog
from pearl.log.segments import LOCK
from pearl.plans import Observers, PlanHistory

if TYPE_CHECKING:
    import socket

    from actors.api import ApiSockets, Memo
    from actors.base import LocalRef
    from actors.launcher import Launcher
    from actors.ray_launcher import RayLauncher
    from pearl.gateway.feed import RouteFeed
    from pearl.gateway.pool import PoolBackend
    from pearl.gateway.processes import GatewayProcesses
    from pearl.gateway.serve import GatewayServer
    from pearl.metrics import Metrics, MetricsServer
    from pearl.rl.pipeline import Pipeline
    from transports.auth import ServerKeys

log = logging.getLogger("pearl.daemon")

#: how to (re)start one actor: its ref once alive (the orchestrator's takes a recovery)
Factory = Callable[..., "LocalRef"]


class StructuredFormatter(logging.Formatter):
    """``ts=... level=... component=... msg="..."``: one greppable line per event."""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(record.created))
        msg = record.getMessage().replace('"', "'")
        line = (
            f"ts={ts}.{int(record.msecs):03d} level={record.levelname.lower()} "
            f'component={record.name} msg="{msg}"'
        )
        if record.exc_info:
            line += " exc=" + repr(self.formatException(record.exc_info))
        return line


def policy_of(cfg: config_mod.Config) -> Policy:
    return Policy.of_config(cfg)


def cluster_init(cfg: config_mod.Config) -> ev.ClusterInit:
    """The log's first record for this config."""
    c = cfg.cluster
    return ev.ClusterInit(
        tp=c.tp,
        training_gpus=c.training_gpus,
        reserved_gpus=c.reserved_gpus,
        preemptible_gpus=c.preemptible_gpus,
    )


def init_records(cfg: config_mod.Config) -> list[ev.ClusterInit | ev.GpusAdded]:
    c = cfg.cluster
    out: list[ev.ClusterInit | ev.GpusAdded] = [cluster_init(cfg)]
    if c.initial_preemptible:
        out.append(ev.GpusAdded(gpus=c.initial_preemptible))
    return out


def cluster_diff(logged: object, configured: ev.ClusterInit) -> str:
    """Where a log's ``cluster-init`` and the config's differ, in config keys:
    ``cluster.tp=2; this config has cluster.tp=4``."""
    if not isinstance(logged, ev.ClusterInit):
        kind = getattr(logged, "KIND", type(logged).__name__)
        return f"a {kind} record first, not a cluster-init (is it a PEARL state directory?)"

    def value(init: ev.ClusterInit, field: str) -> str:
        v = getattr(init, field)
        return str(v) if field == "tp" else config_mod.format_gpus(v)

    fields = ("tp", "training_gpus", "reserved_gpus", "preemptible_gpus")
    differ = [f for f in fields if getattr(logged, f) != getattr(configured, f)]
    was = ", ".join(f"cluster.{f}={value(logged, f)}" for f in differ)
    now = ", ".join(f"cluster.{f}={value(configured, f)}" for f in differ)
    return f"{was}; this config has {now}"


def lock_holder(log_dir: Path) -> str:
    """The pid written in a log directory's lock file, or "unknown"."""
    try:
        return (log_dir / LOCK).read_text().strip() or "unknown"
    except OSError:
        return "unknown"


def open_log(cfg: config_mod.Config, state_dir: Path) -> FileLog:
    """The event log of this state directory, created with the cluster of ``cfg`` when new."""
    try:
        event_log = FileLog(state_dir / "log", create=True)
    except LogLocked:
        holder = lock_holder(state_dir / "log")
        raise LogLocked(
            f"another pearld (pid {holder}) holds the lock on {state_dir}; stop it "
            f"(kill -TERM {holder}) or pass another --state-dir"
        ) from None
    try:
        if event_log.last_seq == 0:
            event_log.append(init_records(cfg))
        else:
            first = next(iter(event_log.read(1, 1)))[1]
            expected = cluster_init(cfg)
            if first != expected:
                raise ConfigError(
                    f"{state_dir} holds the log of another cluster: it was created with "
                    f"{cluster_diff(first, expected)}. Use another --state-dir, or the config the "
                    "log was created with"
                )
    except BaseException:
        event_log.close()
        raise
    return event_log


def build_pipeline(cfg: config_mod.Config) -> Pipeline | None:
    """The Pipeline Scheduler the config asks for (``[rl] env``), or None."""
    if not cfg.rl.env:
        return None
    from pearl.gateway.pool import model_dir
    from pearl.rl.pipeline import Pipeline, PipelineConfig
    from pearl.rl.prompt import PromptBuilder
    from pearl.tokenizer import load_tokenizer

    w, rl = cfg.workload, cfg.rl
    builder = PromptBuilder(load_tokenizer(model_dir(cfg)), max_len=w.max_trajectory_tokens)
    env_kwargs = {"max_turns": rl.max_turns} if rl.max_turns else {}
    pc = PipelineConfig(
        env=rl.env,
        env_kwargs=env_kwargs,
        tasks=rl.tasks,
        seed=rl.seed,
        batch=w.batch,
        group_size=w.group_size,
        staleness=w.staleness,
        max_new_tokens=rl.max_new_tokens,
        temperature=rl.temperature,
        top_p=rl.top_p,
    )
    return Pipeline(pc, builder)


class Daemon:
    """pearld in-process: start() brings everything up, stop() takes it down in reverse."""

    def __init__(
        self,
        cfg: config_mod.Config,
        state_dir: Path,
        endpoint: str | None = None,
        keep_workers: bool = False,
    ) -> None:
        self.cfg, self.state_dir = cfg, state_dir
        self.endpoint = endpoint or cfg.daemon.endpoint
        self.address = self.endpoint  # a wildcard port is fixed once the API has bound
        self.keep_workers = keep_workers
        self.boot_id = secrets.token_hex(8)
        self.refs: list[LocalRef] = []  # the running actors, in start order
        self._stop = threading.Event()
        self.failed = threading.Event()  # set when an actor cannot be kept alive
        self._restarts: dict[str, list[float]] = {}
        self.factories: dict[str, Factory] = {}
        self.pipeline: Pipeline | None = None
        self.keys: ServerKeys | None = None
        self._ticker: threading.Thread | None = None
        self.event_log: FileLog | None = None
        self._api_sockets: ApiSockets | None = None  # bound until the API actor serves
        self._api_live: ApiSockets | None = None  # those the running API actor serves on
        self._api_memo: Memo | None = None  # the latest view, across API restarts
        self.failure = ""  # why pearld gave up on an actor (one line), when failed is set
        from actors.base import Directory

        self.directory = Directory()  # the actors' (a fresh one each start)
        self.launcher: Launcher | None = None
        self._ray: RayLauncher | None = None  # joined at start, until the launcher part takes it
        self._up: list[tuple[str, Callable[[bool], None]]] = []  # started parts, in order
        from actors.supervisor import Liveboard

        # The hosts' liveness: the API feeds it, the supervisor judges it, the metrics show it.
        self.board = Liveboard(cfg.daemon.heartbeat_s)
        self.metrics: Metrics | None = None  # when [daemon] metrics is set
        self.plans = PlanHistory()  # every plan of this process's life, timed (reports read it)
        self.metrics_server: MetricsServer | None = None
        self.gateway: GatewayServer | None = None  # when [gateway] listen is set (in-process)
        self.gateway_backend: PoolBackend | None = None  # the gateway's
        self.gateway_processes: GatewayProcesses | None = None  # with [gateway] processes
        self.gateway_address: str | None = None  # HOST:PORT while the gateway serves
        self.routes: RouteFeed | None = None  # what the gateway processes route by
        self._gateway_sock: socket.socket | None = None  # bound at start, until served on
        self._gateway_key: str | None = None

    def _recover(self) -> tuple[Controller, Output]:
        """Replay the log (snapshot + tail), refit the profile, let the controller recover."""
        assert self.event_log is not None
        t0 = time.monotonic()
        policy = policy_of(self.cfg)
        profile = prior_profile(self.cfg)
        telemetry: list[ev.Telemetry] = []
        loaded = self.event_log.load(
            visit=lambda _, r: telemetry.append(r) if isinstance(r, ev.Telemetry) else None
        )
        for t in telemetry:
            profile = policy.observe(profile, t)
        controller = Controller(policy, ControllerConfig())
        recovered = controller.recover(
            table=loaded.state, profile=profile, now=time.monotonic(), wall=time.time()
        )
        log.info(
            "replayed %d records (snapshot at %d) in %.3fs",
            loaded.state.seq,
            loaded.snapshot_seq,
            time.monotonic() - t0,
        )
        return controller, recovered

    def start(self) -> None:
        """Bring pearld up; on any failure, take down what already started and re-raise."""
        try:
            self._start()
        except BaseException:
            self.stop(failed=True)
            raise

    def _start(self) -> None:
        from actors.api import check_endpoint
        from transports.auth import DaemonKeys, HostKeys, check_bind

        check_engine(self.cfg)  # before anything is bound
        check_endpoint(self.endpoint)
        if self.cfg.daemon.keys_dir:  # the API's keys; the local worker hosts read the same DIR
            self.keys = DaemonKeys.load(self.cfg.daemon.keys_dir).api
            HostKeys.load(self.cfg.daemon.keys_dir)
        check_bind(self.endpoint, self.keys)
        # joined and checked before anything is logged
        if self.cfg.daemon.launcher is config_mod.Launcher.RAY:
            from actors.ray_launcher import RayLauncher

            self._ray = RayLauncher.connect(self.cfg, self.endpoint, self.state_dir / "workers")
        self.state_dir.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        # pearld's parts in start order; stop() takes down the ones that started, in reverse.
        # The API binds first: nothing durable is written before pearld can serve.
        parts: list[tuple[str, Callable[[], None], Callable[[bool], None]]] = [
            ("api", self._bind_api, self._unbind_api),
            ("gateway-socket", self._bind_gateway, self._unbind_gateway),
            ("log", self._open_log, self._close_log),
            ("launcher", self._make_launcher, self._reap_workers),
            ("metrics", self._start_metrics, self._stop_metrics),
            ("routes", self._start_routes, self._stop_routes),
            ("actors", self._start_actors, self._stop_actors),
            ("gateway", self._start_gateway, self._stop_gateway),
            ("ticker", self._start_ticker, self._stop_ticker),
        ]
        for name, up, down in parts:
            self._up.append((name, down))  # before up(): a part that failed half-way is swept
            up()
        log.info(
            "pearld up at %s in %.2fs (state %s, boot %s)",
            self.address,
            time.monotonic() - t0,
            self.state_dir,
            self.boot_id,
        )

    def _bind_api(self) -> None:
        from actors.api import ApiSockets

        self._api_sockets = ApiSockets(self.endpoint, self.keys, self.board)
        self.address = self._api_sockets.server.address  # worker hosts dial the bound address

    def _unbind_api(self, failed: bool) -> None:
        if self._api_sockets is not None:  # never handed to the API actor (it closes its own)
            self._api_sockets.close()
            self._api_sockets = None

    def _open_log(self) -> None:
        self.event_log = open_log(self.cfg, self.state_dir)

    def _close_log(self, failed: bool) -> None:
        if self.event_log is not None:
            self.event_log.close()  # releases the state directory's lock
            self.event_log = None

    def _make_launcher(self) -> None:
        from actors.launcher import LocalProcessLauncher
        from actors.worker_host import ENGINE_MODULES

        if self._ray is not None:  # joined at start
            self.launcher, self._ray = self._ray, None
            return
        engine = ENGINE_MODULES.get(self.cfg.engine.kind, "pearl.engines.base")
        preload = ("actors.worker_host", engine) if self.cfg.daemon.fork_hosts else ()
        self.launcher = LocalProcessLauncher(
            self.state_dir / "workers", preload, str(self.state_dir)
        )

    def _reap_workers(self, failed: bool) -> None:
        # After a failed start, even with keep_workers: nobody will adopt them.
        if self.launcher is not None and (failed or not self.keep_workers):
            self.launcher.reap_all()
        if self.launcher is not None:
            self.launcher.close()

    def _start_metrics(self) -> None:
        """The Prometheus endpoint (``[daemon] metrics``): bound before the actors, so an address
        that is taken fails the start at once; off when empty (and so are the worker hosts', and
        the supervisor keeps no ``targets.json``: an earlier run's goes)."""
        from pearl.metrics import TARGETS, Metrics, MetricsServer

        if not self.cfg.daemon.metrics:
            (self.state_dir / TARGETS).unlink(missing_ok=True)
            return
        self.metrics = Metrics(deaths=self.board.report, hosts=self.board.outcomes)
        server = self.metrics_server = MetricsServer(self.metrics, self.cfg.daemon.metrics)
        self.metrics.http_connections = lambda: server.connections
        if self.event_log is not None:
            self.event_log.on_sync = self.metrics.log_synced
        log.info("metrics at http://%s/metrics", self.metrics_server.address)

    def _stop_metrics(self, failed: bool) -> None:
        if self.event_log is not None:
            self.event_log.on_sync = None
        if self.metrics_server is not None:
            self.metrics_server.close()
            self.metrics_server = None

    def _start_actors(self) -> None:
        from actors import base

        controller, recovered = self._recover()
        self.directory = base.Directory()
        if self.routes is not None:
            self.directory.register(self.routes)
        self.pipeline = build_pipeline(self.cfg)
        self.factories = self._factories(recovered)
        for name, make in self.factories.items():  # dependency order
            self.refs.append(make(controller, recovered) if name == names.ORCHESTRATOR else make())
        for r in self.refs:
            if not r.ref.is_alive():
                raise PearlError(f"actor {r.name} did not stay alive")

    def _stop_actors(self, failed: bool) -> None:
        by_name = {r.name: r for r in self.refs}
        order = [n for n in self.factories if n in by_name]
        order += [n for n in by_name if n not in self.factories]
        for name in reversed(order):
            try:
                by_name[name].ref.stop(timeout=10)
            except Exception as e:  # keep going: sweep the rest
                log.warning("stopping %s: %s", name, e)

    def _bind_gateway(self) -> None:
        """The gateway's socket and API key, before anything is written: a taken address or an
        unreadable key fails the start with the state directory untouched."""
        from pearl.gateway.serve import bind, read_api_key

        g = self.cfg.gateway
        if g.listen:
            self._gateway_key = read_api_key(g.api_key_file)
            if g.processes:  # their port, held (not listened on) while they serve it
                self._gateway_sock = bind(g.listen, reuse_port=True, backlog=None)
            else:
                self._gateway_sock = bind(g.listen)

    def _unbind_gateway(self, failed: bool) -> None:
        if self._gateway_sock is not None:  # never handed to the server (it closes its own)
            self._gateway_sock.close()
            self._gateway_sock = None

    def _start_gateway(self) -> None:
        """The OpenAI-compatible gateway (``[gateway] listen``), once the actors it routes to
        are up; off when empty. A taken address fails the start in one line. With
        ``[gateway] processes``, the gateway processes serve it, fed by the routes feed."""
        if self._gateway_sock is None:
            return
        if self.cfg.gateway.processes:
            self._start_gateway_processes()
            return
        from pearl.gateway.app import open_gateway
        from pearl.gateway.pool import PoolBackend

        self.gateway_backend = PoolBackend(self.directory, self.cfg)
        sock, self._gateway_sock = self._gateway_sock, None
        self.gateway = open_gateway(self.gateway_backend, self.cfg.gateway, sock, self._gateway_key)
        self.gateway_address = self.gateway.address

    def _start_gateway_processes(self) -> None:
        import dataclasses
        import json

        from pearl.gateway.processes import GatewayProcesses

        assert self._gateway_sock is not None and self.routes is not None
        host, port = self._gateway_sock.getsockname()[:2]
        self.gateway_address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self.gateway_processes = GatewayProcesses(
            self.cfg.gateway.processes,
            folder=self.state_dir / "gateway",
            config_json=json.dumps(dataclasses.asdict(self.cfg)),
            endpoint=self.address,
            routes=self.routes.addresses,
            listen=self.gateway_address,
        )
        self.gateway_processes.start()

    def _stop_gateway(self, failed: bool) -> None:
        self.gateway_address = None
        if self.gateway_processes is not None:
            self.gateway_processes.stop()
            self.gateway_processes = None
        if self.gateway is not None:
            self.gateway.stop()
            self.gateway = None
        if self.gateway_backend is not None:
            self.gateway_backend.close()
            self.gateway_backend = None

    def _start_routes(self) -> None:
        """The routes feed of the gateway processes (``[gateway] processes``), before the
        actors: it hears the first view and every host's hello. Bound where pearld's API is,
        with its keys."""
        if not (self.cfg.gateway.listen and self.cfg.gateway.processes):
            return
        from pearl.gateway.feed import RouteFeed, serving_host

        self.routes = RouteFeed(serving_host(self.address), self.keys)

    def _stop_routes(self, failed: bool) -> None:
        if self.routes is not None:
            self.routes.close()
            self.routes = None

    def _start_ticker(self) -> None:
        self._ticker = threading.Thread(target=self._tick, name="ticker", daemon=True)
        self._ticker.start()

    def _stop_ticker(self, failed: bool) -> None:
        if self._ticker is not None:
            self._ticker.join(5.0)

    def _factories(self, recovered: Output) -> dict[str, Factory]:
        """How to (re)start each actor, in dependency order."""
        from actors import base
        from actors.api import Memo
        from actors.control import DecisionEngine, ElasticScheduler, RuntimeTracker
        from actors.executors import InterScaleRebuilder, IntraScaleToggleManager
        from actors.messages import StateChanged
        from actors.orchestrator import Boot, Orchestrator
        from actors.router import Router
        from actors.supervisor import RoleSupervisor
        from pearl.core.view import cluster_view
        from pearl.engines.sglang.router import link_from_config

        d, cfg = self.directory, self.cfg
        initial = StateChanged(view=cluster_view(recovered.state, boot_id=self.boot_id))
        self._api_memo = Memo()
        board = self.board

        def supervisor() -> LocalRef:
            return base.start(
                d,
                RoleSupervisor,
                directory=d,
                launcher=self.launcher,
                config=cfg,
                endpoint=lambda: self.address,
                state_dir=str(self.state_dir),
                boot_id=self.boot_id,
                board=board,
                initial=initial,
                metrics=self.metrics_server.address if self.metrics_server is not None else "",
            )

        def orchestrator(
            controller: Controller | None = None, out: Output | None = None
        ) -> LocalRef:
            if controller is None:  # a restart: the log is the truth
                controller, out = self._recover()
            ref = base.start(
                d,
                Orchestrator,
                directory=d,
                event_log=self.event_log,
                controller=controller,
                recovered=out,
                snapshot_every=cfg.daemon.snapshot_every,
                boot_id=self.boot_id,
                metrics=Observers(self.metrics, self.plans),
            )
            ref.ask(Boot(), 30.0)  # log and send what recovery decided, now it has a name
            return ref

        specs: dict[str, Factory] = {
            names.SUPERVISOR: supervisor,
            names.REBUILDER: lambda: base.start(d, InterScaleRebuilder, d),
            names.TOGGLE: lambda: base.start(d, IntraScaleToggleManager, d),
            # Every request may wait for a worker as long as the gateway's (the pipeline's too).
            names.ROUTER: lambda: base.start(
                d,
                Router,
                directory=d,
                link=link_from_config(cfg.engine),
                wait_s=cfg.gateway.request_timeout_s,
            ),
            names.TRACKER: lambda: base.start(
                d,
                RuntimeTracker,
                directory=d,
                alpha=cfg.decision.ema_alpha,
                L_max=float(cfg.workload.max_trajectory_tokens),
            ),
            names.DECISION: lambda: base.start(d, DecisionEngine, cfg.decision),
            names.SCHEDULER: lambda: base.start(d, ElasticScheduler, d),
        }
        if self.pipeline is not None:
            from actors.pipeline import PipelineActor

            pipeline = self.pipeline
            specs[names.PIPELINE] = lambda: base.start(
                d, PipelineActor, directory=d, pipeline=pipeline
            )
        # The API binds last but one; the orchestrator, last, is the first to stop taking input.
        specs[names.API] = self._start_api
        specs[names.ORCHESTRATOR] = orchestrator
        # after the orchestrator booted
        if cfg.daemon.launcher is config_mod.Launcher.RAY and cfg.ray.node_events:
            from actors.ray_launcher import RayLauncher
            from actors.ray_nodes import RayNodeWatcher, read_nodes

            assert isinstance(self.launcher, RayLauncher)  # joined at start
            ray = self.launcher.ray
            specs[names.NODES] = lambda: base.start(
                d,
                RayNodeWatcher,
                directory=d,
                cfg=cfg,
                read=lambda: read_nodes(ray),
                initial=initial,
            )
        return specs

    def _start_api(self) -> LocalRef:
        """The API endpoint: on the sockets bound at start, or, on a restart, on new ones (the
        address the failed endpoint held is freed first)."""
        from actors import base
        from actors.api import REBIND_S, ApiEndpoint, ApiSockets

        take = self.pipeline.take if self.pipeline is not None else None
        bound, self._api_sockets = self._api_sockets, None  # at start; a restart binds anew
        if bound is None:
            if self._api_live is not None:
                self._api_live.close()
            bound = ApiSockets.bind(
                endpoint=self.endpoint, keys=self.keys, board=self.board, wait_s=REBIND_S
            )
        self._api_live = bound
        ref = base.start(
            self.directory,
            ApiEndpoint,
            directory=self.directory,
            endpoint=self.endpoint,
            boot_id=self.boot_id,
            board=self.board,
            keys=self.keys,
            batches=take,
            weights=self.store_weights,
            observer=self.metrics.api_request if self.metrics is not None else None,
            bound=bound,
            memo=self._api_memo,
        )
        self.address = ref.ref.proxy().address.get()
        return ref

    def batches(self) -> Pipeline:
        """The rollout pipeline's batches (``take(timeout_s)``), for an in-process trainer."""
        if self.pipeline is None:
            raise PearlError("no rollout pipeline: set [rl] env in the config")
        return self.pipeline

    def store_weights(self, version: int, data: bytes) -> str:
        """Weights uploaded by a remote trainer: store them, then log weights-published."""
        from pearl.rl.weights import WeightStore

        store = WeightStore(self.state_dir / "weights")
        tmp = self.state_dir / "weights" / f".upload-{version}.safetensors"
        tmp.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(data)
        try:
            path = store.publish(version, tmp)
        finally:
            tmp.unlink(missing_ok=True)
        self.directory.get(names.SCHEDULER).ask(ev.WeightsPublished(version=version, uri=str(path)))
        return str(path)

    def _restart_dead(self) -> None:
        """Supervise the actors: one that died (its failure is logged by the actor) is started
        again from its factory. An actor that cannot be restarted, or fails a fifth time within
        5 minutes, stops pearld: one critical line says which and why, :attr:`failed` is set,
        and nothing is restarted after it (pearld exits 1, it never loops)."""
        for r in list(self.refs):
            if self._stop.is_set() or self.failed.is_set():
                return
            if r.ref.is_alive() or r.name not in self.factories:
                continue
            name = r.name
            now = time.monotonic()
            recent = [t for t in self._restarts.get(name, []) if now - t < 300.0]
            if len(recent) >= 5:
                self._give_up(
                    f"actor {name} keeps failing ({len(recent)} restarts in 5 min); shutting "
                    "down: its failures above say why"
                )
                return
            self._restarts[name] = [*recent, now]
            log.warning("restarting actor %s (restart %d in 5 min)", name, len(recent) + 1)
            self.refs = [x for x in self.refs if x is not r]
            self.directory.unregister(name, r)
            try:
                self.refs.append(self.factories[name]())
            except Exception as e:
                self._give_up(f"actor {name} could not be restarted: {e}; shutting down")
                return
            if name == names.ROUTER:  # the requests it held died with it: their senders resend
                for client in self.directory.refs():
                    if isinstance(client, RolloutClient):
                        client.reroute()
                self.directory.tell(names.PIPELINE, RouterRestarted())

    def _give_up(self, why: str) -> None:
        self.failure = why
        log.critical("%s", why)
        self.failed.set()

    def _tick(self) -> None:
        from actors.messages import Supervise
        from actors.router import Flush
        from pearl.core.commands import Tick

        try:
            while not self._stop.wait(self.cfg.daemon.tick_s):
                self._restart_dead()
                self.directory.tell(names.ORCHESTRATOR, Tick())
                self.directory.tell(names.ROUTER, Flush())
                self.directory.tell(names.SUPERVISOR, Supervise())
        except Exception as e:  # unsupervised, deadlines unchecked: pearld must not run on
            log.debug("ticker failed", exc_info=e)
            self._give_up(f"the ticker failed: {type(e).__name__}: {e}; shutting down")

    @property
    def parts(self) -> list[str]:
        """The parts started and not yet stopped, in start order (``stop`` ends them in reverse)."""
        return [name for name, _ in self._up]

    def stop(self, failed: bool = False) -> None:
        """Stop what started, in reverse: the ticker, the actors (the orchestrator first), the
        worker hosts this pearld started (all of them after a ``failed`` start, even with
        keep_workers), then the log, which releases the state directory's lock."""
        self._stop.set()
        while self._up:
            name, down = self._up.pop()
            try:
                down(failed)
            except Exception as e:  # keep going: sweep the rest
                log.warning("stopping %s: %s", name, e)
        if self._ray is not None:  # joined Ray, failed before the launcher part took it
            self._ray.close()
            self._ray = None
        log.log(logging.DEBUG if failed else logging.INFO, "pearld stopped")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pearld", description="PEARL daemon")
    p.add_argument("--config", help="TOML config (default: built-in defaults)")
    p.add_argument(
        "--state-dir", default=".pearl", help="event log and worker logs (default .pearl)"
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override one config value (repeatable)",
    )
    p.add_argument(
        "--endpoint",
        default=os.environ.get("PEARL_ENDPOINT") or None,  # as `pearl` finds it
        help="where the API listens (default: $PEARL_ENDPOINT, else the config's daemon.endpoint)",
    )
    p.add_argument(
        "--keep-workers",
        action="store_true",
        help="leave worker hosts running on shutdown (they re-register on restart)",
    )
    p.add_argument("--log-level", default="INFO")
    return p


def check_engine(cfg: config_mod.Config) -> None:
    """ConfigError, in one line, when the configured engine cannot start on any worker: a
    server engine with no model path; and, with local worker hosts, a vLLM model directory or
    interpreter that is not there (pearld would otherwise relaunch hosts that never serve)."""
    e = cfg.engine
    if e.kind is config_mod.EngineKind.VLLM:
        from pearl.engines.vllm.launch import preflight

        preflight(e.vllm, local=cfg.daemon.launcher is not config_mod.Launcher.RAY)
    elif e.kind is config_mod.EngineKind.SGLANG:
        from pearl.engines.sglang.launch import spec_from_config

        spec_from_config(e.sglang, cfg.cluster.tp, 0)


def startup_error(e: Exception) -> str:
    """The one line pearld prints when it cannot start."""
    if isinstance(e, PearlError):
        return str(e)
    if isinstance(e, OSError):
        where = f" {e.filename}" if e.filename else ""
        return f"cannot start: {e.strerror or e}:{where}; check the path and its permissions"
    log.debug("start-up failed", exc_info=e)
    return (
        f"cannot start: {type(e).__name__}: {e} (unexpected: please report it; "
        "--log-level DEBUG shows where it happened)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(StructuredFormatter())
    logging.basicConfig(level=args.log_level.upper(), handlers=[handler])
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    try:
        cfg = config_mod.load(args.config, args.set)
        if cfg.gateway.listen:  # its connections are capped at a quarter of the limit
            from pearl.gateway.serve import raise_fd_limit

            raise_fd_limit()
        daemon = Daemon(
            cfg=cfg,
            state_dir=Path(args.state_dir),
            endpoint=args.endpoint,
            keep_workers=args.keep_workers,
        )
        daemon.start()  # on failure it has stopped what it started and released the lock
    except Exception as e:
        print(f"pearld: {startup_error(e)}", file=sys.stderr, flush=True)
        pykka.ActorRegistry.stop_all(timeout=2.0)  # stragglers: no thread may keep us alive
        return 1
    print(f"pearld listening on {daemon.address} (pid {os.getpid()})", flush=True)
    if daemon.gateway_address is not None:
        print(f"gateway at http://{daemon.gateway_address}/v1", flush=True)
    try:
        while not done.wait(0.5):
            if daemon.failed.is_set():
                break
    finally:
        daemon.stop()
    return 1 if daemon.failed.is_set() else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
