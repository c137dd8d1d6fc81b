"""The Orchestrator: sole owner of the table and the event log. It logs, then applies, then sends.

Every input goes through the pure :class:`~pearl.core.controller.Controller`; the records it
returns are appended (durable, group commit) before the new state replaces the old one and before
any command leaves. The reply to an elastic event is the sequence number of its record.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Any

from actors.base import Directory, PearlActor
from actors.messages import StateChanged
from pearl.core import commands as cmd
from pearl.core import events as ev
from pearl.core.controller import Controller, ControllerState, Output
from pearl.core.errors import InvalidEvent, InvariantViolation
from pearl.core.view import ClusterView, cluster_view, status_json
from pearl.log import EventLog
from transports.protocol import Ack, StatusRequest

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Boot:
    """Sent once the orchestrator is registered: commit the recovery output."""


ROUTES: dict[type, str] = {
    cmd.StartWorker: "rebuilder",
    cmd.StopWorker: "rebuilder",
    cmd.SetRole: "rebuilder",
    cmd.ActivateWorker: "toggle",
    cmd.DeactivateWorker: "toggle",
    cmd.LendTraining: "toggle",
    cmd.ReclaimTraining: "toggle",
    cmd.TrainingMayProceed: "scheduler",
}
# Who hears about every logged change (status view, routable set, expected worker hosts).
LISTENERS = (
    "router",
    "supervisor",
    "api",
    "decision",
    "scheduler",
    "pipeline",
    "tracker",
    "nodes",  # the RayNodeWatcher, with [ray] node_events
)


class Orchestrator(PearlActor):
    name = "orchestrator"
    handles = {
        ev.GpusAdded: "on_event",
        ev.GpusReclaimed: "on_event",
        ev.GpusReclaiming: "on_event",
        ev.GpusReclaimCancelled: "on_event",
        ev.TrainingBegin: "on_event",
        ev.TrainingFinished: "on_event",
        ev.WeightsPublished: "on_event",
        ev.Telemetry: "on_event",
        cmd.StepResult: "on_event",
        cmd.WorkerDown: "on_event",
        cmd.WorkerUp: "on_event",
        cmd.WorkerLost: "on_event",
        cmd.RolloutProgress: "on_event",
        cmd.Tick: "on_event",
        StatusRequest: "status",
        Boot: "boot",
    }

    def __init__(
        self,
        directory: Directory,
        event_log: EventLog,
        controller: Controller,
        recovered: Output,
        snapshot_every: int = 1000,
        boot_id: str = "",
        metrics: Any = None,
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

    def boot(self, _: Any = None) -> None:
        """Log and send what recovery decided. Not in on_start: peers must be able to answer,
        and they find the orchestrator by name only once it is registered."""
        if self._pending is None:
            return
        out, self._pending = self._pending, None
        if not self._commit(out):
            self._broadcast()  # listeners need the recovered view even when nothing was logged

    def on_event(self, event: Any) -> Ack:
        self.boot()
        received = time.monotonic()
        try:
            out = self.controller.handle(self.state, event, time.monotonic(), time.time())
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
                before.table, before.profile, time.monotonic(), time.time()
            )
            out.state = dataclasses.replace(
                out.state, quarantine=before.quarantine, strikes=before.strikes
            )
        first = self._commit(out, received)
        return Ack(first if first else self.log.last_seq)

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
                "approved" if g.enabled else "declined",
                g.reason,
                extra={"gate": "approved" if g.enabled else "declined"},
            )
        if self.state.table.seq != self.log.last_seq:  # the fold and the log must agree
            raise RuntimeError(f"table at seq {self.state.table.seq}, log at {self.log.last_seq}")
        for c in out.commands:
            if isinstance(c, cmd.TrainingMayProceed):
                self.proceeded = max(self.proceeded, c.step)
            target = f"worker/{c.worker}" if isinstance(c, cmd.SyncWeights) else ROUTES.get(type(c))
            if target is not None:
                self.directory.tell(target, c)
        if out.records:
            view = self._broadcast()
            if self.metrics is not None:
                self.metrics.committed(out.records, view, received, append_s)
            self._since_snapshot += len(out.records)
            if self._since_snapshot >= self.snapshot_every:
                self.log.write_snapshot(self.state.table)
                self._since_snapshot = 0
        return seqs[0] if seqs else 0

    def _broadcast(self) -> ClusterView:
        changed = StateChanged(self.view())
        for name in LISTENERS:
            self.directory.tell(name, changed)
        return changed.view

    def view(self) -> ClusterView:
        """The typed view of the current state (what every listener gets)."""
        return cluster_view(self.state, self.proceeded, self.boot_id, self.recoveries)

    def status(self, _: Any = None) -> dict[str, Any]:
        """A client's ``status`` (an in-process runtime's): the edge, so rendered here."""
        return status_json(self.view())

    def on_stop(self) -> None:
        try:
            if self.log.last_seq:
                self.log.write_snapshot(self.state.table)
        except Exception as e:  # never block shutdown on a snapshot
            log.warning("final snapshot failed: %s", e)


__all__ = ["Boot", "Orchestrator"]
