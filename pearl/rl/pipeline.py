"""The Pipeline Scheduler (§4.1.1, §4.1.2): trajectories in flight, GRPO groups, rollout batches.

Groups of ``group_size`` trajectories share one task and run concurrently (each through
:func:`pearl.rl.rollout.run_trajectory`, so a generation aborted by a worker removal resumes from
its prefix elsewhere). A finished group waits in a pool; :meth:`Pipeline.take` hands out batches
of B trajectories whose oldest weights are within the staleness bound of the current version,
dropping (and so re-generating) groups that fell behind. Asynchronous RL keeps generating while
the trainer trains: up to ``(1 + staleness)`` batches are in flight or ready, less one while a
batch handed out has not yet come back as published weights (:meth:`Pipeline.admission_target`:
a group started then runs on weights that will be too old by the time its batch is taken).

The pipeline measures what the Runtime Tracker fits (:class:`pearl.rl.meter.Meter`): per
trajectory its turns, tokens, environment time and the prompt tokens really prefilled; per batch
its makespan, B_flight (up to (1 + staleness) batches share the workers) and the active workers by
role; and the fraction f of running trajectories waiting on generation (theta = (1 - f) / f).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pearl.engines.base import GenerateResult, SamplingParams
from pearl.rl.env import Task, make_env, make_tasks
from pearl.rl.meter import Meter, StepReport
from pearl.rl.progress import Workers, next_batch_eta
from pearl.rl.prompt import PromptBuilder
from pearl.rl.rollout import GenerateFn, run_trajectory
from pearl.rl.trajectory import Batch, Trajectory

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PipelineConfig:
    env: str = "tool_use"
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    tasks: int = 256
    seed: int = 0
    batch: int = 8  # B: trajectories per rollout batch
    group_size: int = 4  # GRPO group: trajectories per task
    staleness: int = 1  # training steps a trajectory's weights may lag behind
    max_new_tokens: int = 48  # per turn
    temperature: float = 1.0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if self.batch < 1 or self.group_size < 1 or self.batch % self.group_size:
            raise ValueError(
                f"batch ({self.batch}) must be a positive multiple of group_size "
                f"({self.group_size})"
            )
        if self.staleness < 0:
            raise ValueError("staleness must be >= 0")

    @property
    def groups_per_batch(self) -> int:
        return self.batch // self.group_size


@dataclass(frozen=True)
class PipelineStats:
    """What the pipeline counted so far, copied at one instant."""

    groups: dict[str, int]  # GRPO groups started, delivered, dropped as stale, lost to a failure
    failed_trajectories: int  # failed outright (not counting aborted-and-resumed)
    # Migrated generations: (when aborted, monotonic s; prompt tokens the resumption prefilled
    # again), recorded when the resumption completes.
    migrations: tuple[tuple[float, int], ...]
    last_batch: StepReport | None  # the report of the last batch handed out


@dataclass
class _Group:
    id: str
    trajectories: list[Trajectory]
    started: float
    finished: float


class Pipeline:
    """Runs in one asyncio loop; :meth:`take` and :meth:`set_version` are thread-safe."""

    def __init__(
        self,
        cfg: PipelineConfig,
        builder: PromptBuilder,
        generate: GenerateFn | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_batch: Callable[[Batch, StepReport], None] | None = None,
    ) -> None:
        self.cfg, self.builder, self.clock = cfg, builder, clock
        self.on_batch = on_batch
        self._generate: GenerateFn | None = generate
        self._tasks = iter(make_tasks(cfg.env, n=cfg.tasks, seed=cfg.seed).stream(cfg.seed))
        self._ids = itertools.count(1)
        self._cv = threading.Condition()
        self._ready: deque[_Group] = deque()
        self._version = 0
        self._step = 0
        self._training = False  # a batch was handed out and its weights are not yet published
        self._dropped = 0
        self._meter = Meter(clock)
        self._running_groups: dict[str, float] = {}  # group id -> when it started
        # Seconds from start to finish of the latest groups (the next batch's ETA uses them).
        self._group_s: deque[float] = deque(maxlen=4 * cfg.groups_per_batch)
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.failed = 0  # trajectories that failed outright (not counting aborted-and-resumed)
        # Every group is accounted for: started = delivered + stale + failed + ready + running.
        self.counts = {"started": 0, "delivered": 0, "stale": 0, "failed": 0}
        self.reports: deque[StepReport] = deque(maxlen=10_000)  # one per batch handed out

    # -- thread-safe side ------------------------------------------------------------------

    def set_version(self, version: int) -> None:
        """The trainer published ``version``: older groups may now be too stale."""
        with self._cv:
            if version > self._version:
                self._training = False
            self._version = max(self._version, version)
        self._poke()  # the admission target may have risen

    def set_workers(
        self, colocated: int, prefill: int, decode: int, lent: Workers = (0, 0, 0)
    ) -> None:
        """The active rollout workers by role, as the Orchestrator last published them, and of
        them the lent ones (on the trainer's GPUs) by role."""
        self._meter.workers, self._meter.lent = (colocated, prefill, decode), lent

    @property
    def generating(self) -> int:
        """Trajectories waiting on a generation now (requests in flight on the workers)."""
        return self._meter.generating

    @property
    def migrations(self) -> Sequence[tuple[float, int]]:
        """Generations migrated (aborted by a role change or a removal, resumed from their prefix
        elsewhere): (when aborted, prompt tokens the resumption prefilled again)."""
        return self._meter.migrations

    @property
    def batches_handed_out(self) -> int:
        """Batches handed out so far (by :meth:`take`)."""
        return self._step

    @property
    def ready_trajectories(self) -> int:
        with self._cv:
            return sum(len(g.trajectories) for g in self._ready)

    def next_batch_eta_s(self) -> float | None:
        """Seconds until the next batch is expected complete (:func:`~pearl.rl.progress.
        next_batch_eta` on the running groups and the latest latencies): 0 when enough groups
        are ready; None when it cannot be foreseen. The borrowing gate uses it to see a
        training-idle window that is about to close: a borrow begun then would be cut short
        before it serves."""
        with self._cv:
            missing = self.cfg.groups_per_batch - len(self._ready)
            now = self.clock()
            ran = [now - t for t in self._running_groups.values()]
            return next_batch_eta(missing, ran, self._group_s)

    def is_critical(self, trajectory_id: str) -> bool:
        """Whether the trajectory is on the rollout's critical path: its group is one of the
        running groups the next batch still needs (the oldest started ones, as many as the batch
        misses). The trainer waits for exactly those; the groups started after them have the
        next training step to finish in."""
        gid = trajectory_id.rpartition(".")[0]
        with self._cv:
            missing = self.cfg.groups_per_batch - len(self._ready)
            return gid in itertools.islice(self._running_groups, max(0, missing))

    def stats(self) -> PipelineStats:
        """A consistent copy of the counters (taken under the pipeline's lock)."""
        with self._cv:
            return PipelineStats(
                groups=dict(self.counts),
                failed_trajectories=self.failed,
                migrations=tuple(self._meter.migrations),
                last_batch=self.reports[-1] if self.reports else None,
            )

    def take(self, timeout_s: float) -> Batch | None:
        """The next batch of B fresh trajectories, or None after ``timeout_s``."""
        deadline = self.clock() + timeout_s
        with self._cv:
            while True:
                self._drop_stale()
                if len(self._ready) >= self.cfg.groups_per_batch:
                    groups = [self._ready.popleft() for _ in range(self.cfg.groups_per_batch)]
                    self.counts["delivered"] += len(groups)
                    self._step += 1
                    self._training = True
                    batch = Batch(
                        step=self._step,
                        trajectories=tuple(t for g in groups for t in g.trajectories),
                    )
                    spans = [(g.started, g.finished) for g in groups]
                    dropped, self._dropped = self._dropped, 0
                    report = self._meter.report(batch, spans, dropped)
                    self._meter.handed_at = self.clock()
                    break
                left = deadline - self.clock()
                if left <= 0:
                    return None
                self._cv.wait(min(left, 0.1))
        self._poke()
        self.reports.append(report)
        if self.on_batch is not None:
            self.on_batch(batch, report)
        return batch

    def admission_target(self) -> int:
        """Groups to keep in flight or ready: (1 + staleness) batches, one fewer while a batch is
        being trained on (at least one batch).

        The groups pending are taken in order, a batch at a time, and the trainer publishes one
        version per batch. A group started now on version v is taken after the pending ones, in
        batch P // G + 1 from now (P groups pending, G a batch); by then the trainer will have
        published that many versions, plus the one it is training towards. So the group is
        within the bound only if P < G (1 + staleness - training); a group started beyond that
        is dropped when its batch is taken (measured in the demo before this rule: 28 of 100
        groups started, the ones started while the trainer trained).
        """
        s = self.cfg.staleness - (1 if self._training else 0)
        return self.cfg.groups_per_batch * max(1, 1 + s)

    def _drop_stale(self) -> None:
        # Groups finish out of version order (a long trajectory started on old weights can land
        # after a fresh one), so every ready group is checked, not just the oldest.
        floor = self._version - self.cfg.staleness
        fresh: deque[_Group] = deque()
        for g in self._ready:
            if min(t.min_version for t in g.trajectories) < floor:
                self._meter.forget([t.id for t in g.trajectories])
                self._dropped += 1
                self.counts["stale"] += 1
                log.info("dropped group %s: weights older than v%d", g.id, floor)
            else:
                fresh.append(g)
        self._ready = fresh

    def _poke(self) -> None:
        if self._loop is not None and self._wake is not None:
            self._loop.call_soon_threadsafe(self._wake.set)

    # -- the asyncio side --------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Keep :meth:`admission_target` groups in flight or ready until ``stop``."""
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        tasks: set[asyncio.Task[None]] = set()
        sampler = asyncio.create_task(self._sample(stop))
        try:
            while not stop.is_set():
                with self._cv:
                    ready = len(self._ready)
                    target = self.admission_target()
                while len(tasks) + ready < target:
                    t = asyncio.create_task(self._group(next(self._tasks)))
                    tasks.add(t)
                    t.add_done_callback(tasks.discard)
                self._wake.clear()
                stopping = asyncio.create_task(stop.wait())
                waking = asyncio.create_task(self._wake.wait())
                await asyncio.wait({stopping, waking, *tasks}, return_when=asyncio.FIRST_COMPLETED)
                stopping.cancel()
                waking.cancel()
        finally:
            sampler.cancel()
            for t in tasks:
                t.cancel()
            for t in (*tasks, sampler):
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t

    async def _group(self, task: Task) -> None:
        gid = f"g{next(self._ids)}"
        self.group_started(gid)
        try:
            results = await asyncio.gather(
                *(self._trajectory(task, gid, k) for k in range(self.cfg.group_size)),
                return_exceptions=True,
            )
        except BaseException:
            with self._cv:
                self._running_groups.pop(gid, None)  # cancelled: the pipeline is stopping
            raise
        trajectories = [r for r in results if isinstance(r, Trajectory)]
        failed = [r for r in results if isinstance(r, BaseException)]
        self.group_finished(gid, trajectories, failed)

    def group_started(self, gid: str) -> None:
        """Group ``gid`` starts now (its trajectories run next): it is running, and on the critical
        path while the next batch needs it (:meth:`is_critical`)."""
        with self._cv:
            self.counts["started"] += 1
            self._running_groups[gid] = self.clock()

    def group_finished(
        self, gid: str, trajectories: Sequence[Trajectory], failed: Sequence[BaseException] = ()
    ) -> None:
        """Group ``gid`` (started by :meth:`group_started`) ended now. Whole, it waits in the pool
        until :meth:`take` hands it out; GRPO needs the whole group, so a failed member drops it
        (it is re-generated)."""
        with self._cv:
            started = self._running_groups.pop(gid)
            if failed:
                self._meter.forget([f"{gid}.{k}" for k in range(self.cfg.group_size)])
                self.failed += len(failed)
                self.counts["failed"] += 1
            else:
                finished = self.clock()
                self._ready.append(
                    _Group(
                        id=gid, trajectories=list(trajectories), started=started, finished=finished
                    )
                )
                self._group_s.append(finished - started)
                self._cv.notify_all()
        if failed:
            log.warning("group %s dropped: %s", gid, failed[0])

    async def _trajectory(self, task: Task, gid: str, k: int) -> Trajectory:
        env = make_env(self.cfg.env, **self.cfg.env_kwargs)
        seed = None if self.cfg.temperature == 0 else self.cfg.seed
        sampling = SamplingParams(
            max_new_tokens=self.cfg.max_new_tokens,
            temperature=self.cfg.temperature,
            top_p=self.cfg.top_p,
            seed=seed,
        )
        self._meter.running += 1
        started = self.clock()
        try:
            traj = await run_trajectory(
                env=env,
                task=task,
                generate=self.generate,
                builder=self.builder,
                trajectory_id=f"{gid}.{k}",
                group_id=gid,
                sampling=sampling,
                clock=self.clock,
            )
            with self._cv:
                self._meter.finished(traj.id, self.clock() - started)
            return traj
        finally:
            self._meter.running -= 1

    def attach(
        self, generate: GenerateFn, on_batch: Callable[[Batch, StepReport], None] | None = None
    ) -> None:
        """Connect generation (and the per-batch report) once their owner exists."""
        self._generate, self.on_batch = generate, on_batch or self.on_batch

    @property
    def generate_fn(self) -> GenerateFn | None:
        """The generate function attached (:meth:`attach`; in pearld, the Router's), if any."""
        return self._generate

    async def generate(
        self, ids: tuple[int, ...], sampling: SamplingParams, trajectory_id: str
    ) -> GenerateResult:
        """One turn of ``trajectory_id`` through the attached generate function, measured: the
        prompt tokens really prefilled, the decode batch it ran in, and a resumption after an
        abort (a migration). Every trajectory the pipeline runs generates through it."""
        assert self._generate is not None, "attach() a generate function before run()"
        self._meter.generating += 1
        try:
            result = await self._generate(ids, sampling, trajectory_id)
        finally:
            self._meter.generating -= 1
        with self._cv:
            self._meter.turn(trajectory_id, result)
        return result

    async def _sample(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await asyncio.sleep(0.1)
            self.sample()

    def sample(self) -> None:
        """Look now (:meth:`run` does, ten times a second): the trajectories in flight with the
        workers serving them (B_flight, N; :meth:`set_workers`), and the fraction of running
        trajectories waiting on generation (f)."""
        with self._cv:
            self._meter.look()


__all__ = ["Pipeline", "PipelineConfig", "PipelineStats", "StepReport"]
