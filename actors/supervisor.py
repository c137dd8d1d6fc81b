"""The RoleSupervisor: worker host processes, their liveness, restarts and reconciliation.

It launches a host for every worker the plan adds, hands the host its first command once it says
hello, watches heartbeats (dead after 3 missed intervals) and process exits, restarts a crashed
host on the same GPUs with a restart budget and exponential back-off (reporting ``worker-down``,
then ``worker-lost`` when the budget is spent), and after a pearld restart adopts the hosts that
re-register, stops the ones the log does not know, and relaunches the ones that never come back.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from actors.base import Directory, PearlActor, RemoteRef
from actors.launcher import Launcher, WorkerSpec
from actors.messages import RestoreWorker, StateChanged, Supervise, Welcome, WorkerBeat, WorkerHello
from actors.router import KvAddress
from pearl.config import Config
from pearl.core import commands as cmd
from pearl.core.state import Role
from transports.heartbeat import Liveness
from transports.rpc import Client

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Spawn:
    """Start a host for ``command``'s worker and give it ``command`` once it says hello."""

    command: Any


@dataclass(frozen=True)
class Retire:
    """The worker leaves for good: do not restart it; kill it when ``force`` or once it exits."""

    worker: int
    force: bool = False
    report: Any = None  # a StepResult to send once the host is gone


@dataclass
class Host:
    worker: int
    incarnation: int
    gpus: tuple[int, ...]
    pid: int = 0
    ref: RemoteRef | None = None
    kv_address: str = ""
    restarts: int = 0
    restart_at: float | None = None
    pending: list[Any] = field(default_factory=list)  # commands waiting for hello
    retiring: bool = False
    retire_report: Any = None
    launched_at: float = 0.0


class RoleSupervisor(PearlActor):
    name = "supervisor"
    handles = {
        Spawn: "spawn",
        Retire: "retire",
        WorkerHello: "hello",
        WorkerBeat: "beat",
        StateChanged: "state_changed",
        Supervise: "supervise",
    }

    def __init__(
        self,
        directory: Directory,
        launcher: Launcher,
        config: Config,
        endpoint: Callable[[], str],
        state_dir: str,
        boot_id: str,
        hello_timeout_s: float = 120.0,
        initial: StateChanged | None = None,
    ) -> None:
        super().__init__()
        self.directory, self.launcher, self.cfg = directory, launcher, config
        self.endpoint, self.state_dir, self.boot_id = endpoint, state_dir, boot_id
        self.hosts: dict[int, Host] = {}
        self.liveness = Liveness(config.daemon.heartbeat_s)
        # worker id -> row of the table; starts from the replayed table so that hosts saying
        # hello before the first published change are judged against the log, not nothing.
        self.expected: dict[int, dict[str, Any]] = {}
        self.weights_version = 0
        if initial is not None:
            self.state_changed(initial)
        self.booted = time.monotonic()
        self.hello_timeout_s = hello_timeout_s

    # -- launching -------------------------------------------------------------------------

    def spawn(self, msg: Spawn) -> None:
        c = msg.command
        h = self.hosts.get(c.worker)
        if h is not None and h.ref is not None and self.launcher.alive(h.pid):
            h.ref.tell(c)  # already up (e.g. re-sent after a pearld restart)
            return
        row = self.expected.get(c.worker, {})
        gpus = tuple(getattr(c, "gpus", ()) or row.get("gpus", ()))
        inc = getattr(c, "incarnation", 0) or row.get("incarnation", 0)
        h = h or Host(c.worker, inc, gpus)
        h.pending.append(c)
        self.hosts[c.worker] = h
        if not h.pid or not self.launcher.alive(h.pid):
            self._launch(h)

    def _launch(self, h: Host) -> None:
        d = self.cfg.daemon
        spec = WorkerSpec(
            h.worker,
            h.incarnation,
            h.gpus,
            self.endpoint(),
            self.cfg.engine,
            self.cfg.model.name,
            self.cfg.cluster.gpu,
            self.cfg.cluster.tp,
            d.heartbeat_s,
            d.worker_orphan_s,
            self.state_dir,
        )
        h.pid = self.launcher.launch(spec)
        h.ref, h.launched_at = None, time.monotonic()
        log.info(
            "launched worker host %s (incarnation %s) pid %s on GPUs %s",
            h.worker,
            h.incarnation,
            h.pid,
            list(h.gpus),
        )

    def hello(self, msg: WorkerHello) -> Welcome:
        row = self.expected.get(msg.worker)
        known = row is not None and row["incarnation"] == msg.incarnation
        h = self.hosts.get(msg.worker)
        if not known and (h is None or h.incarnation != msg.incarnation):
            log.warning(
                "stopping worker host %s/%s pid %s: the log does not know it",
                msg.worker,
                msg.incarnation,
                msg.pid,
            )
            self.launcher.kill(msg.pid, force=True)
            return Welcome(self.boot_id, known=False)
        if h is None:  # adopted after a pearld restart
            h = self.hosts[msg.worker] = Host(msg.worker, msg.incarnation, tuple(row["gpus"]))  # type: ignore[index]
        h.pid, h.kv_address = msg.pid, msg.kv_address
        if h.ref is not None:
            h.ref.client.close()
        h.ref = RemoteRef(f"worker/{msg.worker}", Client(msg.address, timeout_s=5.0, retries=2))
        self.directory.register(h.ref)
        self.directory.tell("router", KvAddress(msg.worker, msg.kv_address))
        self.liveness.beat(str(msg.worker))
        pending, h.pending = h.pending, []
        if not pending and not msg.engine_ready and row is not None and not h.retiring:
            # A restarted host: bring its engine back as the table says it should be.
            pending = [
                RestoreWorker(
                    h.worker,
                    h.incarnation,
                    Role(row["role"]),
                    self.weights_version,
                    active=row["activity"] != "inactive",
                )
            ]
        elif msg.engine_ready and row is not None:
            self.directory.tell("orchestrator", cmd.WorkerUp(h.worker, h.incarnation))
        for c in pending:
            h.ref.tell(c)
        return Welcome(self.boot_id, known=True)

    def kv_address(self, worker: int) -> str:
        h = self.hosts.get(worker)
        return h.kv_address if h else ""

    def beat(self, msg: WorkerBeat) -> Welcome:
        h = self.hosts.get(msg.worker)
        if h is not None and h.incarnation == msg.incarnation:
            self.liveness.beat(str(msg.worker))
        return Welcome(self.boot_id, known=h is not None)

    # -- retiring ------------------------------------------------------------------------------

    def retire(self, msg: Retire) -> None:
        h = self.hosts.get(msg.worker)
        if h is None or not h.pid:
            if msg.report is not None:
                self.directory.tell("orchestrator", msg.report)
            return
        h.retiring, h.retire_report = True, msg.report
        if msg.force or h.ref is None:
            self._forget(h, kill=True)

    def _forget(self, h: Host, kill: bool) -> None:
        if kill and h.pid:
            self.launcher.kill(h.pid, force=True)
        if h.ref is not None:
            self.directory.unregister(h.ref.name, h.ref)
            h.ref.client.close()
        self.liveness.forget(str(h.worker))
        self.hosts.pop(h.worker, None)
        if h.retire_report is not None:
            self.directory.tell("orchestrator", h.retire_report)

    # -- watching ----------------------------------------------------------------------------

    def state_changed(self, msg: StateChanged) -> None:
        rows = {w["id"]: w for w in msg.status["workers"] if w["role"] != "training"}
        self.expected = rows
        self.weights_version = msg.status.get("weights_version", 0)
        for wid, h in list(self.hosts.items()):
            if wid not in rows and not h.pending:
                self._forget(h, kill=True)  # removed by a plan

    def supervise(self, _: Supervise) -> None:
        now = time.monotonic()
        dead = set(self.liveness.reap())
        for wid, h in list(self.hosts.items()):
            if h.restart_at is not None:
                if now >= h.restart_at:
                    h.restart_at = None
                    self._launch(h)
                continue
            exited = h.pid and not self.launcher.alive(h.pid)
            silent = h.ref is not None and str(wid) in dead
            never = h.ref is None and now - h.launched_at > self.hello_timeout_s
            if h.retiring:
                if exited or silent or never:
                    self._forget(h, kill=True)
                continue
            if exited or silent or never:
                why = "exited" if exited else "missed heartbeats" if silent else "never said hello"
                self._crashed(h, why)
        if now - self.booted > self.cfg.daemon.reconcile_grace_s:
            for wid, row in self.expected.items():  # in the log, never came back after a restart
                if wid not in self.hosts and row["activity"] != "inactive":
                    h = self.hosts[wid] = Host(wid, row["incarnation"], tuple(row["gpus"]))
                    self._crashed(h, "did not re-register after pearld restarted")

    def _crashed(self, h: Host, why: str) -> None:
        log.warning("worker host %s (pid %s) %s", h.worker, h.pid, why)
        if h.pid:
            self.launcher.kill(h.pid, force=True)
        if h.ref is not None:
            self.directory.unregister(h.ref.name, h.ref)
            h.ref.client.close()
            h.ref = None
        self.liveness.forget(str(h.worker))
        self.directory.tell("orchestrator", cmd.WorkerDown(h.worker, h.incarnation, why))
        d = self.cfg.daemon
        if h.restarts >= d.restart_budget:
            self.hosts.pop(h.worker, None)
            self.directory.tell(
                "orchestrator",
                cmd.WorkerLost(h.worker, f"{why}; gave up after {h.restarts} restarts"),
            )
            return
        h.restart_at = time.monotonic() + d.restart_backoff_s * 2**h.restarts
        h.restarts += 1

    def on_stop(self) -> None:
        for h in list(self.hosts.values()):
            if h.ref is not None:
                h.ref.client.close()


__all__ = ["RoleSupervisor", "Retire", "Spawn"]
