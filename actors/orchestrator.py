"""The Orchestrator: sole owner of the table and the event log. It logs, then applies, then sends.

Every input goes through the pure :class:`~pearl.core.controller.Controller`; the records it
returns are appended (durable, group commit) before the new state replaces the old one and before
any command leaves. The reply to an elastic event is the sequence number of its record.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from actors import names
from actors.base import Directory, PearlActor
from actors.messages import StateChanged
from pearl.core import commands as cmd
from pearl.core import events as ev
from pearl.core.controller import Controller, ControllerState, Input, Output
from pearl.core.errors import InvalidEvent, InvariantViolation, LogError, LogWriteFailed
from pearl.core.status import ClusterStatus
from pearl.core.view import ClusterView, cluster_status, cluster_view
from pearl.log import EventLog
from transports.protocol import Ack, StatusRequest

if TYPE_CHECKING:
    from pearl.plans import CommitObserver

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Boot:
    """Sent once the orchestrator is registered: commit the recovery output."""


ROUTES: dict[type, str] = {
    cmd.StartWorker: names.REBUILDER,
    cmd.StopWorker: names.REBUILDER,
    cmd.SetRole: names.REBUILDER,
    cmd.ActivateWorker: names.TOGGLE,
    cmd.DeactivateWorker: names.TOGGLE,
    cmd.LendTraining: names.TOGGLE,
    cmd.ReclaimTraining: names.TOGGLE,
    cmd.TrainingMayProceed: names.SCHEDULER,
}
# What pearld's own actors report (told, never asked): handled in order, kept while the disk
# refuses writes.
Report = (
    ev.Telemetry
    | cmd.StepResult
    | cmd.WorkerDown
    | cmd.WorkerUp
    | cmd.WorkerLost
    | cmd.RolloutProgress
)
MAX_BACKLOG = 100_000  # reports kept while the disk refuses writes

# Who hears about every logged change (status view, routable set, expected worker hosts).
LISTENERS = (
    names.ROUTER,
    names.SUPERVISOR,
    names.API,
    names.DECISION,
    names.SCHEDULER,
    names.PIPELINE,
    names.TRACKER,
    names.NODES,  # the RayNodeWatcher, with [ray] node_events
    names.GATEWAY,  # the HTTP gateway's backend, with [gateway] listen
    names.ROUTES,  # the routes feed of gateway processes, with [gateway] processes
)


class Orchestrator(PearlActor):
    """Client events (asked through the ElasticScheduler) are answered with their record's
    sequence number, or with the error that kept them out of the log. Reports from inside
    pearld (told: step results, worker ups and downs, telemetry) are facts with no one to
    answer: one the disk refused waits in a backlog, in order, and is handled again before
    anything else once the log takes writes; until then client events are refused."""

    name = names.ORCHESTRATOR

    def __init__(
        self,
        directory: Directory,
        event_log: EventLog,
        controller: Controller,
        recovered: Output,
        snapshot_every: int = 1000,
        boot_id: str = "",
        metrics: CommitObserver | None = None,
    ) -> None:
        super().__init__()
        self.metrics = metrics  # told of every commit (Metrics, PlanHistory, Observers), or None
        self.directory, self.log, self.controller = directory, event_log, controller
        self.state: ControllerState = recovered.state
        self._pending: Output | None = recovered
        self.snapshot_every = snapshot_every
        self.boot_id = boot_id
        self._since_snapshot = 0
        self.proceeded = 0  # last training step told it may proceed
        self.recoveries = 0  # controller invariant violations recovered from the log in place
        self.backlog: deque[Report] = deque()  # reports the disk refused, oldest first
        self._disk_error = ""  # why the log refused its last write ("": it takes writes)

    def boot(self, msg: Boot | None = None) -> None:
        """Log and send what recovery decided. Not in on_start: peers must be able to answer,
        and they find the orchestrator by name only once it is registered. A full disk keeps
        it pending: the next event or tick tries again, and client events wait behind it."""
        if self._pending is None:
            return
        try:
            committed = self._commit(self._pending)
        except LogError as e:
            self._refused(e)
            if msg is None:
                raise  # called for an event: its sender hears why
            return
        self._pending = None
        if not committed:
            self._broadcast()  # listeners need the recovered view even when nothing was logged

    def on_event(self, event: ev.Elastic | ev.WeightsPublished) -> Ack:
        if not self._drain():
            waiting = len(self.backlog) + (self._pending is not None)
            raise LogWriteFailed(
                f"not logged: {waiting} earlier record(s) from inside pearld wait for the disk "
                f"first ({self._disk_error}); retry once it takes writes"
            )
        try:
            first = self._handle(event)
        except LogError as e:
            self._refused(e)
            raise
        return Ack(seq=first if first else self.log.last_seq)

    def on_report(self, report: Report) -> None:
        """A report from inside pearld: handled now, or kept (in order) until the disk takes it."""
        self.backlog.append(report)
        if len(self.backlog) > MAX_BACKLOG:
            lost = self.backlog.popleft()
            log.error("report backlog full (%d): dropped %r", MAX_BACKLOG, lost)
        self._drain()

    def on_tick(self, tick: cmd.Tick) -> None:
        """The clock: timeouts and deadlines. A tick the disk refuses is not kept (the next
        one comes within a tick interval); first it retries what waits."""
        if self._drain():
            try:
                self._handle(tick)
            except LogError as e:
                self._refused(e)

    def _drain(self) -> bool:
        """Log what recovery decided, then the waiting reports, in order; False while the disk
        refuses them."""
        if self._disk_error:
            try:
                self.log.reopen()  # a log whose disk state was unknown: cut, then try again
            except LogError as e:
                log.debug("reopen: %s", e)
        try:
            self.boot()
        except LogError:
            return False
        while self.backlog:
            report = self.backlog[0]
            try:
                self._handle(report)
            except LogError as e:
                self._refused(e)
                return False
            except InvalidEvent as e:  # overtaken while it waited (e.g. its worker is gone)
                log.warning("dropped a stale %s: %s", type(report).__name__, e)
            self.backlog.popleft()
        if self._disk_error:
            log.warning("the event log takes writes again at seq %d", self.log.last_seq)
            self._disk_error = ""
        return True

    def _refused(self, e: LogError) -> None:
        """The disk refused a write; nothing of it was applied. The next try reopens the log
        first (a no-op when the cut back succeeded)."""
        if not self._disk_error:
            log.error("the event log refused a write: %s", e)
        self._disk_error = str(e)

    def _handle(self, event: Input) -> int:
        """One event through the controller, then committed; the first record's seq (0: none)."""
        received = time.monotonic()
        try:
            out = self.controller.handle(
                s=self.state, event=event, now=time.monotonic(), wall=time.time()
            )
        except InvalidEvent:
            raise  # bad input from a client: its caller gets the error, nothing changed
        except InvariantViolation as e:
            # A bug in the controller, not in the log: nothing of this event was logged, so the
            # logged table is intact. Keep serving: rebuild the controller's view from it, as a
            # restart would, instead of letting the actor (and, repeated, pearld) go down.
            log.error(
                "controller rejected its own output for %r: %s; recovering from the log at seq %d",
                event,
                e,
                self.state.table.seq,
                extra={"event": type(event).__name__, "invariant": str(e)},
            )
            self.recoveries += 1
            before = self.state
            out = self.controller.recover(
                table=before.table, profile=before.profile, now=time.monotonic(), wall=time.time()
            )
            out.state = dataclasses.replace(
                out.state, quarantine=before.quarantine, strikes=before.strikes
            )
        return self._commit(out, received)

    def _commit(self, out: Output, received: float | None = None) -> int:
        """Log, then apply, then send. Returns the first record's sequence number (0: none)."""
        t0 = time.perf_counter()
        seqs = self.log.append(out.records) if out.records else []
        append_s = time.perf_counter() - t0
        gate_before, self.state = self.state.last_gate, out.state
        g = self.state.last_gate
        if g is not None and g != gate_before:
            log.info(
                "borrowing gate: %s (%s)",
                g.verdict,
                g.reason,
                extra={"gate": g.verdict.value},
            )
        if self.state.table.seq != self.log.last_seq:  # the fold and the log must agree
            raise RuntimeError(f"table at seq {self.state.table.seq}, log at {self.log.last_seq}")
        for c in out.commands:
            if isinstance(c, cmd.TrainingMayProceed):
                self.proceeded = max(self.proceeded, c.step)
            target = (
                names.worker_name(c.worker)
                if isinstance(c, cmd.SyncWeights)
                else ROUTES.get(type(c))
            )
            if target is not None:
                self.directory.tell(target, c)
        if out.records:
            view = self._broadcast()
            if self.metrics is not None:
                self.metrics.committed(out.records, view, received, append_s)
            self._since_snapshot += len(out.records)
            if self._since_snapshot >= self.snapshot_every:
                try:
                    self.log.write_snapshot(self.state.table)
                    self._since_snapshot = 0
                except (OSError, LogError) as e:  # the records are durable: only replay is longer
                    log.warning("snapshot at seq %d failed: %s", self.state.table.seq, e)
        return seqs[0] if seqs else 0

    def _broadcast(self) -> ClusterView:
        changed = StateChanged(view=self.view())
        for name in LISTENERS:
            self.directory.tell(name, changed)
        return changed.view

    def view(self) -> ClusterView:
        """The typed view of the current state (what every listener gets)."""
        return cluster_view(
            s=self.state, proceeded=self.proceeded, boot_id=self.boot_id, recoveries=self.recoveries
        )

    def status(self, _: StatusRequest | None = None) -> ClusterStatus:
        """A client's ``status`` (an in-process runtime's): the edge, so rendered here."""
        return cluster_status(self.view())

    def on_stop(self) -> None:
        try:
            if self.log.last_seq:
                self.log.write_snapshot(self.state.table)
        except Exception as e:  # never block shutdown on a snapshot
            log.warning("final snapshot failed: %s", e)

    handles = {
        **dict.fromkeys(ev.ELASTIC_EVENTS, on_event),
        ev.WeightsPublished: on_event,
        ev.Telemetry: on_report,
        cmd.StepResult: on_report,
        cmd.WorkerDown: on_report,
        cmd.WorkerUp: on_report,
        cmd.WorkerLost: on_report,
        cmd.RolloutProgress: on_report,
        cmd.Tick: on_tick,
        StatusRequest: status,
        Boot: boot,
    }


__all__ = ["Boot", "Orchestrator"]
