"""The minimal-change planner against brute force, and executing its plans through the table."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pearl.core import events as ev
from pearl.core.errors import InfeasibleConfiguration
from pearl.core.fold import apply, apply_all, replay
from pearl.core.plan import STAGE, membership, min_changes, plan
from pearl.core.state import (
    ROLLOUT_ROLES,
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
from pearl.core.transition import commit_records, done_records, start_records


@st.composite
def tables(draw: st.DrawFn) -> ClusterState:
    """Random valid tables: dedicated workers with random roles, some reclaimed GPUs,
    optionally lent training GPUs with overlap workers."""
    tp = draw(st.sampled_from([1, 2]))
    n_train = draw(st.integers(0, 3)) * tp
    reserved = tuple(range(n_train, n_train + 2 * tp))
    preempt = tuple(range(reserved[-1] + 1, reserved[-1] + 1 + 4 * tp))
    recs: list = [
        ev.ClusterInit(
            tp=tp,
            training_gpus=tuple(range(n_train)),
            reserved_gpus=reserved,
            preemptible_gpus=preempt,
        )
    ]
    present = draw(st.lists(st.sampled_from(preempt), unique=True, max_size=len(preempt)))
    if present:
        recs.append(ev.GpusAdded(gpus=tuple(present)))
    dedicated = sorted(reserved + tuple(present))
    groups = [tuple(dedicated[i : i + tp]) for i in range(0, len(dedicated) - tp + 1, tp)]
    used = draw(st.lists(st.booleans(), min_size=len(groups), max_size=len(groups)))
    slot = 1
    for g, use in zip(groups, used, strict=True):
        if use:
            role = draw(st.sampled_from(ROLLOUT_ROLES))
            recs += [
                ev.WorkerAdded(worker=slot, gpus=g, role=role, zone=Zone.DEDICATED),
                ev.ActivityChanged(worker=slot, activity=Activity.ACTIVE),
            ]
            slot += 1
    s = replay(recs)
    if n_train and draw(st.booleans()):  # lend the training GPUs to some overlap workers
        s = apply(s, ev.ActivityChanged(worker=0, activity=Activity.INACTIVE))
        tgroups = [tuple(range(i, i + tp)) for i in range(0, n_train, tp)]
        for g in tgroups:
            if draw(st.booleans()):
                role = draw(st.sampled_from(ROLLOUT_ROLES))
                act = draw(st.sampled_from([Activity.ACTIVE, Activity.INACTIVE]))
                s = apply_all(
                    s,
                    [
                        ev.WorkerAdded(worker=slot, gpus=g, role=role, zone=Zone.OVERLAP),
                        ev.ActivityChanged(worker=slot, activity=act),
                    ],
                )
                slot += 1
    reclaim = [g for g in present if draw(st.booleans())]
    if reclaim:
        s = apply(s, ev.GpusReclaimed(gpus=tuple(reclaim)))
    return s


def targets(n: int) -> list[Target]:
    out = [Target(mode=Mode.COLOCATED, N_P=0, N_D=0, N_C=n)]
    out += [Target(mode=Mode.DISAGGREGATED, N_P=p, N_D=n - p, N_C=0) for p in range(1, n)]
    return out


def brute_force_role_changes(survivor_roles: list[Role], n_joiners: int, target: Target) -> int:
    """Min role changes over every assignment of the target roles to W' = survivors + joiners."""
    pool = [r for r in ROLLOUT_ROLES for _ in range(target.count(r))]
    best = len(survivor_roles)
    for perm in set(itertools.permutations(pool)):
        best = min(best, sum(1 for a, b in zip(survivor_roles, perm, strict=False) if a is not b))
    assert len(pool) == len(survivor_roles) + n_joiners
    return best


def execute(s: ClusterState, p, plan_id: int = 1) -> ClusterState:
    """Run a plan stage by stage through the records executors would cause."""
    s = apply(s, ev.PlanBegin(plan=plan_id, cause="test", target=p.target, steps=p.steps))
    for stage in sorted({STAGE[x.op] for x in p.steps}):
        ks = [k for k, x in enumerate(p.steps) if STAGE[x.op] == stage]
        for k in ks:
            s = apply_all(s, start_records(s, p.steps[k]))
        for k in ks:
            s = apply_all(s, done_records(s=s, plan=plan_id, k=k, step=p.steps[k]))
    return apply_all(s, commit_records(s))


@settings(max_examples=300, deadline=None)
@given(tables(), st.booleans(), st.data())
def test_plan_is_minimal_and_executes(s: ClusterState, borrow: bool, data: st.DataObject) -> None:
    m = membership(s, borrow)
    if m.N == 0:
        return
    target = data.draw(st.sampled_from(targets(m.N)))
    p = plan(s, target, m)

    # Eq. 5-6 and the brute-force optimum agree with the plan.
    D_worker, D_role = min_changes(s, target, m)
    assert (p.D_worker, p.D_role) == (D_worker, D_role)
    n_joiners = len(m.reactivate) + len(m.new_groups)
    assert p.D_role == brute_force_role_changes([w.role for w in m.survivors], n_joiners, target)
    before = {w.id for w in s.rollout_workers() if w.activity is not Activity.INACTIVE}
    after_ids = {w.id for w in m.survivors} | set(p.W_add)
    assert p.D_worker == len(after_ids - before) + len(before - after_ids)

    # Executing it yields a valid table with exactly the target active, survivors untouched.
    out = execute(s, p)
    validate(out)
    assert out.plan is None
    counts = out.role_counts()
    assert (counts.N_P, counts.N_D, counts.N_C) == (target.N_P, target.N_D, target.N_C)
    for w in m.survivors:
        assert out.workers[w.id].gpus == w.gpus
    assert {w.id for w in out.routable()} == after_ids
    new_slots = [x.worker for x in p.steps if x.op is StepOp.ADD]
    free = sorted(set(range(len(s.workers) + len(new_slots) + 1)) - set(s.workers))
    assert new_slots == free[: len(new_slots)]  # new workers reuse the lowest empty slots


def test_reclaim_removes_worker_and_keeps_others() -> None:
    s = replay(
        [
            ev.ClusterInit(
                tp=2, training_gpus=(), reserved_gpus=(0, 1), preemptible_gpus=(2, 3, 4, 5)
            ),
            ev.GpusAdded(gpus=(2, 3, 4, 5)),
            *[
                r
                for wid, g, role in (
                    (1, (0, 1), Role.PREFILL),
                    (2, (2, 3), Role.DECODE),
                    (3, (4, 5), Role.DECODE),
                )
                for r in (
                    ev.WorkerAdded(worker=wid, gpus=g, role=role, zone=Zone.DEDICATED),
                    ev.ActivityChanged(worker=wid, activity=Activity.ACTIVE),
                )
            ],
            ev.GpusReclaimed(gpus=(4,)),
        ]
    )
    assert s.workers[3].activity is Activity.TRANSITIONING  # stops routing at once
    m = membership(s, borrow=False)
    assert [w.id for w in m.leave] == [3] and m.N == 2
    p = plan(s, Target(mode=Mode.DISAGGREGATED, N_P=1, N_D=1, N_C=0), m)
    assert p.W_remove == (3,) and p.rho == () and p.D_worker == 1
    out = execute(s, p)
    assert 3 not in out.workers and out.reclaiming_gpus == frozenset() and 4 not in out.present_gpus
    assert out.workers[1].role is Role.PREFILL and out.workers[2].role is Role.DECODE


def test_borrow_lends_training_first_then_return_reclaims() -> None:
    s = replay(
        [
            ev.ClusterInit(
                tp=2, training_gpus=(0, 1, 2, 3), reserved_gpus=(4, 5), preemptible_gpus=()
            ),
            ev.WorkerAdded(worker=1, gpus=(4, 5), role=Role.COLOCATED, zone=Zone.DEDICATED),
            ev.ActivityChanged(worker=1, activity=Activity.ACTIVE),
        ]
    )
    m = membership(s, borrow=True)
    assert m.lend == 0 and m.N == 3
    p = plan(s, Target(mode=Mode.DISAGGREGATED, N_P=1, N_D=2, N_C=0), m)
    assert [x.op for x in p.steps][:1] == [StepOp.LEND]
    lent = execute(s, p)
    assert lent.workers[0].activity is Activity.INACTIVE and len(lent.routable()) == 3

    back = apply(lent, ev.TrainingBegin(step=1))
    assert all(w.zone is Zone.DEDICATED for w in back.routable())  # overlap workers stop at once
    m2 = membership(back, borrow=False)
    assert m2.reclaim == 0 and len(m2.leave) == 2
    survivors = m2.survivors[0]
    p2 = plan(back, Target(mode=Mode.COLOCATED, N_P=0, N_D=0, N_C=1), m2)
    out = execute(back, p2, plan_id=2)
    validate(out)
    assert out.workers[0].activity is Activity.ACTIVE  # training owns its GPUs again
    assert {w.id for w in out.rollout_workers(Zone.OVERLAP)} == {2, 3}  # processes retained
    assert all(w.activity is Activity.INACTIVE for w in out.rollout_workers(Zone.OVERLAP))
    assert out.workers[survivors.id].role is Role.COLOCATED
    assert out.phase is TrainingPhase.TRAINING

    # The next borrow reactivates the retained workers instead of starting new ones.
    done = apply(out, ev.TrainingFinished(step=1, weights_version=1))
    m3 = membership(done, borrow=True)
    assert sorted(w.id for w in m3.reactivate) == [2, 3] and not m3.new_groups


def test_target_size_must_match_membership() -> None:
    s = replay([ev.ClusterInit(tp=1, training_gpus=(), reserved_gpus=(0, 1), preemptible_gpus=())])
    m = membership(s, borrow=False)
    with pytest.raises(InfeasibleConfiguration):
        plan(s, Target(mode=Mode.COLOCATED, N_P=0, N_D=0, N_C=3), m)


def test_cannot_borrow_during_training() -> None:
    s = apply(
        replay([ev.ClusterInit(tp=1, training_gpus=(0,), reserved_gpus=(1,), preemptible_gpus=())]),
        ev.TrainingBegin(step=1),
    )
    with pytest.raises(InfeasibleConfiguration):
        membership(s, borrow=True)
