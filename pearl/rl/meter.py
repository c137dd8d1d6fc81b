"""What the Pipeline Scheduler measures for the Runtime Tracker (§4.1.2), batch by batch.

Per trajectory: its turns, new prompt tokens, generated tokens, environment time, the prompt
tokens the engines really prefilled (a turn's prompt minus what its worker reused from the
trajectory's resident prefix), the decode batch it ran in, and its latency. Per batch: its
makespan, the mean number of trajectories in flight while it ran (B_flight) and the mean number of
active workers by role; and the fraction of running trajectories waiting on generation rather
than on their environment (f, so theta = (1 - f) / f). Generations aborted and resumed from their
prefix elsewhere are migrations.

:class:`Meter` keeps these records and is not thread-safe: :class:`pearl.rl.pipeline.Pipeline`
calls it under its own lock (except the in-flight counters, which only its asyncio loop moves).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from pearl.core.profile import TrajectoryStats
from pearl.engines.base import FinishReason, GenerateResult
from pearl.rl.progress import Sample, Workers, batch_occupancy
from pearl.rl.trajectory import Batch


@dataclass(frozen=True)
class StepReport:
    """One batch as the Runtime Tracker needs it.

    ``in_flight`` and ``workers`` are means over the batch's span (first group started -> last
    group finished): trajectories in flight, and active rollout workers by role (colocated,
    prefill, decode) as the Orchestrator last published them that could serve the batch: a lent
    worker counts only once the batch before was handed out (the Router gives lent workers the
    critical path alone). ``start_spread_s``: how long after
    the batch's first group its last one started (groups start as capacity frees).
    """

    step: int
    trajectories: tuple[TrajectoryStats, ...]
    makespan_s: float
    active_fraction: tuple[float, ...]
    dropped_groups: int
    in_flight: float = 0.0
    workers: dict[str, float] = field(default_factory=dict)
    start_spread_s: float = 0.0


@dataclass
class Measured:
    """What one trajectory cost so far, as the engines and the pipeline's clock said (None: not
    measured): the prompt tokens really prefilled, its decode iterations and their batch sizes
    summed, and its seconds from start to end."""

    prefilled: int | None = None
    decode_steps: int = 0
    decode_batch_sum: int = 0
    latency_s: float | None = None

    @property
    def seen_batch(self) -> float | None:
        """The mean batch of its decode iterations."""
        return self.decode_batch_sum / self.decode_steps if self.decode_steps > 0 else None


class Meter:
    """The pipeline's measurements, from trajectory turns to a :class:`StepReport` per batch."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.running = 0  # trajectories in flight
        self.generating = 0  # of which waiting on a generation
        self.workers: Workers = (0, 0, 0)
        self.lent: Workers = (0, 0, 0)
        self.handed_at = -math.inf  # when the last batch was handed out
        self.active: list[float] = []  # f, one per look, since the last batch
        # Ten a second, for B_flight and the workers a batch ran with.
        self.flight: deque[Sample] = deque(maxlen=36_000)
        self.measured: dict[str, Measured] = {}  # trajectory id -> what it cost, so far
        self.aborted: dict[str, float] = {}  # trajectory id -> when its generation was aborted
        # Generations migrated (aborted by a role change or a removal, resumed from their prefix
        # elsewhere): (when aborted, prompt tokens the resumption prefilled again).
        self.migrations: deque[tuple[float, int]] = deque(maxlen=100_000)

    def forget(self, trajectory_ids: Sequence[str]) -> None:
        """Trajectories that will not be handed out (a stale or failed group)."""
        for tid in trajectory_ids:
            self.measured.pop(tid, None)

    def finished(self, trajectory_id: str, latency_s: float) -> None:
        """A trajectory ended ``latency_s`` after it started."""
        self.measured.setdefault(trajectory_id, Measured()).latency_s = latency_s

    def turn(self, trajectory_id: str, result: GenerateResult) -> None:
        """One generation of ``trajectory_id`` came back: the prompt tokens really prefilled, the
        decode batch it ran in, and a resumption after an abort (a migration)."""
        prefilled = max(0, result.prompt_tokens - result.cached_tokens)
        m = self.measured.setdefault(trajectory_id, Measured())
        m.prefilled = (m.prefilled or 0) + prefilled
        m.decode_steps += result.decode_steps
        m.decode_batch_sum += result.decode_batch_sum
        aborted = self.aborted.pop(trajectory_id, None)
        if aborted is not None:  # a resumption: everything it prefilled was computed before
            self.migrations.append((aborted, prefilled))
        if result.finish_reason is FinishReason.ABORT:
            self.aborted[trajectory_id] = self.clock()

    def look(self) -> None:
        """The trajectories in flight now with the workers serving them, and f."""
        self.flight.append(
            Sample(at=self.clock(), in_flight=self.running, workers=self.workers, lent=self.lent)
        )
        if self.running:
            self.active.append(self.generating / self.running)
            if len(self.active) > 10_000:
                del self.active[: len(self.active) // 2]

    def report(
        self, batch: Batch, spans: Sequence[tuple[float, float]], dropped: int
    ) -> StepReport:
        """``batch``, made of groups that ran over ``spans`` (started, finished), as the Runtime
        Tracker needs it; ``dropped``: groups dropped as stale since the batch before."""
        measured = [self.measured.pop(t.id, Measured()) for t in batch.trajectories]
        stats = tuple(
            TrajectoryStats(
                turns=t.n_turns,
                new_tokens=sum(len(x.prompt_ids) for x in t.turns),
                generated_tokens=t.n_generated,
                env_s=t.env_s,
                prefilled_tokens=m.prefilled,
                seen_batch=m.seen_batch,
                latency_s=m.latency_s,
            )
            for t, m in zip(batch.trajectories, measured, strict=True)
        )
        active, self.active = tuple(self.active), []
        t0, t1 = min(s for s, _ in spans), max(f for _, f in spans)
        now = Sample(at=t1, in_flight=self.running, workers=self.workers, lent=self.lent)
        # Lent workers count from the moment the batch before was handed out (the Router gives
        # them the critical path alone).
        in_flight, workers = batch_occupancy(
            samples=self.flight, t0=t0, t1=t1, critical_from=self.handed_at, last=now
        )
        spread = max(s for s, _ in spans) - t0
        return StepReport(
            step=batch.step,
            trajectories=stats,
            makespan_s=t1 - t0,
            active_fraction=active,
            dropped_groups=dropped,
            in_flight=in_flight,
            workers=workers,
            start_spread_s=spread,
        )


__all__ = ["Measured", "Meter", "StepReport"]
