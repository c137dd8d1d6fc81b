"""Hypothesis strategies for table updates: candidate records drawn against the current table.

Candidates are aimed (existing workers, free GPUs, the plan in flight) often enough that most
are accepted, and arbitrary often enough that many are not, so one strategy feeds both the
"valid sequences replay" and the "invalid updates change nothing" properties.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from pearl.core import events as ev
from pearl.core.errors import InvariantViolation
from pearl.core.fold import apply_to
from pearl.core.state import (
    ROLLOUT_ROLES,
    Activity,
    ClusterState,
    Mode,
    Role,
    Step,
    StepOp,
    TableBuilder,
    Target,
    Zone,
)

TRAINING, RESERVED, PREEMPTIBLE = (0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11)
GPUS = st.integers(0, 12)
WORKERS = st.integers(0, 7)


def cluster_init(tp: int) -> ev.ClusterInit:
    return ev.ClusterInit(
        tp=tp, training_gpus=TRAINING, reserved_gpus=RESERVED, preemptible_gpus=PREEMPTIBLE
    )


def _worker(draw: st.DrawFn, b: TableBuilder) -> int:
    known = sorted(b.workers)
    return draw(st.sampled_from(known)) if known and draw(st.booleans()) else draw(WORKERS)


def _gpus(draw: st.DrawFn, n: int, pool: list[int]) -> tuple[int, ...]:
    if len(pool) >= n and draw(st.integers(0, 3)):
        return tuple(draw(st.lists(st.sampled_from(pool), min_size=n, max_size=n, unique=True)))
    return tuple(draw(st.lists(GPUS, min_size=max(0, n - 1), max_size=n + 1)))


def _step(draw: st.DrawFn, b: TableBuilder) -> Step:
    op = draw(st.sampled_from(list(StepOp)))
    wid = draw(WORKERS) if op is StepOp.ADD else _worker(draw, b)
    return Step(op=op, worker=wid, role=draw(st.sampled_from([None, *ROLLOUT_ROLES])))


@st.composite
def candidate(draw: st.DrawFn, b: TableBuilder) -> Any:
    """One record that may or may not fit the table ``b`` describes."""
    kind = draw(
        st.sampled_from(
            [
                "gpus-added",
                "gpus-reclaimed",
                "worker-added",
                "worker-added",
                "worker-added",
                "worker-removed",
                "role-changed",
                "activity-changed",
                "activity-changed",
                "training-begin",
                "training-finished",
                "weights-published",
                "worker-failed",
                "plan-begin",
                "step-done",
                "step-done",
                "plan-commit",
                "plan-abort",
                "telemetry",
                "cluster-init",
            ]
        )
    )
    present, absent = sorted(b.present_gpus), sorted(set(PREEMPTIBLE) - b.present_gpus)
    bound = {g for w in b.workers.values() if w.role is not Role.TRAINING for g in w.gpus}
    plan = b.plan
    if kind == "gpus-added":
        return ev.GpusAdded(gpus=_gpus(draw, draw(st.integers(1, 2)), absent))
    if kind == "gpus-reclaimed":
        return ev.GpusReclaimed(gpus=_gpus(draw, draw(st.integers(1, 2)), present))
    if kind == "worker-added":
        zone = draw(st.sampled_from(list(Zone)))
        pool = set(TRAINING) if zone is Zone.OVERLAP else set(RESERVED) | b.present_gpus
        role = draw(st.sampled_from([*ROLLOUT_ROLES, *ROLLOUT_ROLES, Role.TRAINING]))
        gpus = _gpus(draw, b.tp or 1, sorted(pool - bound))
        return ev.WorkerAdded(worker=draw(WORKERS), gpus=gpus, role=role, zone=zone)
    if kind == "worker-removed":
        return ev.WorkerRemoved(worker=_worker(draw, b))
    if kind == "role-changed":
        return ev.RoleChanged(worker=_worker(draw, b), role=draw(st.sampled_from(list(Role))))
    if kind == "activity-changed":
        return ev.ActivityChanged(
            worker=_worker(draw, b), activity=draw(st.sampled_from(list(Activity)))
        )
    if kind == "training-begin":
        return ev.TrainingBegin(step=b.training_step + draw(st.integers(-1, 1)))
    if kind == "training-finished":
        version = draw(st.sampled_from([None, b.weights_version, b.weights_version + 1, 0]))
        return ev.TrainingFinished(
            step=b.training_step + draw(st.integers(-1, 0)), weights_version=version
        )
    if kind == "weights-published":
        return ev.WeightsPublished(version=b.weights_version + draw(st.integers(-1, 2)))
    if kind == "worker-failed":
        return ev.WorkerFailed(worker=_worker(draw, b), reason="lost")
    if kind == "plan-begin":
        steps = tuple(_step(draw, b) for _ in range(draw(st.integers(0, 3))))
        target = Target(mode=Mode.COLOCATED, N_P=0, N_D=0, N_C=draw(st.integers(0, 3)))
        return ev.PlanBegin(
            plan=b.last_plan + draw(st.integers(0, 2)), cause="test", target=target, steps=steps
        )
    plan_id = plan.plan if plan is not None and draw(st.integers(0, 4)) else draw(st.integers(0, 4))
    if kind == "step-done":
        n = len(plan.steps) if plan is not None else 1
        return ev.StepDone(
            plan=plan_id,
            step=draw(
                st.integers(0, n - 1) if n and draw(st.integers(0, 3)) else st.integers(-1, n)
            ),
        )
    if kind == "plan-commit":
        return ev.PlanCommit(plan=plan_id)
    if kind == "plan-abort":
        return ev.PlanAbort(plan=plan_id, reason="test")
    if kind == "telemetry":
        return ev.Telemetry(
            step=b.training_step,
            batch=8,
            S=1.0,
            delta_L=2.0,
            r=3.0,
            theta=0.1,
            A=0.0,
            b=0.0,
            t_prefill=0.0,
            T_env=0.0,
            makespan_s=1.0,
        )
    return cluster_init(draw(st.integers(1, 2)))


@st.composite
def valid_records(draw: st.DrawFn, max_tries: int = 60) -> list[Any]:
    """A sequence of records the fold accepts, starting with cluster-init."""
    b = ClusterState().thaw()
    records = [cluster_init(draw(st.integers(1, 2)))]
    apply_to(b, records[0])
    for _ in range(draw(st.integers(0, max_tries))):
        r = draw(candidate(b))
        try:
            apply_to(b, r)
        except InvariantViolation:
            continue
        records.append(r)
    return records


__all__ = ["candidate", "cluster_init", "valid_records"]
