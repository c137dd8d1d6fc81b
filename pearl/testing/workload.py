"""A realistic, valid stream of log records: what an Orchestrator writes while GPUs come and go.

Every record is folded as it is made, so the stream is valid by construction and the generator
can follow the table. The mix per training step is what PEARL logs: telemetry, training-begin
and -finished, plan transactions that hand the overlap GPUs back and forth (activity changes and
step-done records), and now and then preemptible GPUs joining or being reclaimed (workers added
and removed, roles changed), and a worker failing.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

from pearl.core import events as ev
from pearl.core.fold import apply_to
from pearl.core.state import (
    Activity,
    ClusterState,
    Mode,
    Role,
    Step,
    StepOp,
    Target,
    TrainingPhase,
    Zone,
)

TP = 2
TRAINING = tuple(range(0, 16))
RESERVED = tuple(range(16, 32))
PREEMPTIBLE = tuple(range(32, 96))


class Workload:
    """Emits records in batches (one list per Orchestrator decision), folding each one."""

    def __init__(self, seed: int = 0, overlap_workers: int = 8) -> None:
        self.rng = random.Random(seed)
        self.b = ClusterState().thaw()
        self.plan = 0
        self.step = 0
        self.overlap = overlap_workers

    def _emit(self, records: list[Any]) -> list[Any]:
        for r in records:
            apply_to(self.b, r)
        return records

    def _run_plan(self, cause: str, steps: list[tuple[Step, list[Any]]]) -> Iterator[list[Any]]:
        self.plan += 1
        counts = self._counts()
        target = (
            Target(mode=Mode.COLOCATED, N_P=0, N_D=0, N_C=counts)
            if counts
            else Target(mode=Mode.COLOCATED, N_P=0, N_D=0, N_C=1)
        )
        yield self._emit(
            [
                ev.PlanBegin(
                    plan=self.plan, cause=cause, target=target, steps=tuple(s for s, _ in steps)
                )
            ]
        )
        for k, (_, records) in enumerate(steps):
            yield self._emit([*records, ev.StepDone(plan=self.plan, step=k)])
        yield self._emit([ev.PlanCommit(plan=self.plan)])

    def _counts(self) -> int:
        return sum(1 for w in self.b.workers.values() if w.role is not Role.TRAINING)

    def _free_slots(self, n: int) -> list[int]:
        """The ``n`` lowest empty slots (stable slots: new workers reuse them)."""
        out: list[int] = []
        wid = 1
        while len(out) < n:
            if wid not in self.b.workers:
                out.append(wid)
            wid += 1
        return out

    def batches(self) -> Iterator[list[Any]]:
        """Record batches forever (callers stop when they have enough)."""
        yield self._emit(
            [
                ev.ClusterInit(
                    tp=TP,
                    training_gpus=TRAINING,
                    reserved_gpus=RESERVED,
                    preemptible_gpus=PREEMPTIBLE,
                )
            ]
        )
        yield from self._grow(RESERVED, "startup")
        while True:
            self.step += 1
            yield from self._train_step()
            roll = self.rng.random()
            if roll < 0.15:
                yield from self._gpus_join()
            elif roll < 0.27:
                yield from self._gpus_leave()
            elif roll < 0.32:
                yield from self._worker_fails()

    def records(self, n: int) -> list[Any]:
        """The first ``n`` records of the stream."""
        out: list[Any] = []
        for batch in self.batches():
            out.extend(batch)
            if len(out) >= n:
                return out[:n]
        raise AssertionError("unreachable")

    # -- pieces -------------------------------------------------------------------------------

    def _grow(self, gpus: tuple[int, ...], cause: str) -> Iterator[list[Any]]:
        pool = set(self.b.reserved_gpus) | self.b.present_gpus
        free = sorted(pool - {g for w in self.b.workers.values() for g in w.gpus})
        pairs = [tuple(free[i : i + TP]) for i in range(0, len(free) - TP + 1, TP)]
        steps = []
        for wid, pair in zip(self._free_slots(len(pairs)), pairs, strict=True):
            role = Role.DECODE if self.rng.random() < 0.6 else Role.PREFILL
            steps.append(
                (
                    Step(op=StepOp.ADD, worker=wid, role=role, gpus=pair, zone=Zone.DEDICATED),
                    [
                        ev.WorkerAdded(worker=wid, gpus=pair, role=role, zone=Zone.DEDICATED),
                        ev.ActivityChanged(worker=wid, activity=Activity.ACTIVE),
                    ],
                )
            )
        if steps:
            yield from self._run_plan(cause, steps)

    def _train_step(self) -> Iterator[list[Any]]:
        b, rng = self.b, self.rng
        yield self._emit(
            [
                ev.Telemetry(
                    step=self.step,
                    batch=512,
                    S=rng.uniform(5, 30),
                    delta_L=rng.uniform(100, 900),
                    r=rng.uniform(50, 600),
                    theta=rng.uniform(0, 0.4),
                    A=rng.uniform(0.01, 0.03),
                    b=rng.uniform(1e-5, 1e-4),
                    t_prefill=rng.uniform(1e-5, 5e-5),
                    T_env=rng.uniform(0.5, 4),
                    makespan_s=rng.uniform(60, 600),
                    toggle_s=rng.choice([None, rng.uniform(1, 5)]),
                )
            ]
        )
        yield self._emit([ev.TrainingBegin(step=self.step)])
        overlap = [w for w in b.workers.values() if w.zone is Zone.OVERLAP and w.is_rollout]
        steps: list[tuple[Step, list[Any]]] = [
            (
                Step(op=StepOp.DEACTIVATE, worker=w.id),
                [ev.ActivityChanged(worker=w.id, activity=Activity.INACTIVE)],
            )
            for w in overlap
        ]
        steps.append(
            (
                Step(op=StepOp.RECLAIM, worker=0),
                [ev.ActivityChanged(worker=0, activity=Activity.ACTIVE)],
            )
        )
        yield from self._run_plan("training-begin", steps)
        yield self._emit([ev.TrainingFinished(step=self.step, weights_version=self.step)])
        steps = [
            (
                Step(op=StepOp.LEND, worker=0),
                [ev.ActivityChanged(worker=0, activity=Activity.INACTIVE)],
            )
        ]
        if not overlap:
            for k in range(self.overlap):
                gpus = TRAINING[k * TP : (k + 1) * TP]
                wid = 100 + k
                steps.append(
                    (
                        Step(
                            op=StepOp.ADD,
                            worker=wid,
                            role=Role.DECODE,
                            gpus=gpus,
                            zone=Zone.OVERLAP,
                        ),
                        [
                            ev.WorkerAdded(
                                worker=wid, gpus=gpus, role=Role.DECODE, zone=Zone.OVERLAP
                            ),
                            ev.ActivityChanged(worker=wid, activity=Activity.ACTIVE),
                        ],
                    )
                )
        else:
            steps += [
                (
                    Step(op=StepOp.ACTIVATE, worker=w.id),
                    [ev.ActivityChanged(worker=w.id, activity=Activity.ACTIVE)],
                )
                for w in overlap
            ]
        yield from self._run_plan("training-finished", steps)
        assert b.phase is TrainingPhase.IDLE

    def _gpus_join(self) -> Iterator[list[Any]]:
        absent = sorted(set(PREEMPTIBLE) - self.b.present_gpus - self.b.reclaiming_gpus)
        if len(absent) < TP:
            return
        k = self.rng.randrange(1, min(4, len(absent) // TP) + 1) * TP
        yield self._emit([ev.GpusAdded(gpus=tuple(absent[:k]))])
        yield from self._grow(tuple(absent[:k]), "gpus-added")
        # rebalance: switch one decode worker to prefill (drain, change role, resume)
        decode = [
            w
            for w in self.b.workers.values()
            if w.role is Role.DECODE and w.zone is Zone.DEDICATED and w.activity is Activity.ACTIVE
        ]
        if decode:
            w = self.rng.choice(decode)
            yield from self._run_plan(
                "ratio",
                [
                    (
                        Step(op=StepOp.SET_ROLE, worker=w.id, role=Role.PREFILL),
                        [
                            ev.ActivityChanged(worker=w.id, activity=Activity.TRANSITIONING),
                            ev.RoleChanged(worker=w.id, role=Role.PREFILL),
                            ev.ActivityChanged(worker=w.id, activity=Activity.ACTIVE),
                        ],
                    )
                ],
            )

    def _gpus_leave(self) -> Iterator[list[Any]]:
        present = sorted(self.b.present_gpus)
        if not present:
            return
        gone = tuple(self.rng.sample(present, self.rng.randrange(1, min(4, len(present)) + 1)))
        yield self._emit([ev.GpusReclaimed(gpus=gone)])
        owners = sorted({w.id for w in self.b.workers.values() if set(w.gpus) & set(gone)})
        steps = [
            (Step(op=StepOp.REMOVE, worker=wid), [ev.WorkerRemoved(worker=wid, reason="reclaimed")])
            for wid in owners
        ]
        if steps:
            yield from self._run_plan("gpus-reclaimed", steps)

    def _worker_fails(self) -> Iterator[list[Any]]:
        dedicated = [w for w in self.b.workers.values() if w.zone is Zone.DEDICATED]
        if not dedicated:
            return
        w = self.rng.choice(dedicated)
        yield self._emit(
            [ev.WorkerFailed(worker=w.id, reason="heartbeat lost", incarnation=w.incarnation)]
        )
        yield from self._run_plan(
            "worker-failed",
            [
                (
                    Step(op=StepOp.REMOVE, worker=w.id),
                    [ev.WorkerRemoved(worker=w.id, reason="failed")],
                )
            ],
        )


def realistic(n: int, seed: int = 0) -> list[Any]:
    """The first ``n`` records of a realistic stream."""
    return Workload(seed).records(n)


__all__ = ["Workload", "realistic"]
