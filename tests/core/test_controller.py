"""Controller scenarios: a scripted executor answers commands; the table must stay valid,
records must fold to the controller's state, and borrowed GPUs come back before training."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from pearl import config
from pearl.core import commands as cmd
from pearl.core import events as ev
from pearl.core.controller import Controller, ControllerState
from pearl.core.errors import InvalidEvent, InvariantViolation
from pearl.core.fold import apply_all, replay
from pearl.core.policy import PD, Borrow, Policy
from pearl.core.profile import prior_profile
from pearl.core.state import (
    Activity,
    ClusterState,
    Mode,
    Role,
    StepOp,
    Target,
    TrainingPhase,
    Zone,
    validate,
)

CFG = config.load(
    "configs/sim-32.toml",
    ["cluster.training_gpus=0-3", "cluster.reserved_gpus=4-7", "cluster.preemptible_gpus=8-15"],
)
STEP_OPS = cmd.STEP_COMMANDS


class Harness:
    """Drives a Controller like the daemon would: log (here: keep) records, then send commands.

    Commands for plan steps queue up in ``pending``; ``answer`` replies to them. After every
    output the table is validated and must equal the fold of every record so far."""

    def __init__(
        self,
        borrow: Borrow = Borrow.NEVER,
        records: list[Any] | None = None,
        pd: PD = PD.ADAPTIVE,
        cfg: config.Config = CFG,
    ) -> None:
        self.ctl = Controller(Policy(cfg.decision, pd=pd, borrow=borrow))
        c = cfg.cluster
        init = ev.ClusterInit(
            tp=c.tp,
            training_gpus=c.training_gpus,
            reserved_gpus=c.reserved_gpus,
            preemptible_gpus=c.preemptible_gpus,
        )
        self.records: list[Any] = list(records or [init])
        table = replay(self.records)
        self.now = 0.0
        self.pending: list[Any] = []
        self.sent: list[Any] = []
        out = self.ctl.recover(table, prior_profile(cfg), self.now)
        self.s: ControllerState = out.state
        self._take(out)

    def _take(self, out: Any) -> None:
        self.records += out.records
        self.s = out.state
        validate(self.s.table)
        assert replay(self.records) == self.s.table, "state = fold(records)"
        for c in out.commands:
            self.sent.append(c)
            if isinstance(c, STEP_OPS):
                self.pending.append(c)

    def send(self, event: Any, dt: float = 0.0) -> None:
        self.now += dt
        self._take(self.ctl.handle(self.s, event, self.now))

    def answer(
        self, pick: Callable[[Any], bool] = lambda c: True, ok: bool = True, dt: float = 1.0
    ) -> int:
        """Reply to the pending commands ``pick`` selects (in order); returns how many."""
        chosen = [c for c in self.pending if pick(c)]
        self.pending = [c for c in self.pending if not pick(c)]
        for c in chosen:
            if getattr(c, "background", False):  # a joiner in the background says it is up
                up = cmd.WorkerUp(worker=c.worker, incarnation=c.incarnation)
                self.send(
                    up
                    if ok
                    else cmd.WorkerDown(
                        worker=c.worker, incarnation=c.incarnation, reason="failed"
                    ),
                    dt,
                )
                continue
            cancel = getattr(c, "cancel", False)
            self.send(
                cmd.StepResult(plan=c.plan, step=c.step, ok=ok, cancel=cancel, duration_s=dt), dt
            )
        return len(chosen)

    def settle(self, limit: int = 50) -> None:
        for _ in range(limit):
            if not self.answer():
                return
        raise AssertionError("controller never settled")

    @property
    def table(self) -> ClusterState:
        return self.s.table


def test_start_brings_up_reserved_workers_in_the_background_each_serving_when_up() -> None:
    """§4.5: new workers initialise in the background. A colocated joiner exposes no partial
    topology, so the plan is over once they are launched and each serves on its WorkerUp."""
    h = Harness()
    assert [type(c) for c in h.pending] == [cmd.StartWorker, cmd.StartWorker]
    assert all(c.background for c in h.pending) and h.table.plan is None
    assert h.table.routable() == [] and h.s.failed == {c.worker for c in h.pending}
    first = h.pending[0].worker
    h.answer(lambda c: c.worker == first)
    assert [w.id for w in h.table.routable()] == [first]  # serves without waiting for the other
    assert (
        cmd.SyncWeights(worker=first, version=h.table.weights_version) in h.sent
    )  # versions it missed
    h.settle()
    assert len(h.table.routable()) == 2 and not h.s.failed


def test_a_split_from_nothing_is_admitted_together() -> None:
    """Prefill without decode (or the reverse) is a partial topology: the first PD group is
    admitted at once, all or nothing (§4.5 atomic finalization)."""
    h = Harness(pd=PD.DISAGGREGATED)
    assert [type(c) for c in h.pending] == [cmd.StartWorker, cmd.StartWorker]
    assert not any(c.background for c in h.pending) and h.table.plan is not None
    h.answer(lambda c: c.worker == h.pending[0].worker)
    assert h.table.routable() == []  # the first ready joiner waits for the group
    h.settle()
    assert len(h.table.routable()) == 2 and h.table.plan is None


def test_expansion_then_reclaim_keeps_table_valid() -> None:
    h = Harness()
    h.settle()
    h.send(ev.GpusAdded(gpus=(8, 9, 10, 11)))
    assert sum(isinstance(c, cmd.StartWorker) for c in h.pending) == 2
    h.settle()
    assert len(h.table.routable()) == 4
    victim = next(w for w in h.table.routable() if 8 in w.gpus)
    h.send(ev.GpusReclaimed(gpus=(8,)))
    assert victim.id not in {w.id for w in h.table.routable()}  # stops routing at once
    assert any(isinstance(c, cmd.StopWorker) and c.worker == victim.id for c in h.pending)
    h.settle()
    assert victim.id not in h.table.workers and 8 not in h.table.present_gpus
    assert len(h.table.routable()) == 3  # GPU 9 alone cannot host a TP2 worker


def test_reclaim_of_one_background_joiner_leaves_the_others_initialising() -> None:
    """A reclaim removes the joiner on those GPUs only: the others' cold starts go on (before,
    the whole expansion was cancelled and a reserved worker's start was thrown away)."""
    h = Harness()
    h.settle()
    h.send(ev.GpusAdded(gpus=(8, 9, 10, 11)))
    joiners = {c.gpus[0]: c.worker for c in h.pending if isinstance(c, cmd.StartWorker)}
    assert h.table.plan is None  # launched: the expansion is over
    h.send(ev.GpusReclaimed(gpus=(8,)))
    assert not any(getattr(c, "cancel", False) for c in h.pending)
    assert not any(isinstance(c, cmd.StopWorker) and c.worker == joiners[10] for c in h.sent)
    h.settle()
    assert not any(isinstance(r, ev.PlanAbort) for r in h.records)
    validate(h.table)
    assert joiners[8] not in h.table.workers and 8 not in h.table.present_gpus
    assert not h.table.reclaiming_gpus
    assert joiners[10] in {w.id for w in h.table.routable()} and len(h.table.routable()) == 3


def test_a_split_failing_to_start_is_cancelled_and_quarantined() -> None:
    h = Harness(pd=PD.DISAGGREGATED)
    bad = next(c for c in h.pending if isinstance(c, cmd.StartWorker) and 4 in c.gpus)
    h.answer(lambda c: c is bad, ok=False)
    h.settle()
    (abort,) = [r for r in h.records if isinstance(r, ev.PlanAbort)]
    assert abort.reason.startswith(f"{ev.AbortCause.STEP} ") and "failed" in abort.reason
    assert {4, 5} <= set(h.s.quarantine)
    assert not any(4 in w.gpus for w in h.table.workers.values())
    h.send(cmd.Tick(), dt=CFG.gate.toggle_cost_s + 60)
    assert any(isinstance(c, cmd.StartWorker) and 4 in c.gpus for c in h.pending)  # retried
    h.settle()
    assert len(h.table.routable()) == 2


def test_a_background_joiner_whose_host_is_lost_is_quarantined_and_removed() -> None:
    h = Harness()
    h.settle()
    h.send(ev.GpusAdded(gpus=(8, 9, 10, 11)))
    bad = next(c for c in h.pending if isinstance(c, cmd.StartWorker) and 8 in c.gpus)
    h.answer(lambda c: c is bad, ok=False)  # its host died: WorkerDown, restarts follow
    assert any(isinstance(r, ev.WorkerFailed) and r.worker == bad.worker for r in h.records)
    assert bad.worker not in {w.id for w in h.table.routable()}
    h.send(
        cmd.WorkerLost(worker=bad.worker, reason="restart budget spent")
    )  # its supervisor gives up
    h.settle()
    assert {8, 9} <= set(h.s.quarantine) and bad.worker not in h.table.workers
    assert len(h.table.routable()) == 3  # the other joiner serves


def test_borrow_and_mandatory_return_before_training() -> None:
    h = Harness(borrow=Borrow.ALWAYS)
    # Idle training GPUs are borrowed from the start, once the reserved workers are launched
    # (in the background); training lends them before overlap workers start on them.
    assert [type(c) for c in h.pending] == [cmd.StartWorker, cmd.StartWorker, cmd.LendTraining]
    assert all(c.background for c in h.pending[:2])
    h.settle()
    overlap = [w for w in h.table.routable() if w.zone is Zone.OVERLAP]
    assert len(overlap) == 2
    h.send(ev.TrainingBegin(step=1))
    assert not any(w.zone is Zone.OVERLAP for w in h.table.routable())  # stop routing at once
    assert all(isinstance(c, cmd.DeactivateWorker) for c in h.pending) and len(h.pending) == 2
    h.answer()
    assert [type(c) for c in h.pending] == [cmd.ReclaimTraining]
    assert not any(isinstance(c, cmd.TrainingMayProceed) for c in h.sent)  # not before GPUs return
    h.answer()
    assert cmd.TrainingMayProceed(step=1) in h.sent
    assert h.table.workers[0].activity is Activity.ACTIVE
    assert all(w.activity is Activity.INACTIVE for w in h.table.rollout_workers(Zone.OVERLAP))
    h.settle()
    # The next borrow reuses the retained overlap processes (activation, not a cold start).
    h.send(ev.TrainingFinished(step=1, weights_version=1))
    h.answer()
    assert {type(c) for c in h.pending} == {cmd.ActivateWorker}
    h.settle()
    assert len(h.table.routable()) == 4


def test_no_borrowing_means_training_proceeds_at_once() -> None:
    h = Harness(borrow=Borrow.NEVER)
    h.settle()
    h.send(ev.TrainingBegin(step=1))
    assert h.pending == [] and cmd.TrainingMayProceed(step=1) in h.sent


def test_training_begin_during_borrow_cancels_it_and_returns_on_time() -> None:
    h = Harness(borrow=Borrow.ALWAYS)
    h.answer()  # lend done; overlap workers start
    assert {type(c) for c in h.pending} == {cmd.StartWorker}
    h.send(ev.TrainingBegin(step=2))
    h.settle()
    assert cmd.TrainingMayProceed(step=2) in h.sent
    assert h.table.workers[0].activity is Activity.ACTIVE
    assert all(w.activity is Activity.INACTIVE for w in h.table.rollout_workers(Zone.OVERLAP))


def test_return_step_past_deadline_is_forced() -> None:
    h = Harness(borrow=Borrow.ALWAYS)
    h.settle()
    h.send(ev.TrainingBegin(step=2))
    h.pending.clear()  # the overlap workers never answer their deactivation
    h.send(cmd.Tick(), dt=h.ctl.config.timeouts[StepOp.DEACTIVATE] + 1)
    forced = [c for c in h.sent if isinstance(c, cmd.DeactivateWorker) and c.force]
    assert len(forced) == 2
    h.answer()  # the reclaim
    assert cmd.TrainingMayProceed(step=2) in h.sent


def test_forced_switch_when_last_decode_worker_is_reclaimed() -> None:
    h = Harness(pd=PD.DISAGGREGATED)
    h.settle()
    h.send(ev.GpusAdded(gpus=tuple(range(8, 16))))
    h.settle()
    assert h.table.role_counts().mode is Mode.DISAGGREGATED
    decode = [w for w in h.table.routable() if w.role is Role.DECODE]
    gpus = tuple(g for w in decode for g in w.gpus if g >= 8)
    h.send(ev.GpusReclaimed(gpus=gpus))
    h.settle()
    after = h.table.role_counts()
    assert after.mode is Mode.COLOCATED or (after.N_P >= 1 and after.N_D >= 1)


@pytest.mark.parametrize(
    "bad",
    [
        ev.GpusReclaimed(gpus=(12,)),  # not present
        ev.GpusAdded(gpus=(40,)),  # unknown
        ev.GpusReclaimed(gpus=(5,)),  # reserved
        ev.TrainingFinished(step=1, weights_version=1),  # without a begin
    ],
)
def test_bad_events_change_nothing(bad: Any) -> None:
    h = Harness()
    h.settle()
    before = h.s
    with pytest.raises(InvalidEvent):
        h.ctl.handle(h.s, bad, h.now)
    assert h.s is before and replay(h.records) == before.table


def test_training_begin_twice_is_rejected() -> None:
    h = Harness()
    h.settle()
    h.send(ev.TrainingBegin(step=1))
    with pytest.raises(InvalidEvent):
        h.ctl.handle(h.s, ev.TrainingBegin(step=2), h.now)


def test_recovery_from_any_prefix_of_the_log_converges() -> None:
    """Crash after any record (a torn batch included): replay, recover, answer what is re-sent;
    the table ends valid, no plan hangs, and every borrowed GPU is back once training begins."""
    h = Harness(borrow=Borrow.ALWAYS)
    h.settle()
    h.send(ev.GpusAdded(gpus=(8, 9, 10, 11)))
    h.answer(lambda c: isinstance(c, cmd.StartWorker) and 8 in c.gpus)
    h.send(ev.TrainingBegin(step=1))
    h.settle()
    h.send(ev.TrainingFinished(step=1, weights_version=1))
    h.answer()
    h.send(ev.GpusReclaimed(gpus=(10,)))
    h.settle()
    assert len(h.records) > 40
    for cut in range(1, len(h.records) + 1):
        r = Harness(borrow=Borrow.ALWAYS, records=h.records[:cut])
        r.settle()
        if r.table.phase is TrainingPhase.IDLE:
            r.send(ev.TrainingBegin(step=r.table.training_step + 1))
        r.settle()
        assert r.table.workers[0].activity is Activity.ACTIVE, cut
        assert any(isinstance(c, cmd.TrainingMayProceed) for c in r.sent), cut
        assert r.table.plan is None and not r.table.reclaiming_gpus, cut


def test_telemetry_is_logged_and_moves_the_profile() -> None:
    h = Harness()
    h.settle()
    p0 = h.s.profile
    t = ev.Telemetry(
        step=1,
        batch=64,
        S=10,
        delta_L=1000,
        r=300,
        theta=1.0,
        A=p0.A * 2,
        b=p0.b,
        t_prefill=p0.t_prefill,
        T_env=30,
        makespan_s=100,
    )
    h.send(t)
    assert h.records[-len(h.records) + h.records.index(t)] == t
    assert h.s.profile.A > p0.A and h.s.profile.S < p0.S


def test_apply_all_refuses_records_out_of_order() -> None:
    h = Harness()
    h.settle()
    with pytest.raises(InvariantViolation):
        apply_all(replay(h.records), [ev.PlanCommit(plan=99)])


def test_training_begin_leaves_a_dedicated_expansion_alone_when_nothing_is_lent() -> None:
    """Nothing borrowed: training proceeds at once and the inter-scale expansion in flight is
    not cancelled (it used to be, so an expansion longer than a rollout step never finished)."""
    h = Harness(borrow=Borrow.NEVER)
    h.settle()
    h.send(ev.GpusAdded(gpus=(8, 9, 10, 11)))
    assert sum(isinstance(c, cmd.StartWorker) for c in h.pending) == 2
    h.send(ev.TrainingBegin(step=1))
    assert cmd.TrainingMayProceed(step=1) in h.sent
    assert not any(getattr(c, "cancel", False) for c in h.pending)
    h.settle()
    assert not any(isinstance(r, ev.PlanAbort) for r in h.records)
    assert len(h.table.routable()) == 4


def test_training_begin_returns_beside_an_expansion_on_other_gpus() -> None:
    """Borrowed GPUs come back without cancelling a cold start on dedicated GPUs: the return
    runs beside the expansion, training proceeds, and the expansion then commits."""
    h = Harness(borrow=Borrow.ALWAYS)
    h.settle()  # the overlap workers serve: the training GPUs are lent
    assert any(w.routable for w in h.table.rollout_workers(Zone.OVERLAP))
    h.send(ev.GpusAdded(gpus=(8, 9, 10, 11)))
    joiners = [c.worker for c in h.pending if isinstance(c, cmd.StartWorker)]
    assert len(joiners) == 2
    h.send(ev.TrainingBegin(step=1))
    assert not any(getattr(c, "cancel", False) for c in h.pending)
    assert cmd.TrainingMayProceed(step=1) not in h.sent
    cold = lambda c: isinstance(c, cmd.StartWorker)  # noqa: E731
    while cmd.TrainingMayProceed(step=1) not in h.sent and h.answer(lambda c: not cold(c), dt=0.1):
        pass
    assert cmd.TrainingMayProceed(step=1) in h.sent  # the joiners are still starting
    assert all(w.activity is Activity.INACTIVE for w in h.table.rollout_workers(Zone.OVERLAP))
    assert all(w.activity is Activity.ACTIVE for w in h.table.training_workers())
    h.settle()
    assert all(h.table.workers[j].routable for j in joiners)
    assert not any(isinstance(r, ev.PlanAbort) for r in h.records)


def test_training_begin_cancels_a_borrow_still_in_flight() -> None:
    h = Harness(borrow=Borrow.ALWAYS)
    h.settle()
    h.send(ev.TrainingBegin(step=1))
    h.settle()
    h.send(ev.TrainingFinished(step=1, weights_version=1))
    h.answer(lambda c: isinstance(c, cmd.LendTraining))  # activation still running
    h.send(ev.TrainingBegin(step=2))
    assert any(getattr(c, "cancel", False) for c in h.pending)
    h.settle()
    assert cmd.TrainingMayProceed(step=2) in h.sent


def test_a_cancelled_activation_releases_in_place_and_is_forced_only_past_its_grace() -> None:
    """Ending a retained overlap process on every cut-short borrow made the next borrow a cold
    start, longer than the window: it was cut short in turn, and ended again."""
    h = Harness(borrow=Borrow.ALWAYS)
    h.settle()
    h.send(ev.TrainingBegin(step=1))
    h.settle()
    h.send(ev.TrainingFinished(step=1, weights_version=1))
    h.answer(lambda c: isinstance(c, cmd.LendTraining))  # activation still running
    h.send(ev.TrainingBegin(step=2))
    cancels = [c for c in h.pending if getattr(c, "cancel", False)]
    assert cancels and all(isinstance(c, cmd.DeactivateWorker) and not c.force for c in cancels)
    h.pending = [c for c in h.pending if not getattr(c, "cancel", False)]  # never answered
    h.send(cmd.Tick(), dt=h.ctl.config.cancel_grace_s + 0.1)
    forced = [c for c in h.sent if isinstance(c, cmd.DeactivateWorker) and c.cancel and c.force]
    assert sorted(c.worker for c in forced) == sorted(c.worker for c in cancels)
    h.settle()
    assert cmd.TrainingMayProceed(step=2) in h.sent


def test_an_unanswered_cancel_of_a_finished_activation_is_forced_past_its_grace() -> None:
    """A borrow cut short after some activations finished: each is cancelled in place. When
    a cancel is never answered (its host died meanwhile), the controller must stop waiting at
    the grace as it does for unfinished ones, or the abort, and with it Training Begin's
    return, waits forever (seen in a 5-minute chaos run: training step 58 never proceeded)."""
    h = Harness(borrow=Borrow.ALWAYS)
    h.settle()
    h.send(ev.TrainingBegin(step=1))
    h.settle()
    h.send(ev.TrainingFinished(step=1, weights_version=1))
    h.answer(lambda c: isinstance(c, cmd.LendTraining))
    first = next(c for c in h.pending if isinstance(c, cmd.ActivateWorker))
    h.answer(lambda c: c is first)  # one activation done, the others still running
    assert first.step in h.table.plan.done
    h.send(ev.TrainingBegin(step=2))
    cancelled = {c.worker for c in h.pending if getattr(c, "cancel", False)}
    assert first.worker in cancelled
    h.pending = [c for c in h.pending if not getattr(c, "cancel", False)]  # never answered
    h.send(cmd.Tick(), dt=h.ctl.config.cancel_grace_s + 0.1)
    forced = {c.worker for c in h.sent if isinstance(c, cmd.DeactivateWorker) and c.force}
    assert forced == cancelled
    h.settle()
    assert cmd.TrainingMayProceed(step=2) in h.sent


def test_new_weights_reach_serving_workers_and_later_joiners() -> None:
    h = Harness(borrow=Borrow.NEVER)
    h.settle()
    h.sent.clear()
    h.send(ev.WeightsPublished(version=3, uri="store/v3"))
    synced = sorted(c.worker for c in h.sent if isinstance(c, cmd.SyncWeights) and c.version == 3)
    assert synced == sorted(w.id for w in h.table.routable())
    h.send(ev.GpusAdded(gpus=(8, 9)))
    start = [c for c in h.pending if isinstance(c, cmd.StartWorker)]
    assert start and all(c.weights_version == 3 for c in start)  # lazy: the newest at admission
    with pytest.raises(InvalidEvent, match="older"):
        h.ctl.handle(h.s, ev.WeightsPublished(version=2), h.now)


def test_reclaim_beside_an_expansion_leaves_its_joiner_initialising() -> None:
    """A reclaim that spares the joiners must not cancel their start: frequent changes would
    otherwise starve rollout of new workers (every expansion cancelled before it ends)."""
    h = Harness()
    h.settle()
    h.send(ev.GpusAdded(gpus=(8, 9, 10, 11)))
    h.settle()
    victim = next(w for w in h.table.routable() if 10 in w.gpus)
    h.send(ev.GpusAdded(gpus=(12, 13)))
    joiner = next(c for c in h.pending if isinstance(c, cmd.StartWorker))
    h.send(ev.GpusReclaimed(gpus=(10,)))
    assert victim.id not in {w.id for w in h.table.routable()}  # unroutable at once
    assert not any(getattr(c, "cancel", False) for c in h.sent)
    assert not any(isinstance(c, cmd.StopWorker) and c.worker == joiner.worker for c in h.sent)
    h.settle()
    assert not any(isinstance(r, ev.PlanAbort) for r in h.records)
    assert victim.id not in h.table.workers and not h.table.reclaiming_gpus
    assert joiner.worker in {w.id for w in h.table.routable()}


def test_eviction_past_its_deadline_is_forced() -> None:
    h = Harness()
    h.settle()
    h.send(ev.GpusAdded(gpus=(8, 9)))
    h.settle()
    victim = next(w for w in h.table.routable() if 8 in w.gpus)
    h.send(ev.GpusAdded(gpus=(10, 11)))
    h.send(ev.GpusReclaimed(gpus=(8,)))
    h.send(cmd.Tick(), dt=h.ctl.config.timeouts[StepOp.REMOVE] + 1)
    assert any(isinstance(c, cmd.StopWorker) and c.force and c.worker == victim.id for c in h.sent)
    assert victim.id not in h.table.workers and 8 not in h.table.reclaiming_gpus


def test_reclaim_during_borrowing_then_training_begin_returns_fast_and_removes_once() -> None:
    """Issue 21: a worker reclaimed while a borrow plan runs is evicted beside it; the return
    plan that follows names it too. Removal has one owner, training proceeds once the hand-off
    is done (not after the preemptible worker's 30 s stop deadline), and the old eviction
    deadline never removes the worker a second time (or a new worker in its reused slot)."""
    from pearl.core.policy import Borrow

    h = Harness(borrow=Borrow.ALWAYS)
    h.settle()
    h.send(ev.GpusAdded(gpus=(8, 9, 10, 11)))
    h.settle()
    h.send(ev.TrainingBegin(step=1))
    h.settle()
    h.send(ev.TrainingFinished(step=1, weights_version=1))
    h.send(ev.GpusReclaimed(gpus=(8, 9)))
    victim = next(w.id for w in h.table.workers.values() if 8 in w.gpus)
    assert victim in h.s.evicting
    slow = lambda c: isinstance(c, cmd.StopWorker) and c.worker == victim  # noqa: E731
    h.answer(lambda c: not slow(c))  # the borrow plan completes; the victim is still stopping
    h.send(ev.TrainingBegin(step=2), dt=0.1)
    began = h.now

    def proceeded() -> list[int]:
        return [c.step for c in h.sent if isinstance(c, cmd.TrainingMayProceed)]

    while proceeded() != [1, 2] and h.answer(lambda c: not slow(c), dt=0.1):
        pass
    assert proceeded() == [1, 2] and h.now - began < 3.2
    assert victim not in h.s.evicting  # the return plan owns the removal now
    h.send(cmd.Tick(), dt=31.0)  # the stop outlived its deadline: forced, removed once
    h.settle()
    assert victim not in h.table.workers and h.table.plan is None
    h.send(ev.GpusAdded(gpus=(8, 9)))
    h.settle()
    assert victim in h.table.workers  # its slot is reused by the new worker on GPUs 8-9
    h.send(cmd.Tick(), dt=40.0)  # no old claim on the slot removes the new worker
    h.settle()
    assert victim in h.table.workers and not h.s.evicting


def test_worker_lost_after_it_left_does_not_evict_the_next_worker_in_its_slot() -> None:
    h = Harness()
    h.settle()
    h.send(ev.GpusAdded(gpus=(8, 9)))
    h.settle()
    wid = next(w.id for w in h.table.workers.values() if 8 in w.gpus)
    h.send(ev.GpusReclaimed(gpus=(8, 9)))
    h.settle()
    h.send(cmd.WorkerDown(worker=wid, incarnation=0, reason="stopped"))
    assert wid not in h.table.workers
    h.send(cmd.WorkerLost(worker=wid, reason="gave up"))  # late: the worker is gone already
    assert wid not in h.s.lost
    h.send(ev.GpusAdded(gpus=(8, 9)))
    h.settle()
    assert any(8 in w.gpus for w in h.table.routable())


def _telemetry(h: Harness, step: int) -> ev.Telemetry:
    """A step summary that repeats the current profile (only the controller's measures move)."""
    p = h.s.profile
    return ev.Telemetry(
        step=step,
        batch=p.B,
        S=p.S,
        delta_L=p.delta_L,
        r=p.r,
        theta=p.theta,
        A=p.A,
        b=p.b,
        t_prefill=p.t_prefill,
        T_env=p.T_env,
        makespan_s=60.0,
    )


def test_a_borrow_cut_short_raises_T_toggle_until_the_gate_declines() -> None:
    """Issue 13: an activation aborted by Training Begin after t seconds is a censored
    observation (T_toggle >= t), and the gate weighs T_toggle against the idle window."""
    from pearl.core.policy import Borrow

    h = Harness(borrow=Borrow.GATED)
    h.settle()
    h.send(ev.TrainingBegin(step=1))
    h.settle()
    T0 = h.s.profile.T_toggle
    activate = lambda c: isinstance(c, cmd.ActivateWorker)  # noqa: E731
    step = 1
    verdicts = []
    for _ in range(3):  # 30 s windows; activation never finishes inside one
        h.send(ev.TrainingFinished(step=step, weights_version=step), dt=1.0)
        verdicts.append(h.s.last_gate.enabled)
        h.answer(lambda c: not activate(c), dt=1.0)  # the lend is quick; activation is not
        step += 1
        h.send(ev.TrainingBegin(step=step), dt=28.0)
        h.pending = [c for c in h.pending if not activate(c)]  # the slow activation never answers
        h.settle()
        if verdicts[-1]:  # the borrow was cut short by the trainer, and says so
            assert h.s.cycle is not None and h.s.cycle.aborted == ev.AbortCause.TRAINING_BEGIN
        assert [c.step for c in h.sent if isinstance(c, cmd.TrainingMayProceed)][-1] == step
        h.send(_telemetry(h, step))
    assert verdicts[0] is True and verdicts[-1] is False
    assert h.s.profile.T_toggle > T0 and h.s.profile.T_window == pytest.approx(30.0, abs=3.0)
    assert "window" in h.s.last_gate.reason
    aborts = sum(isinstance(r, ev.PlanAbort) for r in h.records)
    # Once declined, no borrow plan is started only to be aborted.
    h.send(ev.TrainingFinished(step=step, weights_version=step), dt=1.0)
    assert h.table.plan is None and not h.s.last_gate.enabled
    step += 1
    h.send(ev.TrainingBegin(step=step), dt=200.0)  # a long window: borrowing could pay again
    h.settle()
    h.send(_telemetry(h, step))
    high = h.s.profile.T_toggle
    h.send(ev.TrainingFinished(step=step, weights_version=step), dt=1.0)
    assert h.s.last_gate.enabled
    h.settle()  # this cycle completes: activation and hand-off take a few seconds
    step += 1
    h.send(ev.TrainingBegin(step=step), dt=30.0)
    h.settle()
    h.send(_telemetry(h, step))
    assert h.s.profile.T_toggle < high
    assert sum(isinstance(r, ev.PlanAbort) for r in h.records) == aborts


def test_a_borrow_cycle_reports_what_happened_and_nothing_else() -> None:
    """Issue 13 item 6: counts and times of each cycle — lent, activated, served, returned,
    aborted and why — and nothing reported that did not occur."""
    from pearl.core.policy import Borrow

    h = Harness(borrow=Borrow.ALWAYS)
    h.settle()
    h.send(ev.TrainingBegin(step=1))
    h.settle()
    first = h.s.cycle  # the window since pearld started, before any training step
    assert first.step == 0 and first.activated == 2 and first.returning == 2
    h.send(ev.TrainingFinished(step=1, weights_version=1), dt=1.0)
    h.settle()  # lend + activation, one simulated second per answer
    h.send(ev.TrainingBegin(step=2), dt=10.0)
    h.settle()
    c = h.s.cycle.to_json()
    assert c["gate"] == "approved" and c["lent"] == 1 and c["activated"] == 2
    assert c["activation_s"] > 0 and c["served_s"] == pytest.approx(10.0)
    assert c["returning"] == 2 and c["return_s"] > 0 and c["aborted"] is None
    assert c["window_s"] == pytest.approx(c["activation_s"] + c["served_s"])

    # Cut short: Training Begin arrives before activation completes.
    h.send(ev.TrainingFinished(step=2, weights_version=2), dt=1.0)
    h.answer(lambda c: isinstance(c, cmd.LendTraining))
    h.send(ev.TrainingBegin(step=3), dt=1.0)
    h.settle()
    c = h.s.cycle.to_json()
    assert c["aborted"] == "training-begin" and c["activated"] == 0 and c["served_s"] is None
    assert h.s.last_cycle.to_json()["activated"] == 2  # the previous cycle is kept beside it

    # Never borrowed: nothing lent, nothing returned.
    h2 = Harness(borrow=Borrow.NEVER)
    h2.settle()
    h2.send(ev.TrainingBegin(step=1))
    h2.settle()
    h2.send(ev.TrainingFinished(step=1, weights_version=1), dt=1.0)
    h2.settle()
    h2.send(ev.TrainingBegin(step=2), dt=5.0)
    c = h2.s.cycle.to_json()
    assert c["gate"] == "declined" and c["plan"] is None and c["lent"] == 0
    assert c["activated"] == 0 and c["returning"] == 0 and c["return_s"] == 0.0


def test_a_retained_worker_whose_activation_fails_is_not_reactivated_at_once() -> None:
    """Seen in a demo run: one overlap worker's activation failed 115 times in 18 s — each
    failure cancelled the borrow and the next plan activated it again. Its GPUs are now
    quarantined like a joiner's, and the retry waits out the back-off."""
    from pearl.core.policy import Borrow

    h = Harness(borrow=Borrow.ALWAYS)
    h.settle()
    h.send(ev.TrainingBegin(step=1))
    h.settle()
    h.send(ev.TrainingFinished(step=1, weights_version=1))
    h.settle()  # overlap workers exist and are retained from here on
    h.send(ev.TrainingBegin(step=2))
    h.settle()
    h.send(ev.TrainingFinished(step=2, weights_version=2))
    h.answer(lambda c: isinstance(c, cmd.LendTraining))
    victim = next(c.worker for c in h.pending if isinstance(c, cmd.ActivateWorker))
    attempts = 0
    for _ in range(20):
        chosen = [c for c in h.pending if isinstance(c, cmd.ActivateWorker) and c.worker == victim]
        attempts += len(chosen)
        h.answer(lambda c, chosen=chosen: c in chosen, ok=False, dt=0.1)
        h.answer(lambda c, chosen=chosen: c not in chosen, dt=0.1)
    assert attempts == 1
    h.send(cmd.Tick(), dt=31.0)  # the back-off is over: it may try again
    h.settle()
    assert any(w.id == victim and w.routable for w in h.table.workers.values())


def test_a_version_published_after_training_finished_named_it_reaches_serving_workers() -> None:
    h = Harness(borrow=Borrow.NEVER)
    h.settle()
    h.send(ev.TrainingBegin(step=1))
    h.settle()
    h.send(
        ev.TrainingFinished(step=1, weights_version=1)
    )  # names version 1 before its snapshot is stored
    h.sent.clear()
    h.send(ev.WeightsPublished(version=1, uri="store/v1"))
    synced = sorted(c.worker for c in h.sent if isinstance(c, cmd.SyncWeights) and c.version == 1)
    assert synced == sorted(w.id for w in h.table.routable())


def test_a_worker_that_failed_before_a_restart_serves_again_when_its_host_is_back() -> None:
    """Found by the chaos run: recovery forgot which workers had failed, so a worker whose host
    died just before pearld did stayed out of routing for good after its host came back."""
    h = Harness()
    h.settle()
    w = h.table.routable()[0]
    h.send(cmd.WorkerDown(worker=w.id, incarnation=w.incarnation, reason="host exited"))
    assert not h.table.workers[w.id].routable
    out = h.ctl.recover(replay(h.records), prior_profile(CFG), h.now)  # pearld restarts
    h.pending = []
    h._take(out)
    h.send(cmd.WorkerUp(worker=w.id, incarnation=w.incarnation))
    assert h.table.workers[w.id].routable


def test_a_controller_that_never_settles_says_so_instead_of_stopping_silently(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pearl.core import controller as ctl

    h = Harness()
    h.settle()
    # A bug that makes "a plan began" true without beginning one: the loop would spin forever.
    monkeypatch.setattr(ctl.Controller, "_begin_next_plan", lambda self, tx: True)
    with pytest.raises(InvariantViolation, match=f"within {ctl.MAX_ADVANCE_PASSES} passes"):
        h.send(ev.GpusAdded(gpus=(8, 9)))


def test_a_worker_lost_for_good_is_removed_and_its_gpus_quarantined() -> None:
    h = Harness()
    h.settle()
    h.send(ev.GpusAdded(gpus=(8, 9)))
    h.settle()
    wid = next(w.id for w in h.table.workers.values() if 8 in w.gpus)
    h.send(
        cmd.WorkerLost(worker=wid, reason="exited; gave up after 3 restarts")
    )  # the restart budget is spent
    h.settle()
    assert wid not in h.table.workers
    assert {8, 9} <= set(h.s.quarantine)
    assert not any(8 in w.gpus for w in h.table.workers.values())  # not re-planned onto them
    h.send(cmd.Tick(), dt=CFG.gate.toggle_cost_s + 60)  # the quarantine expires: used again
    h.settle()
    assert any(8 in w.gpus for w in h.table.routable())


@dataclasses.dataclass(frozen=True)
class WantsSplit(Policy):
    """The real policy, except that once ``want`` is set it asks for a 1P split of whatever
    it is given (as a decision engine that prefers disaggregation at that budget would)."""

    want: list[bool] = dataclasses.field(default_factory=lambda: [False])

    def decide(self, profile: Any, N: int, current: Any) -> Any:
        d = super().decide(profile, N, current)
        if not self.want[0] or N < 2:
            return d
        return dataclasses.replace(
            d, target=Target(mode=Mode.DISAGGREGATED, N_P=1, N_D=N - 1, N_C=0)
        )


def test_no_role_switch_while_training_gpus_are_lent() -> None:
    """A borrow window lasts seconds and ends in a mandatory return: the borrowed workers join
    in the dedicated pool's mode, no dedicated worker is re-roled for the window, and a switch
    the engine wants waits for the return (before, a switch begun in the window was cut short
    by Training Begin, keeping a partial topology)."""
    policy = WantsSplit(CFG.decision, borrow=Borrow.ALWAYS)
    h = Harness(borrow=Borrow.ALWAYS)
    h.ctl = Controller(policy)
    h.send(cmd.Tick())
    h.settle()
    assert {w.role for w in h.table.routable()} == {Role.COLOCATED}
    h.send(ev.TrainingBegin(step=1))
    h.settle()
    policy.want[0] = True
    window = len(h.sent)
    h.send(ev.TrainingFinished(step=1, weights_version=1))  # the window opens: borrow, no switch
    h.settle()
    overlap = [w for w in h.table.routable() if w.zone is Zone.OVERLAP]
    assert overlap and {w.role for w in h.table.routable()} == {Role.COLOCATED}
    # Activation loaded the newest version: no extra message to the borrowed workers.
    ids = {w.id for w in overlap}
    assert not [c for c in h.sent[window:] if isinstance(c, cmd.SyncWeights) and c.worker in ids]
    assert not any(isinstance(c, cmd.SetRole) for c in h.sent)
    h.send(ev.TrainingBegin(step=2))  # the return; then the switch the engine wants
    h.settle()
    assert cmd.TrainingMayProceed(step=2) in h.sent
    assert h.table.role_counts().mode is Mode.DISAGGREGATED
    assert not any(isinstance(r, ev.PlanAbort) for r in h.records)


def test_no_borrow_begins_in_a_window_the_pipeline_expects_to_close() -> None:
    """Seen in the demo (issue 13): windows that closed 13-35 ms after Training Finished had the
    gate's approval (R trajectories left, each worth borrowing for), and Training Begin cut the
    plans short before anything was lent. The pipeline's ETA for the next batch says so first."""
    import msgspec

    from pearl.core.policy import Borrow

    h = Harness(borrow=Borrow.GATED)
    h.settle()
    h.send(ev.TrainingBegin(step=1))
    h.settle()
    h.s = dataclasses.replace(h.s, profile=msgspec.structs.replace(h.s.profile, T_toggle=0.05))
    plans = sum(isinstance(r, ev.PlanBegin) for r in h.records)
    h.send(cmd.RolloutProgress(remaining=4, eta_s=0.06))  # 4 left, all due within 60 ms
    h.send(ev.TrainingFinished(step=1, weights_version=1), dt=0.02)
    g = h.s.last_gate
    assert not g.enabled and "expected complete in 0.04 s" in g.reason, g.reason
    assert g.window_left_s == pytest.approx(0.04)
    assert h.s.cycle.to_json()["window_left_s"] == pytest.approx(0.04)  # reported as it was
    assert h.table.plan is None and sum(isinstance(r, ev.PlanBegin) for r in h.records) == plans
    h.send(ev.TrainingBegin(step=2), dt=0.04)
    h.settle()
    assert not any(isinstance(r, ev.PlanAbort) for r in h.records)
    # A window with time left is borrowed for as before.
    h.send(cmd.RolloutProgress(remaining=4, eta_s=1.5))
    h.send(ev.TrainingFinished(step=2, weights_version=2), dt=0.2)
    assert h.s.last_gate.enabled, h.s.last_gate.reason
    assert h.s.last_gate.window_left_s == pytest.approx(1.3)


def test_a_window_on_a_ready_batch_is_not_measured_and_no_borrow_begins_at_a_hand_out() -> None:
    """Seen in the demo (issue 13): a window that opened on a complete batch lasted 5 ms and set
    T_window, so the gate then declined a 5.7 s window; and the next batch's hand-out (R back to
    a whole batch: it counts the batch after) approved a borrow at the very end of a window,
    which Training Begin aborted before anything was lent."""
    import msgspec

    from pearl.core.policy import Borrow

    h = Harness(borrow=Borrow.GATED)
    h.settle()
    h.send(ev.TrainingBegin(step=1))
    h.settle()
    p = msgspec.structs.replace(h.s.profile, T_toggle=0.05)
    h.s = dataclasses.replace(h.s, profile=p)
    h.send(cmd.RolloutProgress(remaining=0))  # the next batch is complete: nothing to win
    h.send(ev.TrainingFinished(step=1, weights_version=1), dt=1.0)
    assert not h.s.last_gate.enabled and h.table.plan is None
    h.send(ev.TrainingBegin(step=2), dt=0.005)
    h.send(_telemetry(h, 2))
    assert h.s.profile.T_window == 0.0  # not measured: it says nothing of a borrow's window
    h.send(cmd.RolloutProgress(remaining=h.s.profile.B))
    h.send(ev.TrainingFinished(step=2, weights_version=2), dt=2.0)
    assert h.s.last_gate.enabled, h.s.last_gate.reason
    h.settle()
    h.send(ev.TrainingBegin(step=3), dt=5.7)
    h.settle()
    h.send(_telemetry(h, 3))
    assert h.s.profile.T_window == pytest.approx(5.7 + 2 * 1.0, abs=3.0)  # measured
    p = msgspec.structs.replace(h.s.profile, T_toggle=0.05)  # that cycle's hand-off took 2 s
    h.s = dataclasses.replace(h.s, profile=p)
    plans = sum(isinstance(r, ev.PlanBegin) for r in h.records)
    h.send(
        cmd.RolloutProgress(remaining=0)
    )  # complete again: the gate declines at Training Finished
    h.send(ev.TrainingFinished(step=3, weights_version=3), dt=2.0)
    assert not h.s.last_gate.enabled and h.table.plan is None
    h.send(
        cmd.RolloutProgress(remaining=4), dt=0.1
    )  # ready groups dropped as stale: more work, not the end
    assert h.s.last_gate.enabled, h.s.last_gate.reason
    h.settle()
    h.send(ev.TrainingBegin(step=4), dt=1.0)
    h.settle()
    h.send(_telemetry(h, 4))
    plans = sum(isinstance(r, ev.PlanBegin) for r in h.records)
    h.send(cmd.RolloutProgress(remaining=0))
    h.send(ev.TrainingFinished(step=4, weights_version=4), dt=2.0)
    h.send(
        cmd.RolloutProgress(remaining=h.s.profile.B, handed_out=True), dt=0.1
    )  # R counts the next
    assert not h.s.last_gate.enabled and "handed out" in h.s.last_gate.reason
    h.send(_telemetry(h, 5))
    assert not h.s.last_gate.enabled and "handed out" in h.s.last_gate.reason
    assert h.table.plan is None and sum(isinstance(r, ev.PlanBegin) for r in h.records) == plans
    # The other order: the telemetry of the hand-out first.
    h.send(ev.TrainingBegin(step=5), dt=0.1)
    h.settle()
    h.send(cmd.RolloutProgress(remaining=0))
    h.send(ev.TrainingFinished(step=5, weights_version=5), dt=2.0)
    h.send(_telemetry(h, 6), dt=0.5)
    h.send(cmd.RolloutProgress(remaining=h.s.profile.B))
    assert not h.s.last_gate.enabled and "handed out" in h.s.last_gate.reason
    assert h.table.plan is None and sum(isinstance(r, ev.PlanBegin) for r in h.records) == plans


def test_stopping_a_host_the_log_does_not_know_fails_no_worker_of_the_table() -> None:
    """Found by the kill -9 soak: a host of an incarnation the log does not know (it says it is
    up after the table moved on) is stopped, and its worker-down named no incarnation, so it was
    logged as the failure of the table's worker of the same id, which was never replaced."""
    h = Harness()
    h.settle()
    w = h.table.routable()[0]
    stale = w.incarnation + 100
    h.send(cmd.WorkerUp(worker=w.id, incarnation=stale))
    (stop,) = [c for c in h.sent if isinstance(c, cmd.StopWorker) and c.worker == w.id]
    assert stop.force and stop.incarnation == stale
    failed = sum(isinstance(r, ev.WorkerFailed) for r in h.records)
    h.send(
        cmd.WorkerDown(worker=w.id, incarnation=stop.incarnation, reason="stopped")
    )  # what the executor reports
    assert sum(isinstance(r, ev.WorkerFailed) for r in h.records) == failed
    assert h.table.workers[w.id].routable
