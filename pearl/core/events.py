"""Every record the event log holds, as frozen typed msgspec Structs.

Each record is a frozen ``msgspec`` Struct tagged with its kind, and has one msgpack-ready mapping
``{"kind": ..., "v": SCHEMA_VERSION, ...}`` (see :mod:`pearl.core.schema`); :func:`decode_bytes`
decodes msgpack straight into the record, validating it. Kinds:

- set-up: ``cluster-init``;
- elastic events (:class:`ElasticEvent`, listed once in :data:`ELASTIC_EVENTS`): ``gpus-added``,
  ``gpus-reclaimed``, ``gpus-reclaiming`` (a preemption notice with its deadline),
  ``gpus-reclaim-cancelled``, ``training-begin``, ``training-finished``;
- weights: ``weights-published`` (logged by pearld once the weights are stored);
- membership and role changes: ``worker-added``, ``worker-removed``, ``role-changed``,
  ``activity-changed``, ``worker-failed``;
- plan transactions: ``plan-begin`` (with its steps), ``step-done``, ``plan-commit``,
  ``plan-abort``;
- telemetry: ``telemetry`` (one summary per rollout step, what the Runtime Tracker fits).
"""

from __future__ import annotations

import enum
import typing
from typing import Any, TypeAlias, cast

from pearl.core.schema import Registry, WireStruct, to_wire
from pearl.core.state import Activity, Role, Step, Target, Zone

RECORDS = Registry("record")


class LogRecord(WireStruct, frozen=True, gc=False, kw_only=True):
    """Base of the log's records: frozen, holding only scalars, enums and tuples of frozen values,
    so never part of a reference cycle; the cyclic GC does not track them (replay allocates
    millions, and collections over a growing heap were half of its time)."""


class ElasticEvent(LogRecord, frozen=True, kw_only=True):
    """Base of the elastic events: what the cloud or the trainer changes (the GPU budget or the
    training phase), sent by clients in an ``event`` message; the plan that follows is the
    answer. Every subclass is one of :data:`ELASTIC_EVENTS` (tests/core/test_events.py)."""


class PlanCause(enum.StrEnum):
    """Why the controller began a plan (``PlanBegin.cause``). The log field stays a plain string:
    logs written by earlier controllers, or by tests, hold other words, and still replay."""

    RETURN = "return"  # GPUs go back (reclaimed, a notice, Training Begin): nothing joins
    EXPAND = "expand"  # workers join: new GPUs, or retained overlap workers activated
    REBALANCE = "rebalance"  # the same workers, other roles


class AbortCause(enum.StrEnum):
    """Why the controller cancelled a plan: the first word of the reason it logs in
    ``PlanAbort.reason``, which stays free text (older logs hold other sentences)."""

    TRAINING_BEGIN = "training-begin"  # the trainer wants its GPUs back
    GPUS_RECLAIMED = "gpus-reclaimed"  # a joiner's GPUs are gone
    GPUS_RECLAIMING = "gpus-reclaiming"  # a joiner's GPUs have a preemption notice
    WORKER = "worker"  # a worker was lost, or failed while joining
    STEP = "step"  # a step failed
    RECOVERY = "recovery"  # pearld restarted with an expansion not committed

    def reason(self, detail: str = "") -> str:
        """The reason logged: the cause's word, then what happened (``worker 3 lost``)."""
        return f"{self.value} {detail}" if detail else self.value


@RECORDS.add
class ClusterInit(LogRecord, tag="cluster-init", frozen=True, kw_only=True):
    """First record of every log: the GPU universe and the tensor-parallel degree."""

    tp: int
    training_gpus: tuple[int, ...]
    reserved_gpus: tuple[int, ...]
    preemptible_gpus: tuple[int, ...]


@RECORDS.add
class GpusAdded(ElasticEvent, tag="gpus-added", frozen=True, kw_only=True):
    """Preemptible GPUs joined the dedicated rollout zone (inter-scale expansion)."""

    gpus: tuple[int, ...]


@RECORDS.add
class GpusReclaimed(ElasticEvent, tag="gpus-reclaimed", frozen=True, kw_only=True):
    """Preemptible GPUs are being taken back; workers on them stop receiving requests at once."""

    gpus: tuple[int, ...]


@RECORDS.add
class GpusReclaiming(ElasticEvent, tag="gpus-reclaiming", frozen=True, kw_only=True):
    """A preemption notice: present preemptible GPUs will be reclaimed at ``deadline``.

    ``deadline`` is wall-clock time (Unix seconds, ``time.time()``), the one clock a log replayed
    after a restart or on another machine can still compare with. The GPUs stay usable until then
    but are marked leaving; at the deadline the reclaim is treated as arrived."""

    gpus: tuple[int, ...]
    deadline: float


@RECORDS.add
class GpusReclaimCancelled(ElasticEvent, tag="gpus-reclaim-cancelled", frozen=True, kw_only=True):
    """A preemption notice is withdrawn: the GPUs stay and their workers return to service."""

    gpus: tuple[int, ...]


@RECORDS.add
class TrainingBegin(ElasticEvent, tag="training-begin", frozen=True, kw_only=True):
    """The trainer wants its GPUs: every borrowed GPU must come back before it proceeds."""

    step: int


@RECORDS.add
class TrainingFinished(ElasticEvent, tag="training-finished", frozen=True, kw_only=True):
    """A training step is done; its GPUs may be borrowed until the next training-begin."""

    step: int
    weights_version: int | None = None


@RECORDS.add
class WeightsPublished(LogRecord, tag="weights-published", frozen=True, kw_only=True):
    version: int
    uri: str = ""


@RECORDS.add
class WorkerAdded(LogRecord, tag="worker-added", frozen=True, kw_only=True):
    """A rollout worker takes a free slot and binds to its GPUs for life (starts transitioning)."""

    worker: int
    gpus: tuple[int, ...]
    role: Role
    zone: Zone


@RECORDS.add
class WorkerRemoved(LogRecord, tag="worker-removed", frozen=True, kw_only=True):
    worker: int
    reason: str = ""


@RECORDS.add
class RoleChanged(LogRecord, tag="role-changed", frozen=True, kw_only=True):
    worker: int
    role: Role


@RECORDS.add
class ActivityChanged(LogRecord, tag="activity-changed", frozen=True, kw_only=True):
    worker: int
    activity: Activity


@RECORDS.add
class WorkerFailed(LogRecord, tag="worker-failed", frozen=True, kw_only=True):
    """A worker host died or failed a command; it stops receiving requests."""

    worker: int
    reason: str
    incarnation: int = 0


@RECORDS.add
class PlanBegin(LogRecord, tag="plan-begin", frozen=True, kw_only=True):
    """A reconfiguration plan (W_add, W_remove, rho) as ordered steps toward ``target``."""

    plan: int
    cause: str  # a PlanCause from this controller; any word in an older log
    target: Target
    steps: tuple[Step, ...]
    mandatory: bool = False  # a shrink or GPU return: completed on recovery, never cancelled


@RECORDS.add
class StepDone(LogRecord, tag="step-done", frozen=True, kw_only=True):
    plan: int
    step: int


@RECORDS.add
class PlanCommit(LogRecord, tag="plan-commit", frozen=True, kw_only=True):
    plan: int


@RECORDS.add
class PlanAbort(LogRecord, tag="plan-abort", frozen=True, kw_only=True):
    plan: int
    reason: str


@RECORDS.add
class Telemetry(LogRecord, tag="telemetry", frozen=True, kw_only=True):
    """One rollout step's workload summary (the Runtime Tracker's input, §4.3.2 and §5).

    ``S`` turns of the slowest trajectory, ``delta_L`` new prompt tokens per turn, ``r`` generated
    tokens per turn, ``theta`` bubble ratio, ``A``/``b`` decode iteration cost fit, ``t_prefill``
    seconds per prefill token, ``T_env`` environment seconds, ``makespan_s`` measured step time.
    ``toggle_s`` is a measured activation + return time when the step borrowed GPUs;
    ``toggle_min_s`` a lower bound on it from a borrow cycle cut short (censored: the activation
    ran that long and did not finish); ``window_s`` the last measured training-idle window
    (Training Finished -> next Training Begin), the time a borrow cycle has to pay.
    ``B_flight`` is the mean number of trajectories in flight while the batch ran and ``delta_P``
    the prompt tokens really prefilled per turn (None in records that predate them: B, delta_L).
    ``r_crit`` is the critical path's generated tokens per turn: the most any trajectory of the
    batch generated, over S (None in records that predate it: r). ``T_over`` is colocation's
    measured switching stall per turn (None where no worker ran colocated, or not measured);
    ``T_start`` how long after the batch's first trajectories its last ones started (None: not
    measured). ``kappa`` the decode batch a decoding sequence saw over the mean decode batch
    (None: not measured, or a record that predates it).
    """

    step: int
    batch: int
    S: float
    delta_L: float
    r: float
    theta: float
    A: float
    b: float
    t_prefill: float
    T_env: float
    makespan_s: float
    toggle_s: float | None = None
    toggle_min_s: float | None = None
    window_s: float | None = None
    B_flight: float | None = None
    delta_P: float | None = None
    r_crit: float | None = None
    T_over: float | None = None
    T_start: float | None = None
    kappa: float | None = None


Elastic: TypeAlias = (
    GpusAdded
    | GpusReclaimed
    | GpusReclaiming
    | GpusReclaimCancelled
    | TrainingBegin
    | TrainingFinished
)
"""Any elastic event, as a type (what an ``event`` message may carry)."""

ELASTIC_EVENTS: tuple[type[ElasticEvent], ...] = typing.get_args(Elastic)
"""The elastic event classes: the one list every consumer derives from."""

Record: TypeAlias = (
    ClusterInit
    | Elastic
    | WeightsPublished
    | WorkerAdded
    | WorkerRemoved
    | RoleChanged
    | ActivityChanged
    | WorkerFailed
    | PlanBegin
    | StepDone
    | PlanCommit
    | PlanAbort
    | Telemetry
)
"""Any record the log holds: every class registered in :data:`RECORDS`."""


def encode(record: Record) -> dict[str, Any]:
    return to_wire(record)


def decode(mapping: object) -> Record:
    # RECORDS registers exactly the classes of Record
    return cast(Record, RECORDS.decode(mapping))


def decode_bytes(payload: bytes | memoryview) -> Record:
    """The record a msgpack payload holds (msgspec errors when it is not a valid record)."""
    return _DECODER.decode(payload)


_DECODER = RECORDS.msgpack_decoder()


__all__ = [
    "RECORDS",
    "AbortCause",
    "ActivityChanged",
    "ClusterInit",
    "ELASTIC_EVENTS",
    "Elastic",
    "ElasticEvent",
    "GpusAdded",
    "GpusReclaimCancelled",
    "GpusReclaimed",
    "LogRecord",
    "GpusReclaiming",
    "PlanAbort",
    "PlanBegin",
    "PlanCause",
    "PlanCommit",
    "Record",
    "RoleChanged",
    "StepDone",
    "Telemetry",
    "TrainingBegin",
    "TrainingFinished",
    "WeightsPublished",
    "WorkerAdded",
    "WorkerFailed",
    "WorkerRemoved",
    "decode",
    "decode_bytes",
    "encode",
]
