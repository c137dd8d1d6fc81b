"""The cluster status: the ``pearl status --json`` object as typed, frozen records.

:func:`pearl.core.view.cluster_status` builds a :class:`ClusterStatus` from the Orchestrator's
view; the ``status`` reply carries it, msgspec decodes it on the client side, and
:meth:`pearl.Runtime.status` returns it. Encoded, its fields are the documented JSON keys, in
their order (``docs/cli-json.md``); :func:`status_plain` is that mapping.

A client decodes what a newer pearld adds without failing: unknown fields are ignored.
"""

from __future__ import annotations

from typing import Any

import msgspec

from pearl.core.borrow import Verdict
from pearl.core.gate import GateResult
from pearl.core.profile import WorkloadProfile


class View(msgspec.Struct, frozen=True, kw_only=True):
    """Base of the status records (unknown fields from a newer peer are ignored)."""


class WorkerRow(View, frozen=True):
    """One worker of the table (``role``, ``activity`` and ``zone`` as their enums' values)."""

    id: int
    gpus: tuple[int, ...]
    role: str
    activity: str
    zone: str
    incarnation: int


class LeavingGpus(View, frozen=True):
    """GPUs under one preemption notice, gone by ``deadline`` (Unix seconds, as logged)."""

    gpus: tuple[int, ...]
    deadline: float


class GpuSets(View, frozen=True):
    """The table's GPU sets; ``leaving`` grouped by deadline."""

    training: tuple[int, ...] = ()
    reserved: tuple[int, ...] = ()
    present: tuple[int, ...] = ()
    reclaiming: tuple[int, ...] = ()  # reclaimed, their worker still leaving them
    regranted: tuple[int, ...] = ()  # of those, granted again meanwhile
    leaving: tuple[LeavingGpus, ...] = ()


class Budget(View, frozen=True):
    """The GPU budget now and the rollout workers in it (the decision's N)."""

    dedicated_gpus: int
    training_gpus: int
    lent: bool  # every training worker is inactive: its GPUs are lent
    workers: int
    stranded_gpus: tuple[int, ...]  # present GPUs no worker can use


class Transition(View, frozen=True):
    """The plan in flight."""

    plan: int
    cause: str
    target: str
    steps: int
    done: int
    aborting: str | None  # why it is being cancelled (None: it is not)


class DecisionStatus(View, frozen=True):
    """The decision behind the latest plan, and whether it is for the budget now."""

    target: str
    predicted_makespan_s: float | None  # None: no prediction (an empty pool); ``reason`` says why
    reason: str
    workers: int  # the budget it was made for
    current: bool  # False while it is an earlier budget's (e.g. during a return)


class BorrowCycleStatus(View, frozen=True):
    """What one borrow cycle (a training-idle window) did; seconds, None where it did not occur."""

    step: int
    window_s: float | None = None
    gate: Verdict = Verdict.NONE
    gate_reason: str = ""
    window_left_s: float | None = None  # the pipeline's ETA the gate went by
    plan: int | None = None
    lent: int = 0
    activated: int = 0
    activation_s: float | None = None
    served_s: float | None = None
    aborted: str | None = None  # why the borrow plan was cancelled before it committed
    returning: int = 0
    return_s: float | None = None


class BorrowStatus(View, frozen=True):
    current: BorrowCycleStatus | None = None
    last: BorrowCycleStatus | None = None


class ClusterStatus(View, frozen=True):
    """The ``pearl status --json`` object: the table's JSON view first, then the controller's."""

    seq: int
    workers: tuple[WorkerRow, ...]
    mode: str
    N_P: int
    N_D: int
    N_C: int
    tp: int
    gpus: GpuSets
    phase: str
    training_step: int
    weights_version: int
    plan: dict[str, Any] | None  # the plan record in flight, as logged
    budget: Budget
    transitions: tuple[Transition, ...]
    training_may_proceed: int
    profile: WorkloadProfile | None
    decision: DecisionStatus | None
    measured_makespan_s: float | None  # the last batch's, from its telemetry
    gate: GateResult | None
    borrow: BorrowStatus
    failed: tuple[int, ...]
    quarantined_gpus: tuple[int, ...]
    boot_id: str
    controller_recoveries: int
    # Filled in by the API endpoint (empty in an in-process runtime's status).
    endpoint: str = ""
    pub_endpoint: str = ""
    worker_metrics: dict[str, str] = {}  # worker id -> where its host serves its metrics
    worker_nodes: dict[str, str] = {}  # worker id -> the Ray node its host runs on
    # worker id -> why its host last died or could not start (cleared once it serves)
    worker_faults: dict[str, str] = {}


def status_plain(s: ClusterStatus) -> dict[str, Any]:
    """The JSON mapping of ``s`` (``pearl status --json``): JSON types only, lists for tuples."""
    out: dict[str, Any] = msgspec.json.decode(msgspec.json.encode(s))
    return out


def status_of(mapping: object) -> ClusterStatus:
    """Decode a status from its JSON mapping (a pub/sub payload, a ``--json`` line)."""
    return msgspec.convert(mapping, ClusterStatus)


__all__ = [
    "BorrowCycleStatus",
    "BorrowStatus",
    "Budget",
    "ClusterStatus",
    "DecisionStatus",
    "GpuSets",
    "LeavingGpus",
    "Transition",
    "View",
    "WorkerRow",
    "status_of",
    "status_plain",
]
