"""How each plan step shows in the table: records at its start, at its end, at commit and abort.

A step's start takes the worker out of routing where needed (``transitioning``) or binds a new
worker to its slot; its end records the effect (removed, inactive, new role, training hand-off);
the commit admits every joiner and role-changer at once (atomic admission), except joiners that
start in the background (:func:`admits_in_background`), each admitted on its own ``WorkerUp``;
an abort removes the
joiners and re-admits survivors whose role change finished. The command that asks an executor to
perform a step is built here too, so the pair (records, command) always matches.
"""

from __future__ import annotations

from pearl.core import commands as cmd
from pearl.core import events as ev
from pearl.core.state import (
    Activity,
    ClusterState,
    PlanProgress,
    Role,
    Step,
    StepOp,
    TrainingPhase,
    Worker,
    Zone,
)


def _to(w: Worker | None, activity: Activity) -> list[ev.Record]:
    if w is None or w.activity is activity:
        return []
    return [ev.ActivityChanged(worker=w.id, activity=activity)]


def start_records(s: ClusterState, step: Step) -> list[ev.Record]:
    """Records logged when ``step`` starts (before its command is sent)."""
    w = s.workers.get(step.worker)
    if step.op is StepOp.ADD:
        assert step.role is not None and step.zone is not None
        return [ev.WorkerAdded(worker=step.worker, gpus=step.gpus, role=step.role, zone=step.zone)]
    if step.op is StepOp.ACTIVATE:
        assert w is not None and step.role is not None
        out: list[ev.Record] = (
            [] if w.role is step.role else [ev.RoleChanged(worker=w.id, role=step.role)]
        )
        return out + _to(w, Activity.TRANSITIONING)
    return _to(w, Activity.TRANSITIONING)  # stop routing / hand-off in progress


def step_command(
    s: ClusterState, plan: int, k: int, step: Step, force: bool = False, background: bool = False
) -> cmd.Command:
    """The executor command for step ``k`` of ``plan``."""
    op, wid = step.op, step.worker
    if op is StepOp.ADD:
        w = s.workers[wid]
        return cmd.StartWorker(
            worker=wid,
            incarnation=w.incarnation,
            gpus=w.gpus,
            role=w.role,
            zone=w.zone,
            weights_version=s.weights_version,
            plan=plan,
            step=k,
            background=background,
        )
    if op is StepOp.ACTIVATE:
        assert step.role is not None
        return cmd.ActivateWorker(
            worker=wid, role=step.role, weights_version=s.weights_version, plan=plan, step=k
        )
    if op is StepOp.REMOVE:
        return cmd.StopWorker(worker=wid, plan=plan, step=k, keep_partial=True, force=force)
    if op is StepOp.DEACTIVATE:
        return cmd.DeactivateWorker(worker=wid, plan=plan, step=k, keep_partial=True, force=force)
    if op is StepOp.SET_ROLE:
        assert step.role is not None
        return cmd.SetRole(worker=wid, role=step.role, plan=plan, step=k)
    if op is StepOp.LEND:
        return cmd.LendTraining(worker=wid, plan=plan, step=k)
    return cmd.ReclaimTraining(worker=wid, plan=plan, step=k)


def done_records(s: ClusterState, plan: int, k: int, step: Step) -> list[ev.Record]:
    """Records logged when step ``k`` finished: its effect first, then ``step-done``.

    In that order a crash between the two leaves the step not done but its effect applied, and
    re-running the step is harmless (these records skip what is already true)."""
    out: list[ev.Record] = []
    w = s.workers.get(step.worker)
    if step.op is StepOp.REMOVE:
        if w is not None:
            out += _to(w, Activity.TRANSITIONING)
            out.append(ev.WorkerRemoved(worker=step.worker, reason="plan"))
    elif step.op is StepOp.DEACTIVATE:
        if w is not None and w.activity is not Activity.INACTIVE:
            out += _to(w, Activity.TRANSITIONING)
            out.append(ev.ActivityChanged(worker=step.worker, activity=Activity.INACTIVE))
    elif step.op is StepOp.SET_ROLE:
        assert step.role is not None and w is not None
        out += _to(w, Activity.TRANSITIONING)
        if w.role is not step.role:
            out.append(ev.RoleChanged(worker=step.worker, role=step.role))
    elif step.op is StepOp.LEND:
        out += _to(w, Activity.INACTIVE)
    elif step.op is StepOp.RECLAIM:
        out += _to(w, Activity.ACTIVE)
    return [*out, ev.StepDone(plan=plan, step=k)]


def _can_serve(s: ClusterState, w: Worker | None) -> bool:
    """Whether the table lets ``w`` become active now (its GPUs are its to use)."""
    if w is None or any(g in s.reclaiming_gpus or g in s.leaving_gpus for g in w.gpus):
        return False
    if w.zone is Zone.DEDICATED:
        return True
    lent = all(t.activity is Activity.INACTIVE for t in s.training_workers())
    return lent and s.phase is TrainingPhase.IDLE


def admits_in_background(s: ClusterState, steps: tuple[Step, ...]) -> bool:
    """Whether the plan's joiners may initialise in the background (§4.5: "new workers initialize
    in the background while existing workers continue serving") and serve one by one as each is
    up, the plan being over once they are launched: a pure expansion on dedicated GPUs that
    changes no serving worker, whose every joiner's role is already served (or colocated), so no
    partial topology is exposed. A cold start then never holds the next plan (a borrow within
    the training-idle window, a role switch) or a cancelled expansion's other joiners."""
    if not steps or any(st.op is not StepOp.ADD or st.zone is not Zone.DEDICATED for st in steps):
        return False
    joining = {st.worker for st in steps}
    served = {w.role for w in s.rollout_workers() if w.routable and w.id not in joining}
    return all(st.role is Role.COLOCATED or st.role in served for st in steps)


def _admitted(p: PlanProgress) -> list[int]:
    return [
        s.worker
        for k, s in enumerate(p.steps)
        if k in p.done and s.op in (StepOp.ADD, StepOp.ACTIVATE, StepOp.SET_ROLE)
    ]


def commit_records(s: ClusterState, failed: frozenset[int] = frozenset()) -> list[ev.Record]:
    """Atomic admission: joiners and role-changers become routable together, then plan-commit."""
    p = s.plan
    assert p is not None and p.complete
    out: list[ev.Record] = []
    for wid in _admitted(p):
        w = s.workers.get(wid)
        if wid not in failed and _can_serve(s, w):
            out += _to(w, Activity.ACTIVE)
    return [*out, ev.PlanCommit(plan=p.plan)]


def abort_records(
    s: ClusterState, reason: str, failed: frozenset[int] = frozenset()
) -> list[ev.Record]:
    """Cancel a plan: joiners leave (or go back to inactive), finished role changes are kept."""
    p = s.plan
    assert p is not None
    out: list[ev.Record] = []
    for k, step in enumerate(p.steps):
        w = s.workers.get(step.worker)
        if w is None:
            continue
        if step.op is StepOp.ADD:
            out += _to(w, Activity.TRANSITIONING)
            out.append(ev.WorkerRemoved(worker=w.id, reason="expansion cancelled"))
        elif step.op is StepOp.ACTIVATE:
            out += _to(w, Activity.INACTIVE)
        elif step.op is StepOp.SET_ROLE and w.activity is Activity.TRANSITIONING:
            finished = k in p.done or w.role is step.role
            if finished and w.id not in failed and _can_serve(s, w):
                out += _to(w, Activity.ACTIVE)
    return [*out, ev.PlanAbort(plan=p.plan, reason=reason)]


def cancel_command(
    plan: int, k: int, step: Step, force: bool = True
) -> cmd.StopWorker | cmd.DeactivateWorker:
    """Command that undoes a started joiner (an add or an activation) when its plan is cancelled.
    An activation is undone in place unless ``force``: the retained process releases its device
    memory and stays, so the next borrow is an activation again, not a cold start; forced, the
    process is ended."""
    if step.op is StepOp.ADD:
        return cmd.StopWorker(
            worker=step.worker, plan=plan, step=k, keep_partial=False, force=True, cancel=True
        )
    if step.op is StepOp.ACTIVATE:
        return cmd.DeactivateWorker(worker=step.worker, plan=plan, step=k, force=force, cancel=True)
    raise ValueError(f"step {k} of plan {plan} ({step.op}) is not a joiner: nothing to cancel")


__all__ = [
    "abort_records",
    "cancel_command",
    "commit_records",
    "done_records",
    "start_records",
    "step_command",
]
