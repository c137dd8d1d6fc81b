"""State = fold(records): how each log record changes the unified table.

``apply`` is the pure, one-record update used live (the Orchestrator logs, then applies);
``apply_all`` folds many records through one private builder, and :func:`fold_into` is replay's
flat loop over (seq, record) pairs: one builder for the whole tail, frozen once at the end, so no
table is rebuilt per record. All check that sequence numbers run last + 1; ``apply`` and
``apply_all`` leave the input state untouched when a record is rejected.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from pearl.core import events as ev
from pearl.core.errors import InvariantViolation
from pearl.core.state import Activity, ClusterState, TableBuilder


def _init(t: TableBuilder, r: ev.ClusterInit) -> None:
    t.init(r.tp, r.training_gpus, r.reserved_gpus, r.preemptible_gpus)


_HANDLERS: dict[type, Callable[[TableBuilder, Any], None]] = {
    ev.ClusterInit: _init,
    ev.GpusAdded: lambda t, r: t.add_gpus(r.gpus),
    ev.GpusReclaimed: lambda t, r: t.reclaim_gpus(r.gpus),
    ev.GpusReclaiming: lambda t, r: t.notice_gpus(r.gpus, r.deadline),
    ev.GpusReclaimCancelled: lambda t, r: t.cancel_notice(r.gpus),
    ev.TrainingBegin: lambda t, r: t.training_begin(r.step),
    ev.TrainingFinished: lambda t, r: t.training_finished(r.step, r.weights_version),
    ev.WeightsPublished: lambda t, r: t.publish_weights(r.version),
    ev.WorkerAdded: lambda t, r: t.add_worker(r.worker, r.gpus, r.role, r.zone),
    ev.WorkerRemoved: lambda t, r: t.remove_worker(r.worker),
    ev.RoleChanged: lambda t, r: t.set_role(r.worker, r.role),
    ev.ActivityChanged: lambda t, r: t.set_activity(r.worker, r.activity),
    ev.WorkerFailed: lambda t, r: _failed(t, r),
    ev.PlanBegin: lambda t, r: t.plan_begin(
        plan=r.plan, cause=r.cause, target=r.target, steps=r.steps
    ),
    ev.StepDone: lambda t, r: t.step_done(r.plan, r.step),
    ev.PlanCommit: lambda t, r: t.plan_commit(r.plan),
    ev.PlanAbort: lambda t, r: t.plan_abort(r.plan),
    ev.Telemetry: lambda t, r: None,
}


def _failed(t: TableBuilder, r: ev.WorkerFailed) -> None:
    w = t.workers.get(r.worker)
    if w is None:
        raise InvariantViolation(f"worker-failed names unknown worker {r.worker}")
    if w.activity is Activity.ACTIVE:
        t.set_activity(r.worker, Activity.TRANSITIONING)


def apply_to(builder: TableBuilder, record: ev.Record, seq: int | None = None) -> None:
    """Fold one record into a builder (validating first; a rejected record changes nothing)."""
    expected = builder.seq + 1
    if seq is not None and seq != expected:
        raise InvariantViolation(
            f"record sequence {seq} does not follow {builder.seq}; expected {expected}"
        )
    handler = _HANDLERS.get(type(record))
    if handler is None:
        raise InvariantViolation(f"no fold rule for {type(record).__name__}")
    handler(builder, record)
    builder.seq = expected


def rule_kinds() -> frozenset[type]:
    """The record types fold has a rule for (each kind of :data:`pearl.core.events.Record`)."""
    return frozenset(_HANDLERS)


def fold_into(
    builder: TableBuilder,
    pairs: Iterable[tuple[int, Any]],  # Any: the hot loop narrows by ``type(r) is``
    visit: Callable[[int, ev.Record], None] | None = None,
) -> None:
    """Fold (seq, record) pairs into ``builder`` in order, calling ``visit(seq, record)`` after
    each. On a rejected record raise InvariantViolation with ``builder`` as of the record before
    it (its ``seq`` says which record failed: ``builder.seq + 1``).

    Replay's hot loop: the sequence number lives in a local until the end, and the two most
    frequent kinds (activity changes and plan steps, ~80% of a log) call their primitive directly.
    """
    handlers = _HANDLERS
    set_activity, step_done = builder.set_activity, builder.step_done
    activity_changed, step_done_t = ev.ActivityChanged, ev.StepDone
    expected = builder.seq + 1
    try:
        for seq, record in pairs:
            if seq != expected:
                raise InvariantViolation(
                    f"record sequence {seq} does not follow {expected - 1}; expected {expected}"
                )
            t = type(record)
            if t is activity_changed:
                set_activity(record.worker, record.activity)
            elif t is step_done_t:
                step_done(record.plan, record.step)
            else:
                handler = handlers.get(t)
                if handler is None:
                    raise InvariantViolation(f"no fold rule for {t.__name__}")
                handler(builder, record)
            expected += 1
            if visit is not None:
                visit(seq, record)
    finally:
        builder.seq = expected - 1


def apply(state: ClusterState, record: ev.Record, seq: int | None = None) -> ClusterState:
    """The table after ``record``; ``state`` itself never changes."""
    b = state.thaw()
    apply_to(b, record, seq)
    return b.freeze()


def apply_all(
    state: ClusterState, records: Iterable[ev.Record], first_seq: int | None = None
) -> ClusterState:
    """Fold records in order; on a rejected record raise and leave ``state`` untouched."""
    b = state.thaw()
    seq = first_seq
    for r in records:
        apply_to(b, r, seq)
        if seq is not None:
            seq += 1
    return b.freeze()


def replay(records: Iterable[ev.Record]) -> ClusterState:
    """The table from the start of a log."""
    return apply_all(ClusterState(), records, first_seq=1)


__all__ = ["apply", "apply_all", "apply_to", "fold_into", "rule_kinds", "replay"]
