"""The RoleSupervisor: worker host processes, their liveness, restarts and reconciliation.

It launches a host for every worker the plan adds, hands the host its first command once it says
hello, watches heartbeats (dead after 3 missed intervals) and process exits, restarts a crashed
host on the same GPUs with a restart budget and exponential back-off (reporting ``worker-down``,
then ``worker-lost`` when the budget is spent), and after a pearld restart adopts the hosts that
re-register, stops the ones the log does not know, and relaunches the ones that never come back.
When pearld serves metrics, every host serves its own on a free loopback port, and the supervisor
keeps ``targets.json`` (Prometheus file SD) in the state directory: pearld and each live host,
rewritten when that set or a host's role changes.

Heartbeats are recorded on a lock-protected :class:`Liveboard` by the API's thread directly (any
message from a host counts, and silence is judged only up to the moment that thread last had
nothing left to read), and commands reach hosts through courier threads, so a busy supervisor, a
busy API or a dead host never makes a healthy host look dead. A host that dies or is killed takes
no answer with it: the Router hears ``WorkerGone`` and routes its requests again elsewhere.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from actors import names
from actors.base import CourierRef, Directory, PearlActor
from actors.heart import host_of
from actors.launcher import Handle, Launcher, LaunchError, WorkerSpec
from actors.messages import (
    Generate,
    RestoreWorker,
    StateChanged,
    Supervise,
    Welcome,
    WorkerHello,
)
from actors.router import KvAddress, WorkerGone
from pearl.config import Config
from pearl.core import commands as cmd
from pearl.core.errors import PearlError
from pearl.core.state import Activity, Worker
from pearl.gateway.feed import HostUp
from pearl.metrics import TARGETS, write_targets
from transports.auth import DaemonKeys
from transports.heartbeat import Clock, Liveness
from transports.protocol import LIVENESS
from transports.rpc import Client

log = logging.getLogger(__name__)

BUSY_GRACE = 10  # a silent host still computing is spared up to this many heartbeat timeouts
HOST_METRICS = "127.0.0.1:0"  # where a host serves its metrics when pearld serves its own


class Death(enum.StrEnum):
    """Why a worker host was declared dead: the category counted and exported; the value is the
    first words of the reason the orchestrator and router hear."""

    EXITED = "exited"
    SILENT = "missed heartbeats"
    NO_HELLO = "never said hello"
    NOT_LAUNCHED = "could not be launched"
    UNREACHABLE = "unreachable"  # its reason adds the error in parentheses
    NOT_BACK = "did not re-register after pearld restarted"


class Liveboard:
    """Which hosts are registered, where each serves its metrics, when each was last heard from,
    and how many were declared dead for what. Thread-safe; survives supervisor restarts (the
    daemon owns it)."""

    def __init__(self, interval_s: float, clock: Clock = time.monotonic) -> None:
        self._live = Liveness(interval_s, clock=clock)
        self._known: dict[int, int] = {}  # worker -> incarnation
        self._metrics: dict[int, str] = {}  # worker -> HOST:PORT of its GET /metrics
        self._nodes: dict[int, str] = {}  # worker -> Ray node id of its host
        self._faults: dict[int, str] = {}  # worker -> why its host last died or could not start
        self._lock = threading.Lock()
        self.deaths: Counter[Death] = Counter()  # hosts declared dead, by category
        self.spared_busy = 0  # times a silent host was found computing, not dead
        self.fates: Counter[str] = Counter()  # dead hosts "restarted" / "lost" (budget spent)
        self.ear = _Ear(self)  # the API server's Listener

    def add(self, worker: int, incarnation: int, metrics: str = "", node: str = "") -> None:
        with self._lock:
            self._known[worker] = incarnation
            self._live.beat(str(worker))
            for table, value in ((self._metrics, metrics), (self._nodes, node)):
                if value:
                    table[worker] = value
                else:
                    table.pop(worker, None)

    def remove(self, worker: int) -> None:
        with self._lock:
            self._known.pop(worker, None)
            self._metrics.pop(worker, None)
            self._nodes.pop(worker, None)
            self._live.forget(str(worker))

    def fault(self, worker: int, why: str) -> None:
        """Why ``worker``'s host last died or could not start (shown by ``pearl status``)."""
        with self._lock:
            self._faults[worker] = why

    def clear_fault(self, worker: int) -> bool:
        """``worker`` serves (or left the table): forget its fault; whether it had one."""
        with self._lock:
            return self._faults.pop(worker, None) is not None

    def faults(self) -> dict[int, str]:
        with self._lock:
            return dict(self._faults)

    def metrics(self) -> dict[int, str]:
        """Registered hosts that serve metrics: worker -> HOST:PORT."""
        with self._lock:
            return dict(self._metrics)

    def nodes(self) -> dict[int, str]:
        """Registered hosts on Ray: worker -> the node id it said hello from."""
        with self._lock:
            return dict(self._nodes)

    def beat(self, worker: int, incarnation: int) -> bool:
        """Record a heartbeat; False when that host is not (or no longer) registered."""
        with self._lock:
            if self._known.get(worker) != incarnation:
                return False
            self._live.beat(str(worker))
            return True

    def dead(self) -> set[int]:
        with self._lock:
            return {int(str(w)) for w in self._live.dead()}

    def behind(self) -> None:
        self._live.behind()

    def caught_up(self) -> None:
        self._live.caught_up()

    def declared(self, death: Death) -> None:
        """A host was declared dead (or lost) for ``death``: count it."""
        with self._lock:
            self.deaths[death] += 1

    def spared(self) -> None:
        with self._lock:
            self.spared_busy += 1

    def ended(self, fate: str) -> None:
        """What became of a host declared dead: ``restarted`` or ``lost``."""
        with self._lock:
            self.fates[fate] += 1

    def outcomes(self) -> dict[str, int]:
        """Dead hosts relaunched (``restarts``) and given up on (``lost``) so far."""
        with self._lock:
            return {"restarts": self.fates["restarted"], "lost": self.fates["lost"]}

    def report(self) -> dict[str, int]:
        """Hosts declared dead by reason, and ``silent but busy``: silences found to be compute."""
        with self._lock:
            return {
                **{d.value: n for d, n in self.deaths.items()},
                "silent but busy": self.spared_busy,
            }


class _Ear:
    """The Liveboard as the API server's Listener: any message a host's client sends is a beat."""

    def __init__(self, board: Liveboard) -> None:
        self.board = board

    def beat(self, peer: str) -> None:
        host = host_of(peer)
        if host is not None:
            self.board.beat(*host)

    def behind(self) -> None:
        self.board.behind()

    def caught_up(self) -> None:
        self.board.caught_up()


@dataclass(frozen=True)
class HostsChanged:
    """Told to the API: a host came or went (its metrics address is on the Liveboard)."""


@dataclass(frozen=True)
class Deaths:
    """Ask the supervisor: hosts declared dead so far, by reason (``missed heartbeats``, ...)."""


@dataclass(frozen=True)
class Spawn:
    """Start a host for ``command``'s worker and give it ``command`` once it says hello."""

    command: cmd.StartWorker | cmd.ActivateWorker


@dataclass(frozen=True)
class Deliver:
    """A plan step for a worker whose host has not said hello yet (one still starting in the
    background): give it after what the host was launched with, in order; with no such host,
    the step fails at once."""

    command: cmd.PlanStep


@dataclass(frozen=True)
class Retire:
    """The worker leaves for good: do not restart it; kill it when ``force`` or once it exits."""

    worker: int
    force: bool = False
    # A StepResult (or WorkerDown) to send once the host is gone.
    report: cmd.StepResult | cmd.WorkerDown | None = None
    # A StepResult the host itself owes (it was told the step): sent if it dies instead (a lost
    # node takes the host with the stop in flight); a second result of a done step is ignored.
    fallback: cmd.StepResult | None = None
    incarnation: int = 0  # only this host (0: whichever serves the worker)


@dataclass(frozen=True)
class Undeliverable:
    """A courier could not deliver ``msg`` to worker host ``worker``."""

    worker: int
    msg: object
    error: str


@dataclass
class Host:
    worker: int
    incarnation: int
    gpus: tuple[int, ...]
    handle: Handle = 0  # the launcher's name for its process (a pid, a Ray actor); 0: none
    node_id: str = ""  # the Ray node it said hello from ("": not on Ray)
    ref: CourierRef | None = None
    restarts: int = 0
    restart_at: float | None = None
    pending: list[object] = field(default_factory=list)  # messages waiting for hello
    retiring: bool = False
    # told once the host is gone
    retire_reports: list[cmd.StepResult | cmd.WorkerDown] = field(default_factory=list)
    fallbacks: list[cmd.StepResult] = field(default_factory=list)  # told if it dies first
    launched_at: float = 0.0
    # (tick time, CPU seconds its process had used) over the last heartbeat timeout and one more
    cpu_seen: deque[tuple[float, float]] = field(default_factory=deque)
    busy_since: float | None = None  # silent but computing since then


class RoleSupervisor(PearlActor):
    name = names.SUPERVISOR

    def __init__(
        self,
        directory: Directory,
        launcher: Launcher,
        config: Config,
        endpoint: Callable[[], str],
        state_dir: str,
        boot_id: str,
        board: Liveboard,
        initial: StateChanged | None = None,
        hello_timeout_s: float = 120.0,
        metrics: str = "",  # where pearld serves its metrics; "": off (and so are the hosts')
    ) -> None:
        super().__init__()
        self.directory, self.launcher, self.cfg = directory, launcher, config
        self.endpoint, self.state_dir, self.boot_id = endpoint, state_dir, boot_id
        self.board = board
        self.metrics = metrics
        self.targets: dict[int, tuple[str, str]] | None = None  # as targets.json lists them
        # CURVE to the hosts' command servers when pearld has keys (checked at start-up).
        keys_dir = config.daemon.keys_dir
        self.host_keys = DaemonKeys.load(keys_dir).hosts if keys_dir else None
        self.hosts: dict[int, Host] = {}
        # worker id -> rollout worker of the table; starts from the replayed table so that hosts
        # saying hello before the first published change are judged against the log, not nothing.
        self.expected: dict[int, Worker] = {}
        self.weights_version = 0
        if initial is not None:
            self.state_changed(initial)
        self.awaited = {w for w, row in self.expected.items() if _engaged(row)}
        self.booted = time.monotonic()
        self.hello_timeout_s = hello_timeout_s
        self._targets()  # pearld's own, before any host says hello

    # -- launching -------------------------------------------------------------------------

    def spawn(self, msg: Spawn) -> None:
        c = msg.command
        row = self.expected.get(c.worker)
        inc = getattr(c, "incarnation", 0) or (row.incarnation if row is not None else 0)
        h = self.hosts.get(c.worker)
        if h is not None and h.incarnation != inc:
            self._forget(h, kill=True)  # the slot's previous worker: not this one
            h = None
        if h is not None and h.ref is not None and self.launcher.alive(h.handle):
            h.ref.tell(c)  # already up (e.g. re-sent after a pearld restart)
            return
        gpus = tuple(getattr(c, "gpus", ()) or (row.gpus if row is not None else ()))
        h = h or Host(c.worker, inc, gpus)
        h.pending.append(c)
        self.hosts[c.worker] = h
        self.awaited.discard(c.worker)
        if not h.handle or not self.launcher.alive(h.handle):
            self._launch(h)

    def deliver(self, msg: Deliver) -> None:
        c = msg.command
        h = self.hosts.get(c.worker)
        row = self.expected.get(c.worker)
        if h is None or h.retiring or (row is not None and row.incarnation != h.incarnation):
            result = cmd.StepResult(
                plan=c.plan, step=c.step, ok=False, error="worker host not connected"
            )
            self.directory.tell(names.ORCHESTRATOR, result)
        elif h.ref is not None:
            h.ref.tell(c)
        else:
            h.pending.append(c)

    def _launch(self, h: Host) -> None:
        d = self.cfg.daemon
        spec = WorkerSpec(
            worker=h.worker,
            incarnation=h.incarnation,
            gpus=h.gpus,
            endpoint=self.endpoint(),
            engine=self.cfg.engine,
            model=self.cfg.model.name,
            gpu=self.cfg.cluster.gpu,
            tp=self.cfg.cluster.tp,
            heartbeat_s=d.heartbeat_s,
            orphan_s=d.worker_orphan_s,
            state_dir=self.state_dir,
            keys_dir=d.keys_dir,
            metrics=HOST_METRICS if self.metrics else "",
        )
        try:
            h.handle = self.launcher.launch(spec)
        except LaunchError as e:  # like a host that died at once: restart budget, then lost
            log.error("%s", e)
            h.handle, h.launched_at, h.restart_at = 0, time.monotonic(), None
            self._crashed(h, Death.NOT_LAUNCHED)
            return
        h.ref, h.launched_at = None, time.monotonic()
        h.restart_at = None  # launched now: a pending restart must not launch a second host
        h.busy_since = None
        h.cpu_seen.clear()
        log.info(
            "launched worker host %s (incarnation %s) as %s on GPUs %s",
            h.worker,
            h.incarnation,
            h.handle,
            list(h.gpus),
        )

    def hello(self, msg: WorkerHello) -> Welcome:
        row = self.expected.get(msg.worker)
        h = self.hosts.get(msg.worker)
        known = (row is not None and row.incarnation == msg.incarnation) or (
            h is not None and h.incarnation == msg.incarnation
        )
        if not known:
            log.warning(
                "stopping worker host %s/%s pid %s: the log does not know it",
                msg.worker,
                msg.incarnation,
                msg.pid,
            )
            self.launcher.kill(self.launcher.handle_of(msg), force=True)
            return Welcome(boot_id=self.boot_id, known=False)
        handle = self.launcher.handle_of(msg)
        if (
            h is not None
            and h.incarnation == msg.incarnation
            and h.handle
            and h.handle != handle
            and self.launcher.alive(h.handle)
        ):
            # A second host of this incarnation: an earlier pearld's host that came back after
            # reconcile_grace_s, when its worker had been relaunched. One host per worker: the
            # one pearld holds stays, and this one is stopped before it serves.
            log.warning(
                "stopping worker host %s/%s pid %s: the worker already runs as %s",
                msg.worker,
                msg.incarnation,
                msg.pid,
                h.handle,
            )
            self.launcher.kill(handle, force=True)
            return Welcome(boot_id=self.boot_id, known=False)
        if h is None or h.incarnation != msg.incarnation:  # adopted after a pearld restart
            assert row is not None
            h = self.hosts[msg.worker] = Host(msg.worker, msg.incarnation, row.gpus)
        self.awaited.discard(msg.worker)
        if h.handle != handle:  # another process: its CPU history is not this one's
            h.busy_since = None
            h.cpu_seen.clear()
        h.handle, h.node_id = handle, msg.node_id
        self.launcher.adopt(handle)  # stopped with pearld's own hosts at shutdown
        if h.ref is not None:  # hello again (its first reply was lost): a new courier
            self._drop_ref(h)  # drops what the old one had not delivered, requests included:
            self._gone(WorkerGone(h.worker, h.incarnation, "said hello again"))
        h.ref = CourierRef(
            names.worker_name(msg.worker),
            Client(msg.address, keys=self.host_keys, timeout_s=2.0, retries=2),
            self._undeliverable,
        )
        self.directory.register(h.ref)
        self.directory.tell(names.ROUTER, KvAddress(msg.worker, msg.kv_address))
        up = HostUp(worker=msg.worker, incarnation=msg.incarnation, address=msg.address,
                    kv_address=msg.kv_address)  # fmt: skip
        self.directory.tell(names.ROUTES, up)  # gateway processes route to it too
        self.board.add(msg.worker, msg.incarnation, msg.metrics_address, msg.node_id)
        self._targets()
        if msg.node_id:  # status shows where each host runs
            self.directory.tell(names.API, HostsChanged())
        pending, h.pending = h.pending, []
        # A start brings the engine up itself (its step result or WorkerUp says so), a stop
        # ends it: neither wants a restore.
        lifecycle = any(isinstance(c, cmd.StartWorker | cmd.StopWorker) for c in pending)
        if row is not None and not h.retiring and not lifecycle:
            # A restarted host: bring its engine back as the table says it should be, then the
            # steps that waited for it. Its WorkerUp is what takes the worker out of `failed`
            # (a step done does not), so it is restored even when steps wait. A running one
            # (adopted after a pearld restart) too: a plan step sent while it was not yet
            # connected (recovery re-sends them at once) left the table's role and activity
            # ahead of its engine, and routing by the table would send a prefill to a decode
            # engine. Restoring is idempotent: an engine already there only catches up on
            # weights, then reports WorkerUp.
            restore = RestoreWorker(
                worker=h.worker,
                incarnation=h.incarnation,
                role=row.role,
                weights_version=self.weights_version,
                active=_engaged(row),
            )
            pending = [restore, *pending]
        elif msg.engine_ready and row is not None:
            self.directory.tell(
                names.ORCHESTRATOR, cmd.WorkerUp(worker=h.worker, incarnation=h.incarnation)
            )
        for c in pending:
            h.ref.tell(c)
        return Welcome(boot_id=self.boot_id, known=True)

    def _undeliverable(self, name: str, msg: object, error: PearlError) -> None:
        """Courier thread: hand the failure to the actor's own thread."""
        worker = int(name.split("/", 1)[1])
        self.actor_ref.tell(Undeliverable(worker, msg, str(error)))

    def undeliverable(self, u: Undeliverable) -> None:
        h = self.hosts.get(u.worker)
        if h is None or h.retiring:
            return
        if not isinstance(u.msg, Generate):  # a request is routed again by the Router instead
            h.pending.append(u.msg)  # given again once it (or its replacement) says hello
        if h.ref is not None:
            self._crashed(h, Death.UNREACHABLE, u.error)

    # -- retiring ------------------------------------------------------------------------------

    def retire(self, msg: Retire) -> None:
        h = self.hosts.get(msg.worker)
        if h is not None and msg.incarnation and h.incarnation != msg.incarnation:
            h = None  # the held host is another incarnation: not the one to stop
        if h is None or not h.handle:
            if h is not None:
                self.hosts.pop(msg.worker, None)
            for report in (msg.report, msg.fallback):
                if report is not None:
                    self.directory.tell(names.ORCHESTRATOR, report)
            return
        h.retiring = True  # a second retire (a plan's stop after an eviction's) adds its report
        if msg.report is not None:
            h.retire_reports.append(msg.report)
        if msg.fallback is not None:
            h.fallbacks.append(msg.fallback)
        if msg.force or h.ref is None:
            self._forget(h, kill=True)

    def _gone(self, msg: WorkerGone) -> None:
        """What ran on a host will not answer: pearld's Router and the gateway processes'
        (through the routes feed) route it again elsewhere."""
        self.directory.tell(names.ROUTER, msg)
        self.directory.tell(names.ROUTES, msg)

    def _drop_ref(self, h: Host) -> None:
        if h.ref is not None:
            self.directory.unregister(h.ref.name, h.ref)
            h.ref.close()
            h.ref = None

    def _forget(self, h: Host, kill: bool) -> None:
        gone = WorkerGone(h.worker, h.incarnation, "stopped")
        if kill and h.handle:
            self.launcher.kill(h.handle, force=True)
            self._gone(gone)
        else:  # stopped of itself: nothing runs there, but gateway processes forget its address
            self.directory.tell(names.ROUTES, gone)
        self._drop_ref(h)
        self.board.remove(h.worker)
        self._targets()
        if self.hosts.get(h.worker) is h:
            self.hosts.pop(h.worker, None)
        for report in h.retire_reports:
            self.directory.tell(names.ORCHESTRATOR, report)
        h.retire_reports = []

    # -- watching ----------------------------------------------------------------------------

    def state_changed(self, msg: StateChanged) -> None:
        rows = {w.id: w for w in msg.view.rollout}
        self.expected = rows
        serving = {w.id for w in rows.values() if w.activity is Activity.ACTIVE}
        if any([self.board.clear_fault(w) for w in self.board.faults() if w in serving]):
            self.directory.tell(names.API, HostsChanged())  # status: the fault is over
        self.weights_version = msg.view.weights_version
        for wid, h in list(self.hosts.items()):
            row = rows.get(wid)
            if (row is None or row.incarnation != h.incarnation) and not h.pending:
                self._forget(h, kill=True)  # removed by a plan
        self._targets()  # roles may have changed

    def supervise(self, _: Supervise) -> None:
        now = time.monotonic()
        dead = self.board.dead()
        for wid, h in list(self.hosts.items()):
            if h.restart_at is not None:
                if now >= h.restart_at:
                    h.restart_at = None
                    self._launch(h)
                continue
            exited = bool(h.handle) and not self.launcher.alive(h.handle)
            self._sample_cpu(h, now)
            silent = h.ref is not None and wid in dead and not self._busy(h, now)
            if wid not in dead:
                h.busy_since = None
            never = h.ref is None and now - h.launched_at > self.hello_timeout_s
            if h.retiring:
                if exited or silent or never:
                    h.retire_reports += h.fallbacks  # the steps it may not have answered
                    self._forget(h, kill=True)
                continue
            if exited or silent or never:
                death = Death.EXITED if exited else Death.SILENT if silent else Death.NO_HELLO
                self._crashed(h, death)
        if self.awaited and now - self.booted > self.cfg.daemon.reconcile_grace_s:
            # In the log at boot, still expected, never re-registered: relaunch them.
            for wid in sorted(self.awaited):
                row = self.expected.get(wid)
                if row is not None and wid not in self.hosts and _engaged(row):
                    h = self.hosts[wid] = Host(wid, row.incarnation, row.gpus)
                    self._crashed(h, Death.NOT_BACK)
            self.awaited = set()

    def _sample_cpu(self, h: Host, now: float) -> None:
        """Record the CPU its process has used, keeping one heartbeat timeout of history (and
        the sample just before it, the baseline of :meth:`_busy`)."""
        cpu = self.launcher.cpu_s(h.handle) if h.handle else None
        if cpu is None:  # stopped, gone or unknown: no evidence of work
            h.cpu_seen.clear()
            return
        seen = h.cpu_seen
        seen.append((now, cpu))
        window = LIVENESS * self.cfg.daemon.heartbeat_s
        while len(seen) > 1 and seen[1][0] <= now - window:
            seen.popleft()

    def _busy(self, h: Host, now: float) -> bool:
        """Silent, yet its process runs and used CPU during the silence (the last heartbeat
        timeout): a long call that holds the interpreter (an import, a big allocation), or a
        process starved of the CPU by others, not a dead host; spared up to ``BUSY_GRACE`` x the
        heartbeat timeout. (Tick to tick is too short a look: a starved process may not gain
        one clock tick of CPU in 0.1 s.) A stopped, exited or idle-and-silent host is dead after
        3 missed intervals as ever."""
        seen = h.cpu_seen
        if len(seen) < 2 or seen[-1][1] <= seen[0][1]:
            return False
        if h.busy_since is None:
            h.busy_since = now
            self.board.spared()
            log.info("worker host %s (%s) is silent but computing", h.worker, h.handle)
        return now - h.busy_since < BUSY_GRACE * LIVENESS * self.cfg.daemon.heartbeat_s

    def _crashed(self, h: Host, death: Death, detail: str = "") -> None:
        if not detail and death in (Death.EXITED, Death.NO_HELLO):
            last_error = getattr(self.launcher, "last_error", None)  # what the host said last
            detail = last_error(h.worker, h.incarnation) if last_error is not None else ""
        why = f"{death} ({detail})" if detail else str(death)
        log.warning("worker host %s (%s) %s", h.worker, h.handle, why)
        self.board.declared(death)
        if h.handle:
            self.launcher.kill(h.handle, force=True)
            h.handle = 0
        self._drop_ref(h)
        self.board.remove(h.worker)
        self._targets()
        # Its requests will never be answered: the router sends them elsewhere at once.
        self._gone(WorkerGone(h.worker, h.incarnation, why))
        self.directory.tell(
            names.ORCHESTRATOR,
            cmd.WorkerDown(worker=h.worker, incarnation=h.incarnation, reason=why),
        )
        d = self.cfg.daemon
        if h.restarts >= d.restart_budget:
            self.board.ended("lost")
            self.hosts.pop(h.worker, None)
            lost = f"{why}; gave up after {h.restarts} restarts"
            self.board.fault(h.worker, lost)
            self.directory.tell(names.API, HostsChanged())
            self.directory.tell(names.ORCHESTRATOR, cmd.WorkerLost(worker=h.worker, reason=lost))
            return
        backoff = d.restart_backoff_s * 2**h.restarts
        h.restart_at = time.monotonic() + backoff
        h.restarts += 1
        self.board.ended("restarted")
        self.board.fault(
            h.worker, f"{why}; restart {h.restarts} of {d.restart_budget} in {backoff:g} s"
        )
        self.directory.tell(names.API, HostsChanged())

    def _targets(self) -> None:
        """Keep ``targets.json`` listing pearld and every registered host that serves metrics,
        with its role in the table; tell the API when the hosts changed (``status --json``)."""
        if not self.metrics:
            return
        addresses = self.board.metrics()
        live = {
            w: (address, row.role.value)
            for w, address in addresses.items()
            if (row := self.expected.get(w)) is not None
        }
        if live == self.targets:
            return
        path = Path(self.state_dir) / TARGETS
        try:
            write_targets(path, self.metrics, live)
        except OSError as e:  # tried again at the next change
            log.warning("cannot write %s: %s", path, e)
            return
        before, self.targets = self.targets, live
        if before is None or before.keys() != live.keys():
            self.directory.tell(names.API, HostsChanged())

    def deaths(self, _: Deaths) -> dict[str, int]:
        return self.board.report()

    def on_stop(self) -> None:
        for h in list(self.hosts.values()):
            self._drop_ref(h)

    handles = {
        Spawn: spawn,
        Retire: retire,
        WorkerHello: hello,
        StateChanged: state_changed,
        Supervise: supervise,
        Undeliverable: undeliverable,
        Deaths: deaths,
        Deliver: deliver,
    }


def _engaged(w: Worker) -> bool:
    """Its engine should be up (holding device memory): any rollout worker but a retained,
    released overlap one."""
    return w.activity is not Activity.INACTIVE


__all__ = [
    "HOST_METRICS",
    "Death",
    "Deaths",
    "Deliver",
    "HostsChanged",
    "Liveboard",
    "Retire",
    "RoleSupervisor",
    "Spawn",
    "Undeliverable",
]
