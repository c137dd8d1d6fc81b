"""The Pipeline Scheduler actor: a thin shell that runs :class:`pearl.rl.pipeline.Pipeline` in its
own asyncio thread and plugs it into the Router (generation), the Runtime Tracker (one
``rollout-step`` per batch) and the Orchestrator (``rollout-progress`` for the borrowing gate)."""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading

from actors import names
from actors.base import Directory, PearlActor
from actors.messages import GenerateDone, RolloutStep, Route, RouterRestarted, StateChanged
from pearl.core import commands as cmd
from pearl.core.errors import EngineError
from pearl.core.state import Role, Zone
from pearl.engines.base import GenerateRequest, GenerateResult, SamplingParams
from pearl.rl.pipeline import Pipeline, StepReport
from pearl.rl.trajectory import Batch

log = logging.getLogger(__name__)

PROGRESS_S = 0.5  # how often the gate hears how many trajectories are still missing
PROGRESS_POLL_S = 0.05  # ... and how soon it hears a change (a batch completing ends the window)


class PipelineActor(PearlActor):
    name = names.PIPELINE

    def __init__(self, directory: Directory, pipeline: Pipeline) -> None:
        super().__init__()
        self.directory, self.cfg = directory, pipeline.cfg
        self.pipeline = pipeline
        pipeline.attach(self._generate, self._on_batch)
        self._ids = itertools.count(1)
        self._futures: dict[str, asyncio.Future[GenerateResult]] = {}
        self._sent: dict[str, GenerateRequest] = {}  # the turns in flight, to route again
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._halt: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)

    def on_start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def main() -> None:
            self._halt = asyncio.Event()
            progress = asyncio.create_task(self._progress())
            try:
                await self.pipeline.run(self._halt)
            finally:
                progress.cancel()

        try:
            self._loop.run_until_complete(main())
        finally:
            self._loop.close()

    async def _generate(
        self, ids: tuple[int, ...], sampling: SamplingParams, trajectory_id: str
    ) -> GenerateResult:
        rid = f"{trajectory_id}#{next(self._ids)}"
        fut: asyncio.Future[GenerateResult] = self._loop.create_future()
        critical = self.pipeline.is_critical(trajectory_id)
        req = GenerateRequest(
            rid=rid, input_ids=ids, sampling=sampling, trajectory=trajectory_id, critical=critical
        )
        with self._lock:
            self._futures[rid] = fut
            self._sent[rid] = req
        self.directory.tell(names.ROUTER, Route(request=req, reply_to=self.name))
        return await fut

    def router_restarted(self, _: RouterRestarted) -> None:
        """The turns the old Router held died with it: each is routed again, whole."""
        with self._lock:
            again = list(self._sent.values())
        for req in again:
            self.directory.tell(names.ROUTER, Route(request=req, reply_to=self.name))

    def done(self, msg: GenerateDone) -> None:
        with self._lock:
            fut = self._futures.pop(msg.rid, None)
            self._sent.pop(msg.rid, None)
        if fut is None:
            return
        if msg.result is not None:
            self._loop.call_soon_threadsafe(_settle, fut, msg.result, None)
        else:
            self._loop.call_soon_threadsafe(_settle, fut, None, EngineError(msg.error))

    def state_changed(self, msg: StateChanged) -> None:
        self.pipeline.set_version(msg.view.weights_version)
        n = msg.view.serving
        lent = [w.role for w in msg.view.routable if w.zone is Zone.OVERLAP]
        c, p, d = (lent.count(r) for r in (Role.COLOCATED, Role.PREFILL, Role.DECODE))
        self.pipeline.set_workers(colocated=n.N_C, prefill=n.N_P, decode=n.N_D, lent=(c, p, d))

    async def _progress(self) -> None:
        # A stale count makes the gate approve a borrow for a batch that is already complete:
        # the plan is then cut short by the Training Begin that follows at once.
        # R also rises when ready groups are dropped as stale (more work to do, a borrow may pay)
        # and when a batch is handed out (the window is ending): the report says which.
        last, told, taken = -1, 0.0, self.pipeline.batches_handed_out
        while True:
            await asyncio.sleep(PROGRESS_POLL_S)
            handed = self.pipeline.batches_handed_out
            missing = max(0, self.cfg.batch - self.pipeline.ready_trajectories)
            now = self._loop.time()
            if missing != last or handed != taken or now - told >= PROGRESS_S:
                eta = self.pipeline.next_batch_eta_s()
                report = cmd.RolloutProgress(
                    remaining=missing, handed_out=handed != taken, eta_s=eta
                )
                self.directory.tell(names.ORCHESTRATOR, report)
                last, told, taken = missing, now, handed

    def _on_batch(self, batch: Batch, report: StepReport) -> None:
        self.directory.tell(
            names.TRACKER,
            RolloutStep(
                step=report.step,
                trajectories=report.trajectories,
                makespan_s=report.makespan_s,
                active_fraction=report.active_fraction,
                in_flight=report.in_flight,
                start_spread_s=report.start_spread_s,
            ),
        )

    def on_stop(self) -> None:
        if self._halt is not None:
            self._loop.call_soon_threadsafe(self._halt.set)
        self._thread.join(10.0)

    handles = {GenerateDone: done, StateChanged: state_changed, RouterRestarted: router_restarted}


def _settle(
    fut: asyncio.Future[GenerateResult],
    result: GenerateResult | None,
    error: BaseException | None,
) -> None:
    if fut.done():
        return
    if error is not None:
        fut.set_exception(error)
    elif result is not None:
        fut.set_result(result)


__all__ = ["PipelineActor"]
