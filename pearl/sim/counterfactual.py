"""Counterfactual replay: what another policy would have decided on a recorded run.

A fresh :class:`pearl.core.controller.Controller` under the chosen policy is fed the recorded
inputs (elastic events, training steps, telemetry) at their reconstructed times
(:mod:`pearl.sim.fromlog`). Its executors answer every step command; while the replay has made
exactly the recorded decisions (every plan equal to the recorded plan of the same id) an answer
comes where the log shows it came, so a replay under the run's own policy reproduces the log's
controller records one for one. From the first plan that differs, answers come after each
operation's median latency in the recorded run (1 s where it never ran).

Not replayed: worker failures and restarts (the log says when a worker failed, not when its host
came back), and the rollout progress the gate reads (R, never logged: the gate sees R = B).
"""

from __future__ import annotations

import heapq
import statistics
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from pearl.config import Config
from pearl.core import commands as cmd
from pearl.core import events as ev
from pearl.core.controller import Controller, ControllerState, Output
from pearl.core.errors import ConfigError, PearlError
from pearl.core.policy import PD, Borrow, Policy
from pearl.core.profile import WorkloadProfile
from pearl.core.state import Activity, StepOp
from pearl.sim.fromlog import PREEMPTIBLE, Recorded, Summary, summarize


@dataclass(frozen=True)
class Choice:
    """A replayable policy: the controller's PD and borrowing choices, and whether it follows
    the preemptible GPUs (a fixed pool ignores gpus-added/-reclaimed)."""

    pd: PD
    borrow: Borrow
    elastic: bool = True


CHOICES: dict[str, Choice] = {
    "pearl": Choice(PD.ADAPTIVE, Borrow.GATED),
    "rlboost": Choice(PD.COLOCATED, Borrow.NEVER),
    "roll": Choice(PD.COLOCATED, Borrow.NEVER, elastic=False),
    "colocated": Choice(PD.COLOCATED, Borrow.GATED),
    "disaggregated": Choice(PD.DISAGGREGATED, Borrow.GATED),
    "no-borrow": Choice(PD.ADAPTIVE, Borrow.NEVER),
    "always-borrow": Choice(PD.ADAPTIVE, Borrow.ALWAYS),
}
ALIASES = {"rlboost+": "rlboost", "pearl-colocated": "colocated"}
OWN = "own"  # the recorded run's own policy (the config's daemon.pd and daemon.borrow)
DEFAULT_LATENCY_S = 1.0

_OPS: dict[type, StepOp] = {
    cmd.StartWorker: StepOp.ADD,
    cmd.ActivateWorker: StepOp.ACTIVATE,
    cmd.StopWorker: StepOp.REMOVE,
    cmd.DeactivateWorker: StepOp.DEACTIVATE,
    cmd.SetRole: StepOp.SET_ROLE,
    cmd.LendTraining: StepOp.LEND,
    cmd.ReclaimTraining: StepOp.RECLAIM,
}


def policy_of(cfg: Config) -> Policy:
    """The policy a pearld with this config runs (``daemon.pd``, ``daemon.borrow``)."""
    return Policy.of_config(cfg)


def choice(name: str, own: Policy) -> tuple[str, Policy, bool]:
    """(canonical name, policy, elastic) for a policy name; ``own`` is the run's policy."""
    key = ALIASES.get(name, name)
    if key == OWN:
        return OWN, own, True
    c = CHOICES.get(key)
    if c is None:
        known = ", ".join([OWN, *CHOICES, *ALIASES])
        raise ConfigError(f"unknown policy {name!r} for --from-log (known: {known})")
    p = Policy(own.decision, pd=c.pd, borrow=c.borrow, alpha=own.alpha, L_max=own.L_max)
    return key, p, c.elastic


@dataclass
class Replayed:
    """One policy's replay: the records its controller logged, with times, and what they say."""

    name: str
    records: list[tuple[float, Any]] = field(default_factory=list)
    summary: Summary = field(default_factory=Summary)
    diverged_at: float | None = None  # time of the first plan unlike the recorded one
    errors: list[str] = field(default_factory=list)
    unanswered: int = 0  # step commands still waiting when the log ended


def latencies(rec: Recorded) -> dict[StepOp, float]:
    """Median seconds per step operation in the recorded run: from the previous step-done of the
    same plan (or its plan-begin) to the step's own step-done; a joiner's (ADD) from its
    worker-added to its first activation (it may join in the background, its step done at
    launch)."""
    began: dict[int, tuple[float, Any]] = {}
    last: dict[int, float] = {}
    added: dict[int, float] = {}
    seen: dict[StepOp, list[float]] = {}
    for seq, r in rec.records:
        t = rec.times[seq]
        if isinstance(r, ev.PlanBegin):
            began[r.plan], last[r.plan] = (t, r), t
        elif isinstance(r, ev.WorkerAdded):
            added[r.worker] = t
        elif isinstance(r, ev.ActivityChanged) and r.activity is Activity.ACTIVE:
            if r.worker in added:
                seen.setdefault(StepOp.ADD, []).append(max(0.0, t - added.pop(r.worker)))
        elif isinstance(r, ev.StepDone) and r.plan in began:
            op = began[r.plan][1].steps[r.step].op
            if op is not StepOp.ADD:
                seen.setdefault(op, []).append(max(0.0, t - last[r.plan]))
            last[r.plan] = t
    return {op: statistics.median(v) for op, v in seen.items()}


class _Driver:
    def __init__(self, rec: Recorded, name: str, policy: Policy, elastic: bool) -> None:
        self.rec, self.elastic = rec, elastic
        self.ctl = Controller(policy)
        self.out = Replayed(name)
        self.heap: list[tuple[float, float, int, Any]] = []
        self.n = 0  # tie-breaker
        self.now, self.pos = 0.0, float(rec.start) - 0.5
        self.latency = latencies(rec)
        outs = rec.outputs
        self.plans = {r.plan: r for _, r in outs if isinstance(r, ev.PlanBegin)}
        self.done = {(r.plan, r.step): s for s, r in outs if isinstance(r, ev.StepDone)}
        self.aborts = {r.plan: s for s, r in outs if isinstance(r, ev.PlanAbort)}
        self.outs: list[tuple[int, Any]] = outs
        self.by_seq = dict(rec.records)
        self.waiting: set[tuple[int, int]] = set()

    def push(self, t: float, order: float, event: Any) -> None:
        self.n += 1
        heapq.heappush(self.heap, (t, order, self.n, event))

    def at_recorded(self, seq: int, nudge: float = 0.0) -> tuple[float, float]:
        return self.rec.times[seq], seq + nudge

    def modeled(self, op: StepOp | None) -> tuple[float, float]:
        lat = self.latency.get(op, DEFAULT_LATENCY_S) if op else DEFAULT_LATENCY_S
        return self.now + lat, self.pos + 1e-6

    def next_output(self, kind: type, worker: int, *activities: Activity) -> int | None:
        for s, r in self.outs:
            hit = s > self.pos and isinstance(r, kind) and getattr(r, "worker", None) == worker
            if hit and (not activities or getattr(r, "activity", None) in activities):
                return s
        return None

    def run(self, prior: WorkloadProfile) -> Replayed:
        s = self.apply(self.ctl.recover(self.rec.init, prior, 0.0))
        for seq, r in self.rec.inputs:
            if self.elastic or not isinstance(r, PREEMPTIBLE):
                self.push(self.rec.times[seq], float(seq), r)
        while self.heap:
            t, order, _, event = heapq.heappop(self.heap)
            self.now, self.pos = max(self.now, t), order
            if isinstance(event, cmd.StepResult) and event.plan != cmd.BESIDE:
                self.waiting.discard((event.plan, event.step))
            try:
                out = self.ctl.handle(s, event, self.now)
            except PearlError as e:
                self.out.errors.append(f"t={self.now:.1f}: {type(event).__name__}: {e}")
                continue
            s = self.apply(out)
        self.out.unanswered = len(self.waiting)
        self.out.summary = summarize(self.rec.init, self.out.records, self.rec.end)
        return self.out

    def apply(self, out: Output) -> ControllerState:
        for r in out.records:
            # While in step with the log, a record keeps the recorded one's time (records an
            # input caused are spread over the time that followed it, as in the log).
            seq = self.rec.start + len(self.out.records)
            same = self.in_sync and self.by_seq.get(seq) == r
            self.out.records.append((self.rec.times[seq] if same else self.now, r))
            fresh = isinstance(r, ev.PlanBegin) and self.plans.get(r.plan) != r
            if fresh and self.out.diverged_at is None:
                self.out.diverged_at = self.now
        for c in out.commands:
            self.answer(c, out.state)
        return out.state

    @property
    def in_sync(self) -> bool:
        return self.out.diverged_at is None

    def answer(self, c: Any, s: ControllerState) -> None:
        """Schedule the executor's answer to one command (see the module docstring)."""
        op = _OPS.get(type(c))
        if op is None:
            return  # SyncWeights, RoutingChanged, TrainingMayProceed: nothing to answer
        plan, step = c.plan, c.step
        if getattr(c, "background", False):  # a joiner in the background: up when it serves
            where = (
                self.next_output(ev.ActivityChanged, c.worker, Activity.ACTIVE)
                if self.in_sync
                else None
            )
            if self.in_sync and where is None:
                return  # it never served in the recorded run (removed first): nor here
            when = self.at_recorded(where) if where else self.modeled(op)
            self.push(*when, cmd.WorkerUp(worker=c.worker, incarnation=c.incarnation))
        elif plan > 0 and step >= 0:
            if getattr(c, "cancel", False):
                where = self.aborts.get(plan) if self.in_sync else None
                when = self.at_recorded(where, -0.5) if where else self.modeled(None)
                self.push(*when, cmd.StepResult(plan=plan, step=step, cancel=True))
            elif not getattr(c, "force", False):  # a forced re-send: the step is done already
                where = self.done.get((plan, step)) if self.in_sync else None
                self.waiting.add((plan, step))
                if self.in_sync and where is None:
                    return  # the recorded run never finished it: neither does the replay
                self.push(*(self.at_recorded(where) if where else self.modeled(op)),
                          cmd.StepResult(plan=plan, step=step))  # fmt: skip
        elif plan == cmd.BESIDE:
            where = (
                self.next_output(ev.ActivityChanged, c.worker, Activity.ACTIVE, Activity.INACTIVE)
                if self.in_sync
                else None
            )
            when = self.at_recorded(where) if where else self.modeled(op)
            self.push(*when, cmd.StepResult(plan=cmd.BESIDE, step=step))
        elif isinstance(c, cmd.StopWorker) and c.worker in s.evicting:
            where = self.next_output(ev.WorkerRemoved, c.worker) if self.in_sync else None
            when = self.at_recorded(where) if where else self.modeled(op)
            down = cmd.WorkerDown(worker=c.worker, incarnation=c.incarnation, reason="stopped")
            self.push(*when, down)


def replay(
    rec: Recorded, name: str, policy: Policy, elastic: bool, prior: WorkloadProfile
) -> Replayed:
    """Replay ``rec`` under ``policy`` from the profile ``prior`` (see the module docstring)."""
    return _Driver(rec=rec, name=name, policy=policy, elastic=elastic).run(prior)


def recorded_summary(rec: Recorded) -> Summary:
    return summarize(rec.init, _timed(rec), rec.end)


def _timed(rec: Recorded) -> Iterator[tuple[float, Any]]:
    for seq, r in rec.records:
        if seq >= rec.start:
            yield rec.times[seq], r


__all__ = ["ALIASES", "CHOICES", "OWN", "Choice", "Replayed", "choice", "latencies", "policy_of",
           "recorded_summary", "replay"]  # fmt: skip
