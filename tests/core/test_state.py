"""The unified table's invariants, one rule at a time: rejected updates change nothing."""

from __future__ import annotations

import copy
import dataclasses
import typing
from types import MappingProxyType
from typing import Any

import msgspec
import pytest

from pearl.core import events as ev
from pearl.core import fold
from pearl.core.errors import InvalidEvent, InvariantViolation
from pearl.core.fold import apply, apply_all, apply_to, replay
from pearl.core.state import (
    Activity,
    ClusterState,
    Mode,
    PlanProgress,
    Role,
    Step,
    StepOp,
    TableSnapshot,
    Target,
    TrainingPhase,
    Worker,
    Zone,
    validate,
)

TRAINING, RESERVED, PREEMPTIBLE = (0, 1), (2, 3, 4, 5), (6, 7, 8, 9)
INIT = ev.ClusterInit(
    tp=1, training_gpus=TRAINING, reserved_gpus=RESERVED, preemptible_gpus=PREEMPTIBLE
)
A, I, T = Activity.ACTIVE, Activity.INACTIVE, Activity.TRANSITIONING


def table(*records: Any) -> ClusterState:
    return replay([INIT, *records])


def rejects(state: ClusterState, record: Any, match: str, kind: type = InvariantViolation) -> None:
    """``record`` is refused and neither the state nor a builder holding it changes."""
    b = state.thaw()
    before = {k: copy.copy(v) for k, v in vars(b).items()}
    with pytest.raises(kind, match=match):
        apply_to(b, record)
    assert {k: copy.copy(v) for k, v in vars(b).items()} == before
    with pytest.raises(kind, match=match):
        apply(state, record)
    assert b.freeze() == state


def dedicated(wid: int, gpu: int, role: Role = Role.DECODE) -> list[Any]:
    return [
        ev.WorkerAdded(worker=wid, gpus=(gpu,), role=role, zone=Zone.DEDICATED),
        ev.ActivityChanged(worker=wid, activity=A),
    ]


LENT = [
    ev.ActivityChanged(worker=0, activity=I),
    ev.WorkerAdded(worker=5, gpus=(0,), role=Role.DECODE, zone=Zone.OVERLAP),
    ev.ActivityChanged(worker=5, activity=A),
]


def test_cluster_init_sets_up_the_training_worker() -> None:
    s = table()
    assert s.seq == 1 and s.tp == 1 and s.phase is TrainingPhase.IDLE
    (w,) = s.workers.values()
    assert (w.id, w.gpus, w.role, w.activity, w.zone) == (
        0,
        TRAINING,
        Role.TRAINING,
        A,
        Zone.OVERLAP,
    )
    validate(s)


def test_cluster_init_is_checked() -> None:
    rejects(table(), INIT, "already initialised")
    rejects(
        ClusterState(),
        ev.ClusterInit(tp=0, training_gpus=(), reserved_gpus=(), preemptible_gpus=()),
        "must be >= 1",
    )
    rejects(
        ClusterState(),
        ev.ClusterInit(tp=1, training_gpus=(0, 1), reserved_gpus=(1, 2), preemptible_gpus=()),
        r"\[1\] are both training",
    )
    rejects(ClusterState(), ev.GpusAdded(gpus=(6,)), "not initialised")


def test_seq_must_follow_the_last_record() -> None:
    s = table()
    with pytest.raises(InvariantViolation, match="sequence 3 does not follow 1"):
        apply(s, ev.GpusAdded(gpus=(6,)), seq=3)
    assert apply(s, ev.GpusAdded(gpus=(6,)), seq=2).seq == 2
    with pytest.raises(InvariantViolation, match="does not follow"):
        apply_all(ClusterState(), [INIT, ev.GpusAdded(gpus=(6,))], first_seq=2)


def test_no_gpu_is_bound_to_two_rollout_workers() -> None:
    s = table(*dedicated(1, 2))
    rejects(
        s,
        ev.WorkerAdded(worker=2, gpus=(2,), role=Role.PREFILL, zone=Zone.DEDICATED),
        "already bound to rollout",
    )
    rejects(
        s,
        ev.WorkerAdded(worker=1, gpus=(3,), role=Role.PREFILL, zone=Zone.DEDICATED),
        "slot 1 is taken",
    )
    rejects(
        s,
        ev.WorkerAdded(worker=2, gpus=(6,), role=Role.PREFILL, zone=Zone.DEDICATED),
        "not available",
    )
    rejects(
        s,
        ev.WorkerAdded(worker=2, gpus=(3, 4), role=Role.PREFILL, zone=Zone.DEDICATED),
        "needs 1 distinct GPUs",
    )
    rejects(
        s,
        ev.WorkerAdded(worker=2, gpus=(3,), role=Role.TRAINING, zone=Zone.DEDICATED),
        "fixed at cluster-init",
    )
    s2 = apply(s, ev.WorkerAdded(worker=2, gpus=(3,), role=Role.PREFILL, zone=Zone.DEDICATED))
    validate(s2)
    bad = dataclasses.replace(
        s2, workers={**s2.workers, 3: msgspec.structs.replace(s2.workers[2], id=3)}
    )
    with pytest.raises(InvariantViolation, match="GPU 3 is bound to rollout workers"):
        validate(bad)


def test_overlap_worker_is_active_only_while_training_lends_its_gpus() -> None:
    s = table()
    rejects(
        s,
        ev.WorkerAdded(worker=5, gpus=(0,), role=Role.DECODE, zone=Zone.OVERLAP),
        "still owns; lend it first",
    )
    s = table(*LENT)
    assert s.workers[5].activity is A and s.workers[0].activity is I
    validate(s)
    # the trainer cannot take the GPUs back while the overlap worker holds them
    rejects(s, ev.ActivityChanged(worker=0, activity=A), "still hold them")
    # training-begin stops routing to overlap workers at once; they cannot come back
    s = apply(s, ev.TrainingBegin(step=1))
    assert s.phase is TrainingPhase.TRAINING and s.workers[5].activity is T
    rejects(s, ev.ActivityChanged(worker=5, activity=A), "while training needs its GPUs")
    rejects(s, ev.TrainingFinished(step=1), "still being returned")
    s = apply_all(
        s, [ev.ActivityChanged(worker=5, activity=I), ev.ActivityChanged(worker=0, activity=A)]
    )
    s = apply(s, ev.TrainingFinished(step=1, weights_version=2))
    assert s.phase is TrainingPhase.IDLE and s.weights_version == 2
    validate(s)


def test_training_phase_rules() -> None:
    s = table(ev.TrainingBegin(step=1))
    rejects(state=s, record=ev.TrainingBegin(step=2), match="still running", kind=InvalidEvent)
    rejects(
        state=s, record=ev.TrainingFinished(step=2), match="step 1 is running", kind=InvalidEvent
    )
    rejects(
        state=table(),
        record=ev.TrainingFinished(step=0),
        match="without a training-begin",
        kind=InvalidEvent,
    )
    s = apply(s, ev.TrainingFinished(step=1, weights_version=3))
    rejects(state=s, record=ev.TrainingBegin(step=0), match="already ran", kind=InvalidEvent)
    rejects(
        state=s, record=ev.TrainingBegin(step=1), match="next step is 2", kind=InvalidEvent
    )  # a re-sent step
    rejects(
        state=s,
        record=ev.WeightsPublished(version=2),
        match="older than the current 3",
        kind=InvalidEvent,
    )


def test_reclaimed_gpus_stop_routing_and_return_with_their_worker() -> None:
    s = table(ev.GpusAdded(gpus=(6, 7)), *dedicated(1, 6), *dedicated(2, 2))
    rejects(state=s, record=ev.GpusAdded(gpus=(6,)), match="already present", kind=InvalidEvent)
    rejects(
        state=s, record=ev.GpusAdded(gpus=(5,)), match="not a preemptible GPU", kind=InvalidEvent
    )
    rejects(
        state=s,
        record=ev.GpusReclaimed(gpus=(2,)),
        match="reserved, not preemptible",
        kind=InvalidEvent,
    )
    rejects(state=s, record=ev.GpusReclaimed(gpus=(8,)), match="not present", kind=InvalidEvent)
    rejects(
        state=s, record=ev.GpusReclaimed(gpus=(7, 7)), match="names a GPU twice", kind=InvalidEvent
    )
    s = apply(s, ev.GpusReclaimed(gpus=(6, 7)))
    assert s.workers[1].activity is T and s.reclaiming_gpus == {6} and s.present_gpus == set()
    rejects(s, ev.ActivityChanged(worker=1, activity=A), r"GPUs \[6\] were reclaimed")
    rejects(
        s,
        ev.WorkerAdded(worker=3, gpus=(7,), role=Role.DECODE, zone=Zone.DEDICATED),
        "not available",
    )
    s = apply(s, ev.WorkerRemoved(worker=1))
    assert 1 not in s.workers and s.reclaiming_gpus == set()
    validate(s)
    s = apply(s, ev.GpusAdded(gpus=(6,)))  # the reclaim has finished: it may come back
    assert s.present_gpus == {6}
    rejects(
        state=s, record=ev.GpusAdded(gpus=(6,)), match="GPU 6 is already present", kind=InvalidEvent
    )


def test_a_gpu_granted_again_while_its_old_worker_leaves_is_a_fact() -> None:
    """Reclaimed and re-granted faster than a worker stops: the grant is logged, the GPU waits
    (regranted, no new worker on it) and is present the moment its old worker is gone."""
    s = apply(table(ev.GpusAdded(gpus=(6, 7)), *dedicated(1, 6)), ev.GpusReclaimed(gpus=(6, 7)))
    s = apply(s, ev.GpusAdded(gpus=(6, 7)))  # 7 was free: present now; 6 waits for worker 1
    assert (s.present_gpus, s.reclaiming_gpus, s.regranted_gpus) == ({7}, {6}, {6})
    validate(s)
    rejects(
        state=s, record=ev.GpusAdded(gpus=(6,)), match="GPU 6 is already present", kind=InvalidEvent
    )
    rejects(
        s,
        ev.WorkerAdded(worker=3, gpus=(6,), role=Role.DECODE, zone=Zone.DEDICATED),
        "not available",
    )
    rejects(s, ev.ActivityChanged(worker=1, activity=A), r"GPUs \[6\] were reclaimed")
    left = apply(s, ev.WorkerRemoved(worker=1))
    assert (left.present_gpus, left.reclaiming_gpus, left.regranted_gpus) == ({6, 7}, set(), set())
    validate(left)
    # Reclaimed again before worker 1 left: the second grant is over, the first reclaim goes on.
    again = apply(s, ev.GpusReclaimed(gpus=(6,)))
    assert (again.reclaiming_gpus, again.regranted_gpus) == ({6}, set())
    assert apply(again, ev.WorkerRemoved(worker=1)).present_gpus == {7}
    # A notice for it is a fact as well: it comes in leaving, and no worker starts on it.
    noticed = apply(s, ev.GpusReclaiming(gpus=(6,), deadline=1e12))
    validate(noticed)
    gone = apply(noticed, ev.WorkerRemoved(worker=1))
    assert 6 in gone.present_gpus and 6 in gone.leaving_gpus
    validate(gone)


def test_active_workers_must_drain_before_removal_or_role_change() -> None:
    s = table(*dedicated(1, 2))
    rejects(s, ev.WorkerRemoved(worker=1), "stop routing to it")
    rejects(s, ev.RoleChanged(worker=1, role=Role.PREFILL), "drain it before")
    rejects(s, ev.WorkerRemoved(worker=0), "training workers cannot be removed")
    rejects(s, ev.RoleChanged(worker=0, role=Role.DECODE), "fixed at cluster-init")
    rejects(s, ev.ActivityChanged(worker=9, activity=A), "no worker in slot 9")
    s = apply_all(
        s, [ev.ActivityChanged(worker=1, activity=T), ev.RoleChanged(worker=1, role=Role.PREFILL)]
    )
    assert s.workers[1].role is Role.PREFILL
    assert s.workers[1].incarnation == 2  # bound for life: role changes keep the incarnation


def test_worker_failed_stops_routing() -> None:
    s = apply(table(*dedicated(1, 2)), ev.WorkerFailed(worker=1, reason="gone"))
    assert s.workers[1].activity is T and s.routable() == []
    rejects(s, ev.WorkerFailed(worker=4, reason="?"), "unknown worker 4")


def test_plans_are_transactions() -> None:
    target = Target(mode=Mode.COLOCATED, N_P=0, N_D=0, N_C=1)
    steps = (Step(op=StepOp.ADD, worker=1, role=Role.COLOCATED, gpus=(2,), zone=Zone.DEDICATED),)
    s = table(ev.PlanBegin(plan=1, cause="grow", target=target, steps=steps))
    assert s.plan is not None and not s.plan.complete
    rejects(s, ev.PlanBegin(plan=2, cause="again", target=target, steps=()), "still in flight")
    rejects(s, ev.PlanCommit(plan=1), r"steps \[0\] are not done")
    rejects(s, ev.StepDone(plan=1, step=1), "has no step 1")
    rejects(s, ev.StepDone(plan=2, step=0), "not in flight")
    s = apply(s, ev.StepDone(plan=1, step=0))
    rejects(s, ev.StepDone(plan=1, step=0), "already done")
    s = apply(s, ev.PlanCommit(plan=1))
    assert s.plan is None and s.last_plan == 1
    rejects(s, ev.PlanBegin(plan=1, cause="old id", target=target, steps=()), "must increase")
    rejects(
        s,
        ev.PlanBegin(plan=2, cause="x", target=target, steps=(Step(op=StepOp.REMOVE, worker=7),)),
        "unknown worker 7",
    )
    rejects(
        s,
        ev.PlanBegin(plan=2, cause="x", target=target, steps=(Step(op=StepOp.ADD, worker=0),)),
        "slot is taken",
    )
    s = apply_all(
        s,
        [
            ev.PlanBegin(plan=2, cause="x", target=target, steps=()),
            ev.PlanAbort(plan=2, reason="changed mind"),
        ],
    )
    assert s.plan is None and s.last_plan == 2


def test_telemetry_changes_only_the_seq() -> None:
    s = table()
    t = apply(
        s,
        ev.Telemetry(
            step=0,
            batch=1,
            S=1.0,
            delta_L=1.0,
            r=1.0,
            theta=0.0,
            A=0.0,
            b=0.0,
            t_prefill=0.0,
            T_env=0.0,
            makespan_s=1.0,
        ),
    )
    assert dataclasses.replace(t, seq=s.seq) == s


def test_json_view_lists_workers_first() -> None:
    j = table(*LENT).to_json()
    assert list(j)[:2] == ["seq", "workers"]
    assert j["workers"][1] == {
        "id": 5,
        "gpus": [0],
        "role": "decode",
        "activity": "active",
        "zone": "overlap",
        "incarnation": 2,
    }
    assert (j["mode"], j["N_D"], j["phase"]) == ("disaggregated", 1, "idle")


def test_every_record_kind_has_one_fold_rule() -> None:
    assert fold.rule_kinds() == set(typing.get_args(ev.Record))


def test_the_builder_and_the_snapshot_keep_every_field_and_copy_what_changes() -> None:
    """The builder's copy and TableSnapshot's are derived from the fields: none is lost."""
    w = Worker(id=3, gpus=(4,), role=Role.DECODE, activity=T, zone=Zone.DEDICATED, incarnation=2)
    plan = PlanProgress(
        plan=5,
        cause="rebalance",
        target=Target(mode=Mode.DISAGGREGATED, N_P=0, N_D=1, N_C=0),
        steps=(Step(op=StepOp.REMOVE, worker=3),),
    )
    t = ClusterState(
        seq=7,
        tp=1,
        training_gpus=frozenset(TRAINING),
        reserved_gpus=frozenset(RESERVED),
        preemptible_gpus=frozenset(PREEMPTIBLE),
        present_gpus=frozenset({6, 7}),
        reclaiming_gpus=frozenset({8}),
        regranted_gpus=frozenset({8}),
        workers=MappingProxyType({3: w}),
        leaving_gpus=MappingProxyType({7: 2.5, 6: 1.5}),
        phase=TrainingPhase.TRAINING,
        training_step=3,
        weights_version=4,
        plan=plan,
        last_plan=5,
        next_incarnation=9,
    )
    snap = TableSnapshot.of(t)
    assert snap.leaving_gpus == ((6, 1.5), (7, 2.5)) and snap.present_gpus == (6, 7)
    assert (
        snap.state() == t
        and msgspec.msgpack.decode(msgspec.msgpack.encode(snap), type=TableSnapshot) == snap
    )
    b = t.thaw()
    assert b.freeze() == t
    b.present_gpus.add(9)
    b.leaving_gpus[9] = 3.0
    del b.workers[3]
    frozen = b.freeze()
    b.present_gpus.discard(6)
    b.leaving_gpus.clear()
    assert t.present_gpus == {6, 7} and 9 not in t.leaving_gpus and 3 in t.workers
    assert frozen.present_gpus == {6, 7, 9} and 9 in frozen.leaving_gpus and not frozen.workers
