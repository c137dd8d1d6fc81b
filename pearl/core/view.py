"""The typed view the Orchestrator publishes after every logged change (``state-changed``).

Actors read its attributes; nothing between actors is a status dict. :class:`TableSnapshot` (from
:mod:`pearl.core.state`) is the table in an encodable form and converts back losslessly;
:class:`ClusterView` adds what the controller knows beside the table (profile, plan progress,
gate, borrow cycles, failures) and the workers that receive requests. :func:`cluster_status`
renders the typed ``pearl status`` object (:mod:`pearl.core.status`), :func:`status_json` its
JSON mapping: only the edge (the API actor, a runtime's ``status()``) calls them.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from pearl.core.borrow import BorrowCycle
from pearl.core.controller import ControllerState
from pearl.core.decision import finite_or_none
from pearl.core.gate import GateResult
from pearl.core.profile import WorkloadProfile
from pearl.core.schema import Value, to_plain
from pearl.core.state import (
    Activity,
    ClusterState,
    Mode,
    Role,
    TableSnapshot,
    Target,
    Worker,
)
from pearl.core.status import ClusterStatus


class DecisionView(Value, frozen=True, kw_only=True):
    """What ``pearl status`` shows of the decision behind the latest plan."""

    target: Target
    predicted_makespan_s: float | None  # None: no prediction (an empty pool); ``reason`` says why
    reason: str


class ClusterView(Value, frozen=True, kw_only=True):
    """The Orchestrator's view after a logged change: the table and the controller beside it."""

    table: TableSnapshot = TableSnapshot()
    profile: WorkloadProfile | None = None  # None only in views built by hand (tests)
    aborting: str | None = None  # why the plan in flight is being cancelled
    training_may_proceed: int = 0  # the last training step told it may proceed
    decision: DecisionView | None = None
    measured_makespan_s: float | None = None  # the last batch's, from its telemetry
    gate: GateResult | None = None
    cycle: BorrowCycle | None = None  # the borrow cycle of the current or last idle window
    last_cycle: BorrowCycle | None = None
    failed: tuple[int, ...] = ()  # workers reported down, not back yet
    quarantined_gpus: tuple[int, ...] = ()
    boot_id: str = ""
    controller_recoveries: int = 0

    @property
    def seq(self) -> int:
        return self.table.seq

    @property
    def weights_version(self) -> int:
        return self.table.weights_version

    @property
    def rollout(self) -> tuple[Worker, ...]:
        """Every rollout worker (not the training ones), whatever its activity, by id."""
        return tuple(w for w in self.table.workers if w.role is not Role.TRAINING)

    @property
    def routable(self) -> tuple[Worker, ...]:
        """The workers that receive requests (active rollout workers), by id."""
        return tuple(w for w in self.table.workers if w.routable)

    @property
    def serving(self) -> Target:
        """(N_P, N_D, N_C) over the routable workers (the table's ``role_counts()``)."""
        n = {r: 0 for r in (Role.PREFILL, Role.DECODE, Role.COLOCATED)}
        for w in self.routable:
            n[w.role] += 1
        mode = Mode.DISAGGREGATED if n[Role.PREFILL] or n[Role.DECODE] else Mode.COLOCATED
        return Target(mode=mode, N_P=n[Role.PREFILL], N_D=n[Role.DECODE], N_C=n[Role.COLOCATED])


def cluster_view(
    s: ControllerState, proceeded: int = 0, boot_id: str = "", recoveries: int = 0
) -> ClusterView:
    """The view of controller state ``s`` (built once per logged change)."""
    d = s.last_decision
    return ClusterView(
        table=TableSnapshot.of(s.table),
        profile=s.profile,
        aborting=s.aborting,
        training_may_proceed=proceeded,
        decision=None
        if d is None
        else DecisionView(
            target=d.target,
            predicted_makespan_s=finite_or_none(d.predicted_makespan_s),
            reason=d.reason,
        ),
        measured_makespan_s=s.last_makespan_s,
        gate=s.last_gate,
        cycle=s.cycle,
        last_cycle=s.last_cycle,
        failed=tuple(sorted(s.failed)),
        quarantined_gpus=tuple(sorted(s.quarantine)),
        boot_id=boot_id,
        controller_recoveries=recoveries,
    )


def stranded_gpus(t: ClusterState, quarantined: Iterable[int] = ()) -> list[int]:
    """Present GPUs of the dedicated zone that no worker can use: free (no rollout worker holds
    them, not quarantined, under no notice) and left over once the free ones are grouped by the
    tensor-parallel degree, as the planner groups them (``plan._groups``: sorted, ``tp`` at a
    time). TP2 workers on 20-23 and ``gpus-reclaimed 22``: GPU 23."""
    if t.tp <= 0:
        return []
    bound = {g for w in t.rollout_workers() for g in w.gpus}
    free = sorted(t.dedicated_gpus - bound - set(quarantined) - t.leaving_gpus.keys())
    return free[len(free) - len(free) % t.tp :]


def budget_workers(t: ClusterState) -> int:
    """Rollout workers in the budget now (the decision's N): those not inactive whose GPUs are
    neither reclaimed nor under a notice. While a plan runs, its target's N."""
    if t.plan is not None:
        return t.plan.target.N
    going = t.reclaiming_gpus | t.leaving_gpus.keys()
    return sum(
        1
        for w in t.rollout_workers()
        if w.activity is not Activity.INACTIVE and going.isdisjoint(w.gpus)
    )


def status_json(v: ClusterView) -> dict[str, Any]:
    """The ``pearl status --json`` object (without the API's own endpoint fields)."""
    t = v.table.state()
    out = t.to_json()
    trainers = t.training_workers()
    out["budget"] = {
        "dedicated_gpus": len(t.dedicated_gpus),
        "training_gpus": len(t.training_gpus),
        "lent": bool(trainers) and all(w.activity is Activity.INACTIVE for w in trainers),
        "workers": budget_workers(t),
        "stranded_gpus": stranded_gpus(t, v.quarantined_gpus),
    }
    p = t.plan
    out["transitions"] = (
        []
        if p is None
        else [
            {
                "plan": p.plan,
                "cause": p.cause,
                "target": str(p.target),
                "steps": len(p.steps),
                "done": len(p.done),
                "aborting": v.aborting,
            }
        ]
    )
    out["training_may_proceed"] = v.training_may_proceed
    out["profile"] = None if v.profile is None else to_plain(v.profile)
    d = v.decision
    out["decision"] = (
        None
        if d is None
        else {
            "target": str(d.target),
            "predicted_makespan_s": d.predicted_makespan_s,
            "reason": d.reason,
            "workers": d.target.N,  # the budget it was made for
            # False: the budget changed since (a return plans no decision) and none was made
            # for the budget now; the decision shown is the one before.
            "current": out["budget"]["workers"] == d.target.N,
        }
    )
    out["measured_makespan_s"] = v.measured_makespan_s
    out["gate"] = None if v.gate is None else to_plain(v.gate)
    out["borrow"] = {
        "current": None if v.cycle is None else v.cycle.to_json(),
        "last": None if v.last_cycle is None else v.last_cycle.to_json(),
    }
    out["failed"] = list(v.failed)
    out["quarantined_gpus"] = list(v.quarantined_gpus)
    out["boot_id"] = v.boot_id
    out["controller_recoveries"] = v.controller_recoveries
    return out


def cluster_status(v: ClusterView) -> ClusterStatus:
    """The typed ``pearl status`` of view ``v``: :func:`status_json` decoded, as a client
    decodes it (its ``plan`` mapping holds JSON lists, in process as on the wire)."""
    return msgspec.json.decode(msgspec.json.encode(status_json(v)), type=ClusterStatus)


__all__ = [
    "ClusterView",
    "DecisionView",
    "TableSnapshot",
    "budget_workers",
    "cluster_status",
    "cluster_view",
    "status_json",
    "stranded_gpus",
]
