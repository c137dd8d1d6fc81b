"""One simulated run: the real controller, simulated executors, a rollout cluster and a trainer.

The run plays the paper's asynchronous RL loop (§2.1, §4.1.2) in simulated time. Rollout batch k
starts when batch k-1 is complete and training step k-2 has produced its weights (staleness 1);
when batch k completes its telemetry summary goes to the controller, then ``TrainingBegin(k)``
(borrowed GPUs must come back), and training step k runs once the controller says
``TrainingMayProceed``; ``TrainingFinished(k)`` lets borrowing resume. Preemptible GPUs follow the
availability trace (``GpusAdded``/``GpusReclaimed``: the most recently added GPUs are reclaimed
first). The router's view is the table's routable set after every controller output.

Every table the controller produces is checked with :func:`pearl.core.state.validate`; a training
step that waits more than ``return_bound_s`` for its GPUs counts as a late return.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import msgspec

from pearl.core import commands as cmd
from pearl.core import events as ev
from pearl.core.controller import Controller, ControllerState, Input, Output
from pearl.core.errors import InvariantViolation, PearlError
from pearl.core.fold import replay
from pearl.core.makespan import KV_RESIDENCY
from pearl.core.profile import RuntimeTracker, WorkloadProfile
from pearl.core.state import Role, Zone, validate
from pearl.sim import clock as ck
from pearl.sim.availability import Availability
from pearl.sim.clock import Clock
from pearl.sim.costs import worker_costs
from pearl.sim.executor import STEP_COMMANDS, Executors
from pearl.sim.result import RunResult, StepRecord
from pearl.sim.rollout import Rollout
from pearl.sim.scenario import PolicySpec, Scenario
from pearl.sim.static import run_static, telemetry_of
from pearl.sim.trajectory import Traj
from pearl.sim.worker import StepStats
from pearl.sim.workload import generate_batch

HISTORY_BATCH = 1_000_000  # batch indices of the job's history, disjoint from the run's


def history_profile(
    sc: Scenario, reserved: int, workers: int = 4, batches: int = 6
) -> WorkloadProfile:
    """The profile a running job's tracker holds when the window starts: the catalog priors
    folded with the telemetry of ``batches`` earlier steps (colocated, ``workers`` workers).

    The segments are windows of a long job, so the controller starts with history rather than
    raw priors (which know nothing of the deployment's speed or the workload's shape)."""
    prior = sc.prior(reserved)
    res = run_static(
        sc.model,
        workers,
        workload=sc.workload,
        engine=sc.engine,
        seed=sc.seed,
        batches=batches,
        first_batch=HISTORY_BATCH,
        balance=sc.balance,
    )
    tracker = RuntimeTracker(prior, sc.decision.ema_alpha, float(sc.workload.max_tokens))
    for raw in res.telemetry:
        tracker.observe(tracker.summarize(raw))
    return msgspec.structs.replace(tracker.profile, BW=transfer_bandwidth(sc, tracker.profile))


def transfer_bandwidth(sc: Scenario, p: WorkloadProfile) -> float:
    """Eq. 3's BW as the deployment pays it, in bytes of delta_L tokens per second.

    Eq. 3 moves B delta_L K bytes per turn. A decode worker that keeps no prefix (SGLang's PD
    decode) receives the whole context every turn, on average delta_L plus half the final
    context (``KV_RESIDENCY``), so per delta_L token the link carries that much more; the link is
    the node's, at the deployment's (dilated) rate."""
    link = sc.engine.link_Bps / sc.engine.time_scale
    if sc.engine.decode_keeps_prefix or p.delta_L <= 0:
        return link
    resident = KV_RESIDENCY * p.K_seq / p.K if p.K > 0 else 0.0
    return link * p.delta_L / (p.delta_L + resident)


def roll_large_gpus(avail: Availability, reserved: int = 4) -> int:
    """ROLL-Large's fixed pool: the window's mean rollout GPUs rounded up to a multiple of 2."""
    return 2 * math.ceil((reserved + avail.mean()) / 2 - 1e-9)


class Simulation:
    """Run one policy over one availability window; :meth:`run` returns a :class:`RunResult`."""

    def __init__(
        self,
        sc: Scenario,
        spec: PolicySpec,
        avail: Availability,
        progress: Callable[[float], None] | None = None,
    ) -> None:
        self.sc, self.spec, self.avail = sc, spec, avail
        self.progress = progress or (lambda f: None)
        self.reserved = spec.reserved_gpus or roll_large_gpus(avail)
        cfg = sc.config(self.reserved)
        self.policy = sc.policy(spec)
        self.ctl = Controller(self.policy)
        self.clock = Clock(-sc.warmup_s)
        self.rollout = Rollout(
            clock=self.clock,
            costs=worker_costs(sc.model, sc.engine),
            balance=sc.balance,
            env_scale=sc.engine.time_scale,
        )
        self.rollout.on_traj_done = self._notify
        self.execs = Executors(
            clock=self.clock, rollout=self.rollout, costs=sc.costs, t0=-sc.warmup_s
        )
        c = cfg.cluster
        self.init = ev.ClusterInit(
            tp=c.tp,
            training_gpus=c.training_gpus,
            reserved_gpus=c.reserved_gpus,
            preemptible_gpus=c.preemptible_gpus,
        )
        self._prior = history_profile(sc, self.reserved)
        self.s: ControllerState | None = None
        self.result = RunResult(
            policy=spec.name,
            model=sc.model,
            reserved_gpus=self.reserved,
            availability=avail,
            seed=sc.seed,
        )
        self._pending: list[Traj] = []
        self._routable: dict[int, Role] = {}
        self._avail_target = 0
        # the RL loop
        self.batch = 0  # index of the batch in flight (0: none yet)
        self.in_flight = False
        self.remaining = 0
        self.trs: list[Traj] = []
        self.t_batch = 0.0
        self.acc0 = (0.0, 0.0)
        self.completed: dict[int, tuple[float, int, int, float]] = {}
        self.trained = 0  # training steps finished (= weights version)
        self.training: int | None = None
        self.begin_t: dict[int, float] = {}
        self.last_done = -sc.warmup_s

    # -- the controller ----------------------------------------------------------------------------

    def _handle(self, event: Input) -> None:
        assert self.s is not None
        try:
            out = self.ctl.handle(self.s, event, self.clock.now)
        except PearlError as e:
            self.result.errors.append(f"t={self.clock.now:.1f}: {type(event).__name__}: {e}")
            self.result.invariant_violations += 1
            return
        self._apply(out)

    def _apply(self, out: Output) -> None:
        self.s = out.state
        self.result.controller_events += 1
        try:
            validate(out.state.table)
        except InvariantViolation as e:
            self.result.invariant_violations += 1
            self.result.errors.append(f"t={self.clock.now:.1f}: {e}")
        for r in out.records:
            if isinstance(r, ev.PlanBegin):
                self.result.plans.append((self.clock.now, r.cause, str(r.target), len(r.steps)))
        for c in out.commands:
            if isinstance(c, STEP_COMMANDS):
                self.execs.command(c)
            elif isinstance(c, cmd.TrainingMayProceed):
                self._train(c.step)
        self._sync_routing()

    def _sync_routing(self) -> None:
        assert self.s is not None
        table = self.s.table
        routable = {w.id: w.role for w in table.routable()}
        if routable != self._routable:
            self._routable = routable
            self.rollout.set_routable(routable)
            overlap = sum(1 for w in table.routable() if w.zone is Zone.OVERLAP)
            counts = table.role_counts()
            self.result.timeline.append(
                (self.clock.now, len(routable) - overlap, overlap, str(counts))
            )

    # -- availability ----------------------------------------------------------------------------

    def _sync_avail(self) -> None:
        assert self.s is not None
        t = self.s.table
        present = sorted(t.present_gpus)
        n = self._avail_target
        if len(present) < n:
            free = [
                g
                for g in sorted(t.preemptible_gpus)
                if g not in t.present_gpus and g not in t.reclaiming_gpus
            ]
            if free[: n - len(present)]:
                self._handle(ev.GpusAdded(gpus=tuple(free[: n - len(present)])))
        elif len(present) > n:
            self._handle(ev.GpusReclaimed(gpus=tuple(present[n:])))

    # -- the RL loop -------------------------------------------------------------------------------

    def _notify(self, tr: Traj) -> None:
        self._pending.append(tr)

    def _drain(self) -> None:
        while self._pending:
            self._pending.pop(0)
            self.remaining -= 1
            if self.remaining == 0:
                self._batch_done()
            else:
                self._handle(cmd.RolloutProgress(remaining=self.remaining))

    def _start_batch(self) -> None:
        if self.in_flight or self.trained < self.batch - self.sc.staleness:
            return  # batch k+1 needs the weights of training step k-1 (bounded staleness)
        self.batch += 1
        self.in_flight = True
        specs = generate_batch(self.sc.workload, self.sc.seed, self.batch)
        ro = self.rollout
        ro.stats = StepStats()
        for w in ro.workers.values():
            w.stats = ro.stats
        ro._acc()
        self.acc0 = (ro.int_unfinished, ro.int_env)
        self.t_batch = self.clock.now
        self.remaining = len(specs)
        self.trs = ro.start(specs)

    def _batch_done(self) -> None:
        ro, k, now = self.rollout, self.batch, self.clock.now
        ro._acc()
        unf = ro.int_unfinished - self.acc0[0]
        f = 1.0 - (ro.int_env - self.acc0[1]) / unf if unf > 0 else 1.0
        span = now - self.t_batch
        raw = telemetry_of(
            step=k,
            trs=self.trs,
            stats=ro.stats,
            f_active=f,
            makespan=span,
            in_flight=unf / span if span > 0 else 0.0,
            env_scale=ro.env_scale,
            start=self.t_batch,
        )
        assert self.s is not None
        tracker = RuntimeTracker(self.s.profile, self.policy.alpha, self.policy.L_max)
        self._handle(tracker.summarize(raw))
        gen = sum(sum(tr.spec.gen) for tr in self.trs)
        tok = sum(tr.spec.tokens for tr in self.trs)
        self.completed[k] = (span, gen, tok, now)
        self.in_flight = False
        self._begin_training()
        self._start_batch()

    def _begin_training(self) -> None:
        k = self.trained + 1
        if self.training is None and k in self.completed:
            self.training = k
            self.begin_t[k] = self.clock.now
            self._handle(ev.TrainingBegin(step=k))

    def _train(self, k: int) -> None:
        wait = self.clock.now - self.begin_t.get(k, self.clock.now)
        self.result.return_waits.append(wait)
        if wait > self.sc.return_bound_s:
            self.result.late_returns += 1
        tr = self.sc.training
        tokens = self.completed[k][2]
        seconds = tr.fixed_s + tokens / (self.sc.training_gpus * tr.tokens_per_gpu_s)
        self.clock.at(self.clock.now + seconds, ck.TRAIN, (k, seconds, wait))

    def _trained(self, k: int, seconds: float, wait: float) -> None:
        now = self.clock.now
        # Version k is published: the broadcast to the rollout workers stalls them while they
        # receive and load it (the overlap workers load it when they are next activated).
        self.rollout.stall(self.rollout.costs.weight_sync_s())
        self._handle(ev.TrainingFinished(step=k, weights_version=k))
        span, gen, tok, t_roll = self.completed.pop(k)
        self.result.steps.append(
            StepRecord(
                step=k,
                t_done=now,
                duration_s=now - self.last_done,
                generated=gen,
                trained=tok,
                rollout_s=span,
                train_s=seconds,
                wait_s=wait,
            )
        )
        self.last_done = now
        self.trained = k
        self.training = None
        self._begin_training()
        self._start_batch()
        if self.in_flight:
            self._handle(cmd.RolloutProgress(remaining=self.remaining))

    # -- the loop ----------------------------------------------------------------------------------

    def run(self) -> RunResult:
        wall = time.perf_counter()
        sc, clock = self.sc, self.clock
        self._apply(self.ctl.recover(replay([self.init]), self._prior, clock.now))
        if self.spec.elastic:
            self._avail_target = self.avail.at(0.0)
            self._sync_avail()
            for t, g in self.avail.changes():
                clock.at(t, ck.AVAIL, g)
        clock.at(-sc.warmup_s + sc.tick_s, ck.TICK)
        end = self.avail.duration_s
        clock.at(end, ck.END)
        self._start_batch()
        ro, n, report = self.rollout, 0, -sc.warmup_s
        span = end + sc.warmup_s
        while (e := clock.pop()) is not None:
            t, kind, obj, ver = e
            n += 1
            if ro.dispatch(kind, obj, ver):
                pass
            elif kind == ck.STEP:
                self._handle(obj)
                self._sync_avail()
            elif kind == ck.UNPAUSE:
                ro.flush_router()
            elif kind == ck.PAUSE:
                self.execs.on_pause(*obj)
            elif kind == ck.AVAIL:
                self._avail_target = obj
                self._sync_avail()
            elif kind == ck.TRAIN:
                self._trained(*obj)
            elif kind == ck.TICK:
                self._handle(cmd.Tick())
                clock.at(t + sc.tick_s, ck.TICK)
            elif kind == ck.END:
                break
            if self._pending:
                self._drain()
            if t - report > span / 100:
                report = t
                self.progress((t + sc.warmup_s) / span)
        self.progress(1.0)
        r = self.result
        r.events = n
        r.ops = dict(self.execs.ops)
        r.wall_s = time.perf_counter() - wall
        return r


__all__ = ["Simulation", "roll_large_gpus", "transfer_bandwidth"]
