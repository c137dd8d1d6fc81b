"""The WorkerActor: owns one engine in a worker host and executes the controller's commands.

Every command that belongs to a plan step is answered with a ``step-result`` to the orchestrator;
commands are idempotent, so recovery may resend them. Generation results (including aborted
requests with the tokens generated so far) go to the router as ``generate-done``. The host's
:class:`~pearl.metrics.HostMetrics` follow the engine: its role, its telemetry, its live gauges.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from actors import names
from actors.base import Directory, PearlActor
from actors.messages import (
    AbortRequest,
    EngineTelemetryReport,
    Generate,
    GenerateDone,
    LoadWeights,
    RestoreWorker,
)
from pearl.core import commands as cmd
from pearl.core.errors import PearlError, RequestRefused
from pearl.core.state import Role
from pearl.engines.base import Engine, GenerateResult, KVTimeout
from pearl.metrics import HostMetrics

log = logging.getLogger(__name__)

DRAIN_S = 5.0  # how long a role switch waits for in-flight requests before handing them over


@dataclass(frozen=True)
class ReportTelemetry:
    """Local: send the engine's telemetry to the tracker, then clear ``queued``."""

    queued: threading.Event | None = None


def sync_weights(
    engine: Engine,
    version: int,
    lookup: Callable[[int], tuple[int, Any] | None],
    name: str = "worker",
) -> None:
    """Move ``engine`` to ``version`` or whatever is newest in the store now: a worker joins at
    any phase of a step. Before the first publish (or while ``version`` is still being written)
    the store holds less: the newest stored version, or the initial weights (version 0).
    ``lookup(version)``: the newest stored (version, source) for one asking for ``version``; None
    while nothing is published. A snapshot pruned between the look-up and the load is looked up
    once more."""
    for attempt in (1, 2):
        if version <= engine.weights_version:
            return
        found = lookup(version)
        stored, source = found if found is not None else (0, None)
        if stored < version:
            has = max(stored, engine.weights_version)
            log.info("%s: weights version %d is not stored yet; at %d", name, version, has)
        if stored <= engine.weights_version:
            return
        try:
            engine.load_weights(stored, source)
            return
        except PearlError:
            if attempt == 2:  # not a snapshot pruned between the look-up and the load
                raise
            version = max(version, stored)


class WorkerActor(PearlActor):
    def __init__(
        self,
        directory: Directory,
        worker: int,
        incarnation: int,
        make_engine: Callable[[Role], Engine],
        weights_source: Callable[[int], tuple[int, Any] | None],  # the newest stored (version,
        # source) for one asking for this version; None: nothing published yet
        on_exit: Callable[[], None],
        metrics: HostMetrics | None = None,  # what the host's /metrics show (None: not served)
    ) -> None:
        super().__init__()
        self.name = names.worker_name(worker)  # type: ignore[misc]
        self.directory, self.worker, self.incarnation = directory, worker, incarnation
        self.make_engine, self.weights_source, self.on_exit = make_engine, weights_source, on_exit
        self.metrics = metrics or HostMetrics(worker, incarnation, "")
        self.engine: Engine | None = None
        self.released = False

    # -- plan steps ----------------------------------------------------------------------------

    def _step(self, c: cmd.PlanStep, body: Callable[[], None]) -> None:
        t0 = time.monotonic()
        try:
            body()
            ok, error = True, ""
        except PearlError as e:
            ok, error = False, str(e)
            log.warning("%s %s failed: %s", self.name, type(c).__name__, e)
        if getattr(c, "plan", 0):
            self.directory.tell(
                names.ORCHESTRATOR,
                cmd.StepResult(
                    plan=c.plan,
                    step=c.step,
                    ok=ok,
                    error=error,
                    cancel=getattr(c, "cancel", False),
                    duration_s=time.monotonic() - t0,
                ),
            )

    def bring_up(self, role: Role, version: int) -> None:
        """Start the engine (the first time) or resume a released one, in ``role``, on weights
        ``version`` or the newest stored (:func:`sync_weights`)."""
        if self.engine is None:
            self.engine = self.make_engine(role)
            if hasattr(self.engine, "on_gone"):  # a server engine whose watchdog may give up
                self.engine.on_gone = self._server_gone
            self.engine.start()
            self.released = False
        elif self.released:
            self._weights(version)  # first: resume on the newest, not on a pruned snapshot
            self.engine.resume_memory()
            self.released = False
        if self.engine.role is not role:
            self._handover()
            self.engine.set_role(role)
        self.metrics.watch(self.engine)
        self._weights(version)

    def _weights(self, version: int) -> None:
        assert self.engine is not None
        sync_weights(
            engine=self.engine, version=version, lookup=self.weights_source, name=self.name
        )

    def on_start_worker(self, c: cmd.StartWorker) -> None:
        if not c.background:
            self._step(c, lambda: self.bring_up(c.role, c.weights_version))
            return
        # Joining in the background: the plan is over; say when this worker can serve. One that
        # cannot come up ends its host, which its supervisor restarts within the budget.
        try:
            self.bring_up(c.role, c.weights_version)
        except PearlError as e:
            log.error("%s could not start: %s; the host exits", self.name, e)
            self.on_exit()
            return
        self.directory.tell(
            names.ORCHESTRATOR, cmd.WorkerUp(worker=self.worker, incarnation=self.incarnation)
        )

    def _server_gone(self, why: str) -> None:
        """The engine's server cannot be kept up (watchdog thread): the host ends, so that its
        supervisor restarts it with a back-off, says why in ``pearl status``, or gives up."""
        log.error("%s: %s; the host exits", self.name, why)
        self.on_exit()

    def on_restore(self, c: RestoreWorker) -> None:
        try:
            self.bring_up(c.role, c.weights_version)
            if not c.active:
                self.engine.release_memory()  # type: ignore[union-attr]
                self.released = True
            self.directory.tell(
                names.ORCHESTRATOR, cmd.WorkerUp(worker=self.worker, incarnation=self.incarnation)
            )
        except PearlError as e:  # as a start in the background: its supervisor restarts it
            log.error("%s could not be restored: %s; the host exits", self.name, e)
            self.on_exit()

    def on_activate(self, c: cmd.ActivateWorker) -> None:
        self._step(c, lambda: self.bring_up(c.role, c.weights_version))

    def on_deactivate(self, c: cmd.DeactivateWorker) -> None:
        def body() -> None:
            if self.engine is not None and not self.released:
                self.engine.release_memory()  # aborts in flight; prefixes go back to the router
                self.released = True

        self._step(c, body)

    def on_stop_worker(self, c: cmd.StopWorker) -> None:
        def body() -> None:
            if self.engine is not None:
                self.engine.stop()  # aborts in flight, keeping the generated prefixes
                self.engine = None
                self.metrics.watch(None)

        self._step(c, body)
        self.on_exit()

    def on_set_role(self, c: cmd.SetRole) -> None:
        def body() -> None:
            if self.engine is None:
                raise PearlError(f"{self.name} has no engine to switch")
            if self.engine.role is not c.role:
                self._handover()
                self.engine.set_role(c.role)
                self.metrics.watch(self.engine)

        self._step(c, body)

    def _handover(self) -> None:
        """Drain briefly, then abort what is left: the router resubmits the prefixes elsewhere."""
        assert self.engine is not None
        if not self.engine.drain(DRAIN_S):
            self.engine.abort_all()
            deadline = time.monotonic() + DRAIN_S
            while self.engine.in_flight() and time.monotonic() < deadline:
                time.sleep(0.01)

    # -- serving -------------------------------------------------------------------------------

    def on_generate(self, msg: Generate) -> None:
        rid = msg.request.rid
        # pearld's Router, or a gateway process's (its own rpc server): whoever routed it
        to = names.at(names.ROUTER, msg.reply_to) if msg.reply_to else names.ROUTER
        if self.engine is None or self.released:
            self._done(to, rid, None, f"{self.name} is not serving", retryable=True)
            return
        try:
            fut = self.engine.generate(msg.request)
        except RequestRefused as e:  # the request's own fault: final
            self._done(to, rid, None, str(e), refused=True)
            return
        except PearlError as e:
            self._done(to, rid, None, str(e), retryable=True)
            return
        fut.add_done_callback(lambda f: self._finished(to, rid, f))

    def _finished(self, to: str, rid: str, fut: Future[GenerateResult]) -> None:
        try:
            self._done(to, rid, fut.result(), "")
        except KVTimeout as e:
            self._done(to, rid, None, str(e), retryable=True)
        except RequestRefused as e:  # the server refused it (4xx): final, never retried
            self._done(to, rid, None, str(e), refused=True)
        except Exception as e:  # the router decides; the engine keeps serving
            self._done(to, rid, None, str(e), retryable=False)

    def _done(
        self,
        to: str,
        rid: str,
        result: GenerateResult | None,
        error: str,
        *,
        retryable: bool = False,
        refused: bool = False,
    ) -> None:
        self.directory.tell(
            to,
            GenerateDone(
                worker=self.worker,
                rid=rid,
                result=result,
                error=error,
                retryable=retryable,
                refused=refused,
            ),
        )

    def on_abort(self, msg: AbortRequest) -> None:
        if self.engine is not None:
            self.engine.abort(msg.rid)

    def on_load_weights(self, msg: LoadWeights | cmd.SyncWeights) -> None:
        # Released: activation loads whatever is newest then. Handing the engine this version's
        # path to apply at resume would fail once the store has pruned it (keep=3).
        if self.engine is not None and not self.released:
            try:
                self._weights(msg.version)
            except PearlError as e:
                log.warning("%s: %s", self.name, e)

    def report_telemetry(self, msg: ReportTelemetry | None = None) -> None:
        if msg is not None and msg.queued is not None:
            msg.queued.clear()
        if self.engine is not None:
            t = self.engine.telemetry()
            self.metrics.observe(t)
            if t.iterations or t.transfers:
                self.directory.tell(
                    names.TRACKER, EngineTelemetryReport(worker=self.worker, telemetry=t)
                )

    def on_stop(self) -> None:
        if self.engine is not None:
            self.engine.stop()
            self.engine = None
            self.metrics.watch(None)

    handles = {
        cmd.StartWorker: on_start_worker,
        RestoreWorker: on_restore,
        cmd.ActivateWorker: on_activate,
        cmd.DeactivateWorker: on_deactivate,
        cmd.StopWorker: on_stop_worker,
        cmd.SetRole: on_set_role,
        Generate: on_generate,
        AbortRequest: on_abort,
        LoadWeights: on_load_weights,
        cmd.SyncWeights: on_load_weights,
        ReportTelemetry: report_telemetry,
    }


__all__ = ["ReportTelemetry", "WorkerActor", "sync_weights"]
