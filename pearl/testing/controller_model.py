"""A model of the world around the pure controller, as a hypothesis state machine: random
interleavings of every event and command result, with simulated time, checked after every step.

The machine plays elastic events (joins, reclaims), a trainer (Training Begin, waits for "may
proceed", Training Finished, weight publishes), executors that answer, fail or silently lose the
commands they were sent, worker hosts that crash, come back or are given up on, pearld restarts
(recovery from the log), and ticks with time advancing. After every step:

- the table is valid and equals the fold of every record logged so far;
- the controller's bookkeeping (evicting, failed, lost) names only workers the table has;
- a Training Begin is answered by "training may proceed" within a bounded simulated time;
- borrowed GPUs never serve while training runs: during a training step no overlap worker is
  routable, and once training may proceed every overlap worker is inactive.

``tests/core/test_controller_model.py`` runs it in ``make test``,
``benchmarks/bench_controller_model.py`` runs many more steps.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from pearl import config
from pearl.core import commands as cmd
from pearl.core import events as ev
from pearl.core.controller import DEFAULT_TIMEOUTS, Controller, ControllerState, Input, Output
from pearl.core.errors import InvalidEvent
from pearl.core.fold import apply_all, replay
from pearl.core.policy import PD, Borrow, Policy
from pearl.core.profile import prior_profile
from pearl.core.state import (
    Activity,
    ClusterState,
    Role,
    StepOp,
    TrainingPhase,
    Worker,
    Zone,
    validate,
)

CFG = config.load(
    Path(__file__).resolve().parents[2] / "configs" / "sim-32.toml",
    ["cluster.training_gpus=0-3", "cluster.reserved_gpus=4-7", "cluster.preemptible_gpus=8-15"],
)
PREEMPTIBLE = tuple(range(8, 16))
TICK_MAX_S = 40.0
# The longest chain a return can wait on, in simulated time: a started role switch of the
# interrupted plan, its cancelled joiners, the overlap workers' deactivation, the trainer's
# reclaim; each deadline is noticed at the next tick.
RETURN_BOUND_S = (
    DEFAULT_TIMEOUTS[StepOp.SET_ROLE]
    + DEFAULT_TIMEOUTS[StepOp.REMOVE]
    + DEFAULT_TIMEOUTS[StepOp.DEACTIVATE]
    + DEFAULT_TIMEOUTS[StepOp.RECLAIM]
    + 4 * TICK_MAX_S
)
STEPS_RUN = [0]  # steps executed in this process

PLAN_COMMANDS = cmd.STEP_COMMANDS


class ControllerModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.policy_borrow = Borrow.ALWAYS
        self.ctl = Controller(Policy(CFG.decision, pd=PD.ADAPTIVE, borrow=Borrow.ALWAYS))
        c = CFG.cluster
        self.records: list[Any] = [
            ev.ClusterInit(
                tp=c.tp,
                training_gpus=c.training_gpus,
                reserved_gpus=c.reserved_gpus,
                preemptible_gpus=c.preemptible_gpus,
            )
        ]
        self.folded = replay(self.records)
        self.now = 0.0
        self.pending: list[Any] = []  # commands executors hold and have not answered
        self.down: dict[int, int] = {}  # worker -> incarnation of a host that crashed
        self.waiting_since: float | None = None  # a Training Begin not yet answered
        self.proceeded = 0
        self.rng = random.Random(0)
        self.healthy = 0.0  # chance that executors catch up after an event
        self.s: ControllerState = self.ctl.initial(self.folded, prior_profile(CFG))
        self._take(self.ctl.recover(self.folded, prior_profile(CFG), self.now))

    @initialize(rng=st.randoms(use_true_random=False), healthy=st.floats(0.0, 0.95))
    def cluster(self, rng: random.Random, healthy: float) -> None:
        """How healthy this run's executors are: after each event they catch up with this
        probability (some runs mostly interleave, some mostly settle between events)."""
        self.rng, self.healthy = rng, healthy

    # -- plumbing ---------------------------------------------------------------------------

    @property
    def table(self) -> ClusterState:
        return self.s.table

    def _take(self, out: Output) -> None:
        self.records += out.records
        self.folded = apply_all(self.folded, out.records)
        self.s = out.state
        for c in out.commands:
            if isinstance(c, PLAN_COMMANDS):
                self.pending.append(c)
            elif (
                isinstance(c, cmd.TrainingMayProceed)
                and c.step == self.table.training_step
                and self.waiting_since is not None
            ):
                self.waiting_since = None
                self.proceeded = c.step

    def _send(self, event: Input, dt: float = 0.0) -> bool:
        """Hand ``event`` to the controller; False (and nothing changed) if it is invalid."""
        self.now += dt
        before = self.s
        try:
            out = self.ctl.handle(self.s, event, self.now)
        except InvalidEvent:
            assert self.s is before
            return False
        self._take(out)
        return True

    def _event(self, event: Input) -> bool:
        """An event from the world; then, maybe, the executors catch up."""
        ok = self._send(event)
        if self.rng.random() < self.healthy:
            self.executors_catch_up(slow_stops=self.rng.random() < 0.3)
        return ok

    def _rollout_worker(self, i: int) -> Worker | None:
        ws = sorted(self.table.rollout_workers(), key=lambda w: w.id)
        return ws[i % len(ws)] if ws else None

    # -- the world ----------------------------------------------------------------------------

    @staticmethod
    def _pick(pool: list[int], start: int, n: int) -> tuple[int, ...]:
        return tuple(sorted(pool[(start + j) % len(pool)] for j in range(min(n, len(pool)))))

    @rule(start=st.integers(0, 7), n=st.integers(1, 4))
    def gpus_added(self, start: int, n: int) -> None:
        t = self.table
        absent = [g for g in PREEMPTIBLE if g not in t.present_gpus | t.reclaiming_gpus]
        if absent:
            assert self._event(ev.GpusAdded(gpus=self._pick(absent, start, n)))

    @rule(start=st.integers(0, 7), n=st.integers(1, 4))
    def gpus_reclaimed(self, start: int, n: int) -> None:
        present = sorted(self.table.present_gpus)
        if present:
            assert self._event(ev.GpusReclaimed(gpus=self._pick(present, start, n)))

    @rule(gpus=st.sets(st.integers(0, 17), min_size=0, max_size=3), added=st.booleans())
    def arbitrary_gpu_event(self, gpus: set[int], added: bool) -> None:
        """Any GPU set, valid or not: an invalid one is refused and changes nothing."""
        kind = ev.GpusAdded if added else ev.GpusReclaimed
        self._send(kind(gpus=tuple(sorted(gpus))))

    @rule()
    def training_begin(self) -> None:
        if self.table.phase is TrainingPhase.TRAINING:
            self._send(
                ev.TrainingBegin(step=self.table.training_step + 1)
            )  # refused: one at a time
            return
        self.waiting_since = self.now
        assert self._event(ev.TrainingBegin(step=self.table.training_step + 1))

    @rule(publish=st.booleans())
    def training_finished(self, publish: bool) -> None:
        t = self.table
        if t.phase is not TrainingPhase.TRAINING or self.proceeded != t.training_step:
            return  # a trainer finishes only a step it was allowed to run
        version = t.weights_version + 1 if publish else None
        assert self._event(ev.TrainingFinished(step=t.training_step, weights_version=version))

    @rule()
    def weights_published(self) -> None:
        self._event(ev.WeightsPublished(version=self.table.weights_version + 1))

    @rule(
        i=st.integers(0, 63), ok=st.sampled_from([True, True, True, False]), dt=st.floats(0.0, 2.0)
    )
    def answer(self, i: int, ok: bool, dt: float) -> None:
        if not self.pending:
            return
        c = self.pending.pop(i % len(self.pending))
        if isinstance(c, cmd.StopWorker) and not c.plan:
            self._send(
                cmd.WorkerDown(worker=c.worker, incarnation=0, reason="stopped"), dt
            )  # a stop beside any plan
            return
        if getattr(c, "background", False):  # a joiner in the background: up, or its host died
            if ok:
                self._send(cmd.WorkerUp(worker=c.worker, incarnation=c.incarnation), dt)
            else:
                self.down[c.worker] = c.incarnation
                self._send(
                    cmd.WorkerDown(
                        worker=c.worker, incarnation=c.incarnation, reason="host exited"
                    ),
                    dt,
                )
            return
        cancel = getattr(c, "cancel", False)
        self._send(
            cmd.StepResult(plan=c.plan, step=c.step, ok=ok or cancel, cancel=cancel, duration_s=dt),
            dt,
        )

    @rule(slow_stops=st.booleans())
    def executors_catch_up(self, slow_stops: bool) -> None:
        """Every executor answers what it holds (stopping hosts may take longer: their stops
        stay pending), as in a healthy cluster between elastic events."""
        for _ in range(50):
            ready = [c for c in self.pending if not (slow_stops and isinstance(c, cmd.StopWorker))]
            if not ready:
                return
            self.answer(self.pending.index(ready[0]), ok=True, dt=0.2)

    @rule(i=st.integers(0, 63))
    def command_lost(self, i: int) -> None:
        """An executor never answers (its host hangs): only deadlines get the plan past it."""
        if self.pending:
            self.pending.pop(i % len(self.pending))

    @rule(i=st.integers(0, 15))
    def worker_down(self, i: int) -> None:
        w = self._rollout_worker(i)
        if w is not None:
            self.down[w.id] = w.incarnation
            self._event(
                cmd.WorkerDown(worker=w.id, incarnation=w.incarnation, reason="host exited")
            )

    @rule(i=st.integers(0, 15))
    def worker_up(self, i: int) -> None:
        if self.down:
            wid = sorted(self.down)[i % len(self.down)]
            self._event(cmd.WorkerUp(worker=wid, incarnation=self.down.pop(wid)))

    @rule(i=st.integers(0, 15))
    def worker_lost(self, i: int) -> None:
        w = self._rollout_worker(i)
        wid = w.id if w is not None else i
        self.down.pop(wid, None)
        self._event(cmd.WorkerLost(worker=wid, reason="restart budget spent"))

    @rule(remaining=st.integers(0, 64))
    def rollout_progress(self, remaining: int) -> None:
        self._send(cmd.RolloutProgress(remaining=remaining))

    @rule(dt=st.floats(0.1, TICK_MAX_S))
    def tick(self, dt: float) -> None:
        self._send(cmd.Tick(), dt)

    @rule()
    def pearld_restarts(self) -> None:
        """Crash recovery: the controller's view is rebuilt from the log alone."""
        table = replay(self.records)
        assert table == self.s.table
        self._take(self.ctl.recover(table, prior_profile(CFG), self.now))

    # -- what must always hold ----------------------------------------------------------------

    @invariant()
    def table_is_the_fold_of_the_log(self) -> None:
        STEPS_RUN[0] += 1
        validate(self.table)
        assert self.folded == self.table

    @invariant()
    def bookkeeping_names_only_workers_in_the_table(self) -> None:
        known = self.table.workers.keys()
        assert set(self.s.evicting) <= known, (self.s.evicting, sorted(known))
        assert self.s.failed <= known, (self.s.failed, sorted(known))
        assert self.s.lost <= known, (self.s.lost, sorted(known))

    @invariant()
    def training_may_proceed_in_bounded_time(self) -> None:
        if self.waiting_since is not None:
            assert self.now - self.waiting_since <= RETURN_BOUND_S, (
                f"training {self.table.training_step} waits {self.now - self.waiting_since:.0f} s"
            )

    @invariant()
    def borrowed_gpus_never_serve_while_training_runs(self) -> None:
        t = self.table
        if t.phase is not TrainingPhase.TRAINING:
            return
        overlap = [w for w in t.rollout_workers(Zone.OVERLAP)]
        assert not [w.id for w in overlap if w.activity is Activity.ACTIVE]
        if self.proceeded == t.training_step:
            assert all(w.activity is Activity.INACTIVE for w in overlap)
            assert all(w.activity is Activity.ACTIVE for w in t.training_workers())
            assert all(w.role is Role.TRAINING for w in t.training_workers())
