"""The unified GPU-worker-role table M = {w -> (G_w, R_w, a_w)} (paper §4.4.1, eq. 4).

Workers sit in stable slots keyed by their id and are bound to one GPU set for life; only their
role and activity change. GPUs live in two zones: the dedicated rollout zone (reserved GPUs plus the
preemptible ones currently present) and the overlap zone (training GPUs, time-shared between the
training worker and overlap rollout workers).

:class:`ClusterState` is immutable. Updates go through a :class:`TableBuilder` whose every
primitive checks its preconditions *before* it mutates anything, so a rejected update raises
:class:`InvariantViolation` and leaves the table as it was. ``pearl.core.fold`` maps log records
onto these primitives.

The table's fields are declared twice, by the same names: in :class:`ClusterState` (sets and
mappings, for lookups) and in :class:`TableSnapshot` (sorted tuples, what snapshots and views
encode). Everything else — the builder's copy, the conversions both ways — is derived from those
declarations by each field's pair of types; a field missing from either class, or a pair of
types with no conversion, fails at import.
"""

from __future__ import annotations

import dataclasses
import enum
import operator
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import msgspec

from pearl.core.errors import InvalidEvent, InvalidNotice, InvariantViolation
from pearl.core.schema import Value, to_plain


class Role(enum.StrEnum):
    PREFILL = "prefill"
    DECODE = "decode"
    COLOCATED = "colocated"
    TRAINING = "training"


class Activity(enum.StrEnum):
    ACTIVE = "active"  # serves requests (rollout) or owns its GPUs (training)
    INACTIVE = "inactive"  # process kept, no device state in use, serves nothing
    TRANSITIONING = "transitioning"  # initialising, draining, changing role, handing GPUs over


class Zone(enum.StrEnum):
    DEDICATED = "dedicated"
    OVERLAP = "overlap"


class Mode(enum.StrEnum):
    COLOCATED = "colocated"
    DISAGGREGATED = "disaggregated"


class TrainingPhase(enum.StrEnum):
    IDLE = "idle"  # the trainer waits for a batch: its GPUs may be lent to rollout
    TRAINING = "training"  # a training step was requested or runs: borrowed GPUs must come back


ROLLOUT_ROLES = (Role.PREFILL, Role.DECODE, Role.COLOCATED)


class Worker(Value, frozen=True, gc=False, kw_only=True):
    id: int
    gpus: tuple[int, ...]
    role: Role
    activity: Activity
    zone: Zone
    incarnation: int = 0

    @property
    def is_rollout(self) -> bool:
        return self.role is not Role.TRAINING

    @property
    def routable(self) -> bool:
        """Only active rollout workers receive requests."""
        return self.activity is Activity.ACTIVE and self.role is not Role.TRAINING


class Target(Value, frozen=True, gc=False, kw_only=True):
    """A rollout configuration pi = (N_P, N_D, N_C): fully colocated or fully disaggregated."""

    mode: Mode
    N_P: int
    N_D: int
    N_C: int

    @property
    def N(self) -> int:
        return self.N_P + self.N_D + self.N_C

    def count(self, role: Role) -> int:
        return {Role.PREFILL: self.N_P, Role.DECODE: self.N_D, Role.COLOCATED: self.N_C}.get(
            role, 0
        )

    def __str__(self) -> str:
        if self.mode is Mode.COLOCATED:
            return f"{self.N_C}C"
        return f"{self.N_P}P{self.N_D}D"


class StepOp(enum.StrEnum):
    ADD = "add"  # start a new rollout worker on free GPUs, sync weights, wait for admission
    ACTIVATE = "activate"  # resume a retained (inactive) overlap worker's device state
    REMOVE = "remove"  # stop routing, abort keeping prefixes, return the GPUs, end the worker
    DEACTIVATE = "deactivate"  # drain an overlap worker and release its device memory
    SET_ROLE = "set_role"  # drain or hand over, then switch a survivor's role
    LEND = "lend"  # the training worker releases device memory so rollout can borrow its GPUs
    RECLAIM = "reclaim"  # the training worker takes its GPUs back


class Step(Value, frozen=True, gc=False, kw_only=True):
    op: StepOp
    worker: int
    role: Role | None = None
    gpus: tuple[int, ...] = ()
    zone: Zone | None = None


class PlanProgress(Value, frozen=True, gc=False, kw_only=True):
    """The plan in flight: what ``plan-begin`` announced and which steps are done."""

    plan: int
    cause: str
    target: Target
    steps: tuple[Step, ...]
    done: tuple[int, ...] = ()

    @property
    def complete(self) -> bool:
        return len(self.done) == len(self.steps)


@dataclass(frozen=True, slots=True)
class ClusterState:
    """The table as of log sequence number ``seq``. Never mutated; see :meth:`thaw`."""

    seq: int = 0
    tp: int = 0
    training_gpus: frozenset[int] = frozenset()
    reserved_gpus: frozenset[int] = frozenset()
    preemptible_gpus: frozenset[int] = frozenset()
    present_gpus: frozenset[int] = frozenset()  # preemptible GPUs available now
    reclaiming_gpus: frozenset[int] = frozenset()  # reclaimed, still bound to a departing worker
    # Reclaiming GPUs granted again before their old worker left: present once it is gone.
    regranted_gpus: frozenset[int] = frozenset()
    workers: Mapping[int, Worker] = field(default_factory=lambda: MappingProxyType({}))
    # Present GPUs under a preemption notice -> its deadline (Unix seconds): usable until then,
    # their workers take no new turns.
    leaving_gpus: Mapping[int, float] = field(default_factory=lambda: MappingProxyType({}))
    phase: TrainingPhase = TrainingPhase.IDLE
    training_step: int = 0
    weights_version: int = 0
    plan: PlanProgress | None = None
    last_plan: int = 0
    next_incarnation: int = 1

    @property
    def initialised(self) -> bool:
        return self.tp > 0

    @property
    def dedicated_gpus(self) -> frozenset[int]:
        """GPUs of the dedicated rollout zone usable now (reserved + present preemptible)."""
        return self.reserved_gpus | self.present_gpus

    def rollout_workers(self, zone: Zone | None = None) -> list[Worker]:
        return [
            w
            for w in self.workers.values()
            if w.role is not Role.TRAINING and (zone is None or w.zone is zone)
        ]

    def training_workers(self) -> list[Worker]:
        return [w for w in self.workers.values() if w.role is Role.TRAINING]

    def routable(self) -> list[Worker]:
        return sorted((w for w in self.workers.values() if w.routable), key=lambda w: w.id)

    def free_gpus(self, zone: Zone) -> frozenset[int]:
        """GPUs of ``zone`` that no rollout worker is bound to."""
        pool = self.dedicated_gpus if zone is Zone.DEDICATED else self.training_gpus
        bound = {g for w in self.rollout_workers() for g in w.gpus}
        return frozenset(pool - bound)

    def role_counts(self, activities: Iterable[Activity] = (Activity.ACTIVE,)) -> Target:
        """(N_P, N_D, N_C) over rollout workers in the given activities."""
        acts = set(activities)
        n = {r: 0 for r in ROLLOUT_ROLES}
        for w in self.workers.values():
            if w.role is not Role.TRAINING and w.activity in acts:
                n[w.role] += 1
        mode = Mode.DISAGGREGATED if n[Role.PREFILL] or n[Role.DECODE] else Mode.COLOCATED
        return Target(mode=mode, N_P=n[Role.PREFILL], N_D=n[Role.DECODE], N_C=n[Role.COLOCATED])

    def thaw(self) -> TableBuilder:
        return TableBuilder(self)

    def to_json(self) -> dict[str, Any]:
        """The stable JSON view of ``pearl log replay --json`` and ``pearl status --json``."""
        counts = self.role_counts()
        return {
            "seq": self.seq,
            "workers": [
                {
                    "id": w.id,
                    "gpus": list(w.gpus),
                    "role": w.role.value,
                    "activity": w.activity.value,
                    "zone": w.zone.value,
                    "incarnation": w.incarnation,
                }
                for w in sorted(self.workers.values(), key=lambda w: w.id)
            ],
            "mode": counts.mode.value,
            "N_P": counts.N_P,
            "N_D": counts.N_D,
            "N_C": counts.N_C,
            "tp": self.tp,
            "gpus": {
                "training": sorted(self.training_gpus),
                "reserved": sorted(self.reserved_gpus),
                "present": sorted(self.present_gpus),
                "reclaiming": sorted(self.reclaiming_gpus),
                "regranted": sorted(self.regranted_gpus),
                "leaving": leaving_json(self.leaving_gpus),
            },
            "phase": self.phase.value,
            "training_step": self.training_step,
            "weights_version": self.weights_version,
            "plan": None if self.plan is None else to_plain(self.plan),
        }


class TableSnapshot(Value, frozen=True):
    """A :class:`ClusterState`, every field kept, in types the codecs encode: each GPU set a
    sorted tuple, the workers a tuple by id, the notices (GPU, deadline) pairs by GPU.

    Snapshot files and the Orchestrator's views carry this struct. Its fields are ClusterState's,
    by name; a field added later needs a default here, which is what an older snapshot reads as.
    """

    seq: int = 0
    tp: int = 0
    workers: tuple[Worker, ...] = ()
    training_gpus: tuple[int, ...] = ()
    reserved_gpus: tuple[int, ...] = ()
    preemptible_gpus: tuple[int, ...] = ()
    present_gpus: tuple[int, ...] = ()
    reclaiming_gpus: tuple[int, ...] = ()
    regranted_gpus: tuple[int, ...] = ()
    phase: TrainingPhase = TrainingPhase.IDLE
    training_step: int = 0
    weights_version: int = 0
    plan: PlanProgress | None = None
    last_plan: int = 0
    next_incarnation: int = 1
    leaving_gpus: tuple[tuple[int, float], ...] = ()

    @staticmethod
    def of(t: ClusterState) -> TableSnapshot:
        values = list(_SNAPSHOT_VALUES(t))
        for i, enc in _ENCODE:
            values[i] = enc(values[i])
        return TableSnapshot(*values)

    def state(self) -> ClusterState:
        """The table again (``TableSnapshot.of(t).state() == t``)."""
        values = list(_VALUES(self))
        for i, dec in _DECODE:
            values[i] = dec(values[i])
        return ClusterState(*values)


def _sorted(v: Iterable[Any]) -> tuple[Any, ...]:
    return tuple(sorted(v))


def _by_id(workers: Mapping[int, Worker]) -> tuple[Worker, ...]:
    return tuple(sorted(workers.values(), key=lambda w: w.id))


def _items(m: Mapping[Any, Any]) -> tuple[tuple[Any, Any], ...]:
    return tuple(sorted(m.items()))


def _mapping(pairs: Iterable[tuple[Any, Any]]) -> Mapping[Any, Any]:
    return MappingProxyType(dict(pairs))


def _worker_map(workers: Iterable[Worker]) -> Mapping[int, Worker]:
    return MappingProxyType({w.id: w for w in workers})


_Conv = Callable[[Any], Any]
# (ClusterState field type, TableSnapshot field type) -> (to the second, back to the first).
# A field of the same type in both is kept as it is.
_BY_TYPES: dict[tuple[Any, Any], tuple[_Conv, _Conv]] = {
    (frozenset[int], tuple[int, ...]): (_sorted, frozenset),
    (Mapping[int, Worker], tuple[Worker, ...]): (_by_id, _worker_map),
    (Mapping[int, float], tuple[tuple[int, float], ...]): (_items, _mapping),
}


def _conversions() -> dict[str, tuple[_Conv, _Conv]]:
    """Field name -> (to TableSnapshot's type, back) for each field whose two types differ."""
    snap = {f.name: f.type for f in msgspec.structs.fields(TableSnapshot)}
    if set(_TYPES) != set(snap):
        only_table, only_snap = sorted(set(_TYPES) - set(snap)), sorted(set(snap) - set(_TYPES))
        raise TypeError(
            "ClusterState and TableSnapshot must have the same fields: only in ClusterState "
            f"{only_table}, only in TableSnapshot {only_snap}"
        )
    out = {}
    for name in _FIELDS:
        types = (_TYPES[name], snap[name])
        if types in _BY_TYPES:
            out[name] = _BY_TYPES[types]
        elif types[0] != types[1]:
            raise TypeError(f"no conversion for table field {name!r} between types {types}")
    return out


# Both classes are built from positional values, each in its own field order (so TableSnapshot,
# a conversion struct and no record, keeps positional fields).
_FIELDS = tuple(f.name for f in dataclasses.fields(ClusterState))
_TYPES = typing.get_type_hints(ClusterState)
_VALUES = operator.attrgetter(*_FIELDS)
_SNAPSHOT_FIELDS = TableSnapshot.__struct_fields__
_SNAPSHOT_VALUES = operator.attrgetter(*_SNAPSHOT_FIELDS)
_CONVERT = _conversions()
_ENCODE = tuple((i, _CONVERT[n][0]) for i, n in enumerate(_SNAPSHOT_FIELDS) if n in _CONVERT)
_DECODE = tuple((i, _CONVERT[n][1]) for i, n in enumerate(_FIELDS) if n in _CONVERT)
# The builder holds each frozenset of the table as a set and each mapping as a dict.
_SETS = tuple(i for i, n in enumerate(_FIELDS) if typing.get_origin(_TYPES[n]) is frozenset)
_MAPS = tuple(i for i, n in enumerate(_FIELDS) if typing.get_origin(_TYPES[n]) is Mapping)


class TableBuilder:
    """A private mutable copy of a :class:`ClusterState`.

    Every primitive validates first and mutates after, so a raised error leaves the builder
    exactly as it was. Replay folds many records through one builder and freezes once.
    """

    # ClusterState's fields, mutable: a set for each frozenset, a dict for each mapping.
    seq: int
    tp: int
    training_gpus: set[int]
    reserved_gpus: set[int]
    preemptible_gpus: set[int]
    present_gpus: set[int]
    reclaiming_gpus: set[int]
    regranted_gpus: set[int]
    workers: dict[int, Worker]
    leaving_gpus: dict[int, float]
    phase: TrainingPhase
    training_step: int
    weights_version: int
    plan: PlanProgress | None
    last_plan: int
    next_incarnation: int

    def __init__(self, s: ClusterState) -> None:
        values = list(_VALUES(s))
        for i in _SETS:
            values[i] = set(values[i])
        for i in _MAPS:
            values[i] = dict(values[i])
        for name, value in zip(_FIELDS, values, strict=True):
            setattr(self, name, value)
        # GPU -> id of the rollout worker / training worker bound to it.
        self._rollout_owner: dict[int, int] = {}
        self._training_owner: dict[int, int] = {}
        # Ids of the training workers and of the overlap rollout workers: the few rows that
        # training-begin and training-finished look at (instead of every row, on every step).
        self._trainers: set[int] = set()
        self._overlap: set[int] = set()
        for w in self.workers.values():
            self._index(w)

    def freeze(self) -> ClusterState:
        values = list(_VALUES(self))
        for i in _SETS:
            values[i] = frozenset(values[i])
        for i in _MAPS:
            values[i] = MappingProxyType(dict(values[i]))  # a copy: the builder goes on changing
        return ClusterState(*values)

    # -- GPUs and the training phase ---------------------------------------------------------

    def init(
        self,
        tp: int,
        training_gpus: Iterable[int],
        reserved_gpus: Iterable[int],
        preemptible_gpus: Iterable[int],
    ) -> None:
        training, reserved, preempt = (
            frozenset(x) for x in (training_gpus, reserved_gpus, preemptible_gpus)
        )
        if self.tp:
            raise InvariantViolation("cluster-init on a table that is already initialised")
        if tp < 1:
            raise InvariantViolation(f"tensor-parallel degree must be >= 1, got {tp}")
        for a, b, what in (
            (training, reserved, "training and reserved"),
            (training, preempt, "training and preemptible"),
            (reserved, preempt, "reserved and preemptible"),
        ):
            if a & b:
                raise InvariantViolation(f"GPU ids {sorted(a & b)} are both {what}")
        if any(g < 0 for g in training | reserved | preempt):
            raise InvariantViolation("GPU ids must be >= 0")
        self.tp, self.training_gpus, self.reserved_gpus, self.preemptible_gpus = (
            tp,
            set(training),
            set(reserved),
            set(preempt),
        )
        if training:
            self._put(
                Worker(
                    id=0,
                    gpus=tuple(sorted(training)),
                    role=Role.TRAINING,
                    activity=Activity.ACTIVE,
                    zone=Zone.OVERLAP,
                    incarnation=self._incarnation(),
                )
            )

    def add_gpus(self, gpus: Iterable[int]) -> None:
        """Preemptible GPUs are granted. One whose old worker is still leaving it (a reclaim
        and a re-grant faster than a worker stops) is a fact too: it is noted as regranted
        and becomes present when that worker is gone."""
        gpus = list(gpus)
        self._need_init()
        if not gpus:
            raise InvalidEvent("gpus-added names no GPU")
        for g in gpus:
            if g not in self.preemptible_gpus:
                raise InvalidEvent(
                    f"GPU {g} is not a preemptible GPU of this cluster "
                    f"(preemptible ids: {_span(self.preemptible_gpus)})"
                )
            if g in self.present_gpus or g in self.regranted_gpus:
                raise InvalidEvent(f"GPU {g} is already present")
        if len(set(gpus)) != len(gpus):
            raise InvalidEvent(f"gpus-added names a GPU twice: {gpus}")
        for g in gpus:
            if g in self.reclaiming_gpus:
                self.regranted_gpus.add(g)
            else:
                self.present_gpus.add(g)

    def reclaim_gpus(self, gpus: Iterable[int]) -> None:
        """Preemptible GPUs are gone: unbound ones leave now, bound ones wait for their worker."""
        gpus = list(gpus)
        self._need_init()
        if not gpus:
            raise InvalidEvent("gpus-reclaimed names no GPU")
        for g in gpus:
            if g in self.reserved_gpus or g in self.training_gpus:
                raise InvalidEvent(f"GPU {g} is reserved, not preemptible; it cannot be reclaimed")
            if g not in self.present_gpus and g not in self.regranted_gpus:
                raise InvalidEvent(f"GPU {g} is not present, so it cannot be reclaimed")
        if len(set(gpus)) != len(gpus):
            raise InvalidEvent(f"gpus-reclaimed names a GPU twice: {gpus}")
        for g in gpus:
            self.leaving_gpus.pop(g, None)  # a notice ends when its reclaim arrives
            if g in self.regranted_gpus:  # gone again before its old worker left it
                self.regranted_gpus.discard(g)
                continue
            self.present_gpus.discard(g)
            owner = self._rollout_owner.get(g)
            if owner is None:
                continue
            self.reclaiming_gpus.add(g)
            w = self.workers[owner]
            if w.activity is Activity.ACTIVE:  # stop routing to it at once
                self.workers[w.id] = _with(w, w.role, Activity.TRANSITIONING)  # same owner

    def notice_gpus(self, gpus: Iterable[int], deadline: float) -> None:
        """A preemption notice: the GPUs are marked leaving until ``deadline`` and their workers
        stop taking new turns at once (in-flight turns go on; the controller migrates the rest)."""
        gpus = list(gpus)
        self._need_init()
        if not gpus:
            raise InvalidNotice("gpus-reclaiming names no GPU; pass --gpus, e.g. 20-23")
        if len(set(gpus)) != len(gpus):
            raise InvalidNotice(f"gpus-reclaiming names a GPU twice: {gpus}")
        for g in gpus:
            if g in self.reserved_gpus or g in self.training_gpus:
                raise InvalidNotice(
                    f"GPU {g} is {'reserved' if g in self.reserved_gpus else 'a training GPU'}, "
                    "not preemptible: only preemptible GPUs get reclaim notices"
                )
            if g in self.leaving_gpus:
                raise InvalidNotice(
                    f"GPU {g} already has a reclaim notice (deadline {self.leaving_gpus[g]:.3f}); "
                    "send gpus-reclaim-cancelled for it first to give a new deadline"
                )
            if g not in self.present_gpus and g not in self.regranted_gpus:
                present = _span(self.present_gpus) if self.present_gpus else "none"
                raise InvalidNotice(
                    f"GPU {g} is not present, so no reclaim notice can name it (present "
                    f"preemptible GPUs: {present})"
                )
        for g in gpus:
            self.leaving_gpus[g] = float(deadline)
            owner = self._rollout_owner.get(g)
            if owner is not None:
                w = self.workers[owner]
                if w.activity is Activity.ACTIVE:  # no new turns from now on
                    self.workers[w.id] = _with(w, w.role, Activity.TRANSITIONING)

    def cancel_notice(self, gpus: Iterable[int]) -> None:
        """A notice is withdrawn: the GPUs stay (the controller returns their workers)."""
        gpus = list(gpus)
        self._need_init()
        if not gpus:
            raise InvalidNotice("gpus-reclaim-cancelled names no GPU; pass --gpus, e.g. 20-23")
        for g in gpus:
            if g not in self.leaving_gpus:
                pending = _span(self.leaving_gpus) if self.leaving_gpus else "none"
                raise InvalidNotice(
                    f"GPU {g} has no pending reclaim notice (GPUs under notice: {pending}); "
                    "`pearl status --json` lists them under gpus.leaving"
                )
        for g in gpus:
            del self.leaving_gpus[g]

    def training_begin(self, step: int) -> None:
        self._need_init()
        if self.phase is TrainingPhase.TRAINING:
            raise InvalidEvent(
                f"training-begin while training step {self.training_step} is still "
                "running; send training-finished first"
            )
        if step < self.training_step or (step == self.training_step and step > 0):
            raise InvalidEvent(
                f"training-begin for step {step}, but step {self.training_step} already ran; "
                f"the next step is {self.training_step + 1}"
            )
        self.phase, self.training_step = TrainingPhase.TRAINING, step
        workers = self.workers
        for wid in self._overlap:  # borrowed GPUs must come back: stop routing now
            w = workers[wid]
            if w.activity is Activity.ACTIVE:
                workers[wid] = _with(w, w.role, Activity.TRANSITIONING)  # same owner

    def training_finished(self, step: int, weights_version: int | None) -> None:
        self._need_init()
        if self.phase is not TrainingPhase.TRAINING:
            raise InvalidEvent("training-finished without a training-begin")
        if step != self.training_step:
            raise InvalidEvent(
                f"training-finished for step {step}, but step {self.training_step} is running"
            )
        if any(self.workers[t].activity is not Activity.ACTIVE for t in self._trainers):
            raise InvalidEvent("training-finished while borrowed GPUs are still being returned")
        if weights_version is not None:
            self._check_version(weights_version)
            self.weights_version = weights_version
        self.phase = TrainingPhase.IDLE

    def publish_weights(self, version: int) -> None:
        self._check_version(version)
        self.weights_version = version

    # -- workers ------------------------------------------------------------------------------

    def add_worker(self, wid: int, gpus: tuple[int, ...], role: Role, zone: Zone) -> None:
        self._need_init()
        if wid < 0 or wid in self.workers:
            raise InvariantViolation(f"worker slot {wid} is {'taken' if wid >= 0 else 'invalid'}")
        if role is Role.TRAINING:
            raise InvariantViolation("training workers are fixed at cluster-init")
        if len(gpus) != self.tp or len(set(gpus)) != len(gpus):
            raise InvariantViolation(
                f"worker {wid} needs {self.tp} distinct GPUs, got {list(gpus)}"
            )
        pool = (
            self.training_gpus if zone is Zone.OVERLAP else (self.reserved_gpus | self.present_gpus)
        )
        for g in gpus:
            if g not in pool:
                raise InvariantViolation(f"GPU {g} is not available in the {zone} zone")
            if g in self._rollout_owner:
                raise InvariantViolation(
                    f"GPU {g} is already bound to rollout worker {self._rollout_owner[g]}"
                )
            if g in self.leaving_gpus:
                raise InvariantViolation(f"GPU {g} is under a reclaim notice; no new worker")
        if zone is Zone.OVERLAP:
            self._need_lent(gpus, wid)
        self._put(
            Worker(
                id=wid,
                gpus=tuple(gpus),
                role=role,
                activity=Activity.TRANSITIONING,
                zone=zone,
                incarnation=self._incarnation(),
            )
        )

    def remove_worker(self, wid: int) -> None:
        w = self._worker(wid)
        if w.role is Role.TRAINING:
            raise InvariantViolation("training workers cannot be removed")
        if w.activity is Activity.ACTIVE:
            raise InvariantViolation(
                f"worker {wid} is active; stop routing to it before removing it"
            )
        del self.workers[wid]
        self._overlap.discard(wid)
        for g in w.gpus:
            del self._rollout_owner[g]
            if g in self.reclaiming_gpus:
                self.reclaiming_gpus.discard(g)  # returned
                if g in self.regranted_gpus:  # and granted again meanwhile: usable now
                    self.regranted_gpus.discard(g)
                    self.present_gpus.add(g)

    def set_role(self, wid: int, role: Role) -> None:
        w = self._worker(wid)
        if w.role is Role.TRAINING or role is Role.TRAINING:
            raise InvariantViolation("the training role is fixed at cluster-init")
        if w.activity is Activity.ACTIVE:
            raise InvariantViolation(f"worker {wid} is active; drain it before changing its role")
        # rollout -> rollout: the GPU owner maps do not change
        self.workers[wid] = Worker(
            id=w.id,
            gpus=w.gpus,
            role=role,
            activity=w.activity,
            zone=w.zone,
            incarnation=w.incarnation,
        )

    def set_activity(self, wid: int, activity: Activity) -> None:
        """The most frequent update on replay: checks in order of likelihood, no owner-map work
        (the role, hence which map owns the GPUs, does not change)."""
        w = self.workers.get(wid)
        if w is None:
            raise InvariantViolation(f"no worker in slot {wid}")
        if w.role is Role.TRAINING:
            if activity is Activity.ACTIVE:
                busy = [o for o in self._sharers(w) if o.activity is not Activity.INACTIVE]
                if busy:
                    raise InvariantViolation(
                        f"training worker {wid} cannot take its GPUs back while overlap worker(s) "
                        f"{[o.id for o in busy]} still hold them"
                    )
        elif activity is not Activity.INACTIVE:
            if w.zone is Zone.OVERLAP:
                self._need_lent(w.gpus, wid)
            if activity is Activity.ACTIVE:
                if self.reclaiming_gpus and not self.reclaiming_gpus.isdisjoint(w.gpus):
                    gone = [g for g in w.gpus if g in self.reclaiming_gpus]
                    raise InvariantViolation(
                        f"worker {wid} cannot become active: GPUs {gone} were reclaimed"
                    )
                if self.leaving_gpus and any(g in self.leaving_gpus for g in w.gpus):
                    raise InvariantViolation(
                        f"worker {wid} cannot become active: its GPUs are under a reclaim notice"
                    )
                if w.zone is Zone.OVERLAP and self.phase is TrainingPhase.TRAINING:
                    raise InvariantViolation(
                        f"overlap worker {wid} cannot become active while training needs its GPUs"
                    )
        self.workers[wid] = Worker(
            id=w.id,
            gpus=w.gpus,
            role=w.role,
            activity=activity,
            zone=w.zone,
            incarnation=w.incarnation,
        )

    # -- plans ----------------------------------------------------------------------------------

    def plan_begin(self, plan: int, cause: str, target: Target, steps: tuple[Step, ...]) -> None:
        self._need_init()
        if self.plan is not None:
            raise InvariantViolation(
                f"plan {plan} begins while plan {self.plan.plan} is still in flight"
            )
        if plan <= self.last_plan:
            raise InvariantViolation(f"plan ids must increase: {plan} after {self.last_plan}")
        for k, s in enumerate(steps):
            if s.op is StepOp.ADD:
                if s.worker in self.workers:
                    raise InvariantViolation(
                        f"plan {plan} step {k} adds worker {s.worker}, whose slot is taken"
                    )
            elif s.worker not in self.workers:
                raise InvariantViolation(f"plan {plan} step {k} names unknown worker {s.worker}")
        self.plan, self.last_plan = (
            PlanProgress(plan=plan, cause=cause, target=target, steps=tuple(steps)),
            plan,
        )

    def step_done(self, plan: int, step: int) -> None:
        p = self.plan
        if p is None or p.plan != plan:
            p = self._plan(plan)  # raises
        if not 0 <= step < len(p.steps):
            raise InvariantViolation(f"plan {plan} has no step {step} (it has {len(p.steps)})")
        if step in p.done:
            raise InvariantViolation(f"plan {plan} step {step} is already done")
        self.plan = PlanProgress(
            plan=p.plan, cause=p.cause, target=p.target, steps=p.steps, done=p.done + (step,)
        )

    def plan_commit(self, plan: int) -> None:
        p = self._plan(plan)
        if not p.complete:
            todo = sorted(set(range(len(p.steps))) - set(p.done))
            raise InvariantViolation(f"plan {plan} cannot commit: steps {todo} are not done")
        self.plan = None

    def plan_abort(self, plan: int) -> None:
        self._plan(plan)
        self.plan = None

    # -- checks -------------------------------------------------------------------------------

    def _need_init(self) -> None:
        if not self.tp:
            raise InvariantViolation(
                "the table is not initialised (the log must start with cluster-init)"
            )

    def _worker(self, wid: int) -> Worker:
        w = self.workers.get(wid)
        if w is None:
            raise InvariantViolation(f"no worker in slot {wid}")
        return w

    def _plan(self, plan: int) -> PlanProgress:
        if self.plan is None or self.plan.plan != plan:
            current = None if self.plan is None else self.plan.plan
            raise InvariantViolation(f"plan {plan} is not in flight (in flight: {current})")
        return self.plan

    def _sharers(self, trainer: Worker) -> list[Worker]:
        ids = {self._rollout_owner[g] for g in trainer.gpus if g in self._rollout_owner}
        return [self.workers[i] for i in sorted(ids)]

    def _need_lent(self, gpus: Iterable[int], wid: int) -> None:
        """An overlap rollout worker may hold device state only while training has let go."""
        for g in gpus:
            t = self._training_owner.get(g)
            if t is not None and self.workers[t].activity is Activity.ACTIVE:
                raise InvariantViolation(
                    f"overlap worker {wid} needs GPU {g}, which training worker {t} still owns; "
                    "lend it first"
                )

    def _check_version(self, version: int) -> None:
        if version < self.weights_version:
            raise InvalidEvent(
                f"weights version {version} is older than the current {self.weights_version}"
            )

    def _incarnation(self) -> int:
        n = self.next_incarnation
        self.next_incarnation = n + 1
        return n

    def _put(self, w: Worker) -> None:
        self.workers[w.id] = w
        self._index(w)

    def _index(self, w: Worker) -> None:
        """Bind a new row's GPUs to it and file it among trainers or overlap workers (neither
        its role class nor its zone changes while it lives)."""
        training = w.role is Role.TRAINING
        owner = self._training_owner if training else self._rollout_owner
        for g in w.gpus:
            owner[g] = w.id
        if training:
            self._trainers.add(w.id)
        elif w.zone is Zone.OVERLAP:
            self._overlap.add(w.id)


def _with(w: Worker, role: Role, activity: Activity) -> Worker:
    """``w`` with another role or activity (direct construction: replay calls this a lot)."""
    return Worker(
        id=w.id, gpus=w.gpus, role=role, activity=activity, zone=w.zone, incarnation=w.incarnation
    )


def leaving_json(leaving: Mapping[int, float]) -> list[dict[str, Any]]:
    """``gpus.leaving``: one entry per deadline, ``{"gpus": [...], "deadline": unix_s}``."""
    by: dict[float, list[int]] = {}
    for g, d in leaving.items():
        by.setdefault(d, []).append(g)
    return [{"gpus": sorted(gs), "deadline": d} for d, gs in sorted(by.items())]


def _span(gpus: Iterable[int]) -> str:
    s = sorted(gpus)
    return f"{s[0]}-{s[-1]}" if s and s[-1] - s[0] + 1 == len(s) else str(s)


def validate(s: ClusterState) -> None:
    """Check every invariant of a whole table (tests, snapshots). Raises InvariantViolation."""
    rollout_owner: dict[int, int] = {}
    for wid, w in s.workers.items():
        if wid != w.id:
            raise InvariantViolation(f"slot {wid} holds worker {w.id}")
        if w.role is Role.TRAINING:
            if w.zone is not Zone.OVERLAP or not set(w.gpus) <= s.training_gpus:
                raise InvariantViolation(f"training worker {wid} must sit on training GPUs")
            continue
        if len(w.gpus) != s.tp:
            raise InvariantViolation(f"worker {wid} has {len(w.gpus)} GPUs, tp is {s.tp}")
        pool = s.training_gpus if w.zone is Zone.OVERLAP else s.dedicated_gpus | s.reclaiming_gpus
        for g in w.gpus:
            if g not in pool:
                raise InvariantViolation(
                    f"worker {wid} is bound to GPU {g}, not in its {w.zone} zone"
                )
            if g in rollout_owner:
                raise InvariantViolation(
                    f"GPU {g} is bound to rollout workers {rollout_owner[g]} and {wid}"
                )
            rollout_owner[g] = wid
            if g in s.reclaiming_gpus and w.activity is Activity.ACTIVE:
                raise InvariantViolation(f"worker {wid} is active on reclaimed GPU {g}")
    for t in s.training_workers():
        sharers = {rollout_owner[g] for g in t.gpus if g in rollout_owner}
        for o in sharers:
            ow = s.workers[o]
            if ow.activity is not Activity.INACTIVE and t.activity is Activity.ACTIVE:
                raise InvariantViolation(
                    f"training worker {t.id} and overlap worker {o} both hold GPUs"
                )
            if ow.activity is Activity.ACTIVE and s.phase is TrainingPhase.TRAINING:
                raise InvariantViolation(
                    f"overlap worker {o} is active while training needs its GPUs"
                )
    if not s.reclaiming_gpus <= set(rollout_owner):
        raise InvariantViolation("a reclaimed GPU is pending return but bound to no worker")
    if s.present_gpus & s.reclaiming_gpus or not s.present_gpus <= s.preemptible_gpus:
        raise InvariantViolation("present GPUs must be preemptible and not reclaimed")
    if not s.regranted_gpus <= s.reclaiming_gpus:
        raise InvariantViolation("a regranted GPU must still be bound to its departing worker")
    if not set(s.leaving_gpus) <= s.present_gpus | s.regranted_gpus:
        raise InvariantViolation("GPUs under a reclaim notice must be present")
    for g in s.leaving_gpus:
        owner = rollout_owner.get(g)
        if owner is not None and s.workers[owner].activity is Activity.ACTIVE:
            raise InvariantViolation(f"worker {owner} is active on GPU {g}, under a reclaim notice")
