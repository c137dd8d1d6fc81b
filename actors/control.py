"""The small control actors around the Orchestrator: ElasticScheduler, RuntimeTracker and
DecisionEngine — each a thin shell around the pure core.

- ElasticScheduler receives elastic events (CLI, trainers, trace drivers), hands them to the
  Orchestrator and answers with the durable record's sequence number; it remembers which training
  step may proceed.
- RuntimeTracker gathers engine telemetry and rollout-step statistics and turns each step into one
  logged ``telemetry`` summary (least-squares A, b; prefill rate; bubble ratio) via
  :class:`pearl.core.profile.RuntimeTracker`.
- DecisionEngine answers "what would you choose for N workers" from the current profile.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from actors import names
from actors.base import Directory, PearlActor
from actors.messages import EngineTelemetryReport, RolloutStep, StateChanged
from pearl.core import commands as cmd
from pearl.core import events as ev
from pearl.core.bounds import check_event
from pearl.core.decision import DecisionParams, decide
from pearl.core.errors import PearlError
from pearl.core.profile import RuntimeTracker as Tracker
from pearl.core.profile import StepTelemetry, WorkloadProfile
from pearl.core.state import Target
from transports.protocol import Ack

log = logging.getLogger(__name__)


class ElasticScheduler(PearlActor):
    name = names.SCHEDULER

    def __init__(self, directory: Directory) -> None:
        super().__init__()
        self.directory = directory
        self.proceeded = 0

    def event(self, record: ev.LogRecord) -> Ack:
        try:
            # Events from the API were checked when decoded; those from inside the process (the
            # embedded Runtime, a weights upload) are checked here, before anything is logged.
            check_event(record)
            ack: Ack = self.directory.get(names.ORCHESTRATOR).ask(record)  # Ack(seq) once durable
            return ack
        except PearlError as e:  # its caller gets it too; pearld's log says it once, here
            log.warning("%s refused: %s", getattr(record, "KIND", type(record).__name__), e)
            raise

    def proceed(self, c: cmd.TrainingMayProceed) -> None:
        self.proceeded = max(self.proceeded, c.step)
        self.directory.tell(names.TRAINER, c)

    def ignore(self, _: StateChanged) -> None:
        return None

    handles = {
        **dict.fromkeys(ev.ELASTIC_EVENTS, event),
        ev.WeightsPublished: event,
        cmd.TrainingMayProceed: proceed,
        StateChanged: ignore,
    }


class RuntimeTracker(PearlActor):
    name = names.TRACKER

    def __init__(self, directory: Directory, alpha: float, L_max: float) -> None:
        super().__init__()
        self.directory, self.alpha, self.L_max = directory, alpha, L_max
        self.profile: WorkloadProfile | None = None
        self.decode: list[tuple[int, float]] = []
        self.prefill: list[tuple[int, float]] = []
        self.mixed: list[tuple[int, int, float]] = []

    def state_changed(self, msg: StateChanged) -> None:
        self.profile = msg.view.profile

    def engine(self, msg: EngineTelemetryReport) -> None:
        for it in msg.telemetry.iterations:
            if it.decode_batch and not it.prefill_tokens:
                self.decode.append((it.decode_batch, it.duration_s))
            elif it.prefill_tokens and not it.decode_batch:
                self.prefill.append((it.prefill_tokens, it.duration_s))
            elif it.prefill_tokens and it.decode_batch:  # chunked prefill riding on decode
                self.mixed.append((it.decode_batch, it.prefill_tokens, it.duration_s))

    def step(self, msg: RolloutStep) -> ev.Telemetry | None:
        if self.profile is None or not msg.trajectories:
            return None
        t = StepTelemetry(
            step=msg.step,
            trajectories=msg.trajectories,
            decode_batch=tuple(b for b, _ in self.decode),
            decode_s=tuple(s for _, s in self.decode),
            prefill_tokens=tuple(n for n, _ in self.prefill),
            prefill_s=tuple(s for _, s in self.prefill),
            active_fraction=msg.active_fraction,
            makespan_s=msg.makespan_s,
            in_flight=msg.in_flight,
            mixed_batch=tuple(n for n, _, _ in self.mixed),
            mixed_tokens=tuple(k for _, k, _ in self.mixed),
            mixed_s=tuple(s for _, _, s in self.mixed),
            start_spread_s=msg.start_spread_s,
        )
        self.decode, self.prefill, self.mixed = [], [], []
        summary = Tracker(self.profile, self.alpha, self.L_max).summarize(t)
        self.directory.tell(names.ORCHESTRATOR, summary)
        return summary

    handles = {EngineTelemetryReport: engine, RolloutStep: step, StateChanged: state_changed}


@dataclass(frozen=True)
class DecideQuery:
    N: int
    current: Target | None = None


class DecisionEngine(PearlActor):
    name = names.DECISION

    def __init__(self, params: DecisionParams) -> None:
        super().__init__()
        self.params = params
        self.profile: WorkloadProfile | None = None

    def state_changed(self, msg: StateChanged) -> None:
        self.profile = msg.view.profile

    def query(self, q: DecideQuery) -> dict[str, Any]:
        if self.profile is None:
            return {}
        return decide(profile=self.profile, N=q.N, current=q.current, cfg=self.params).to_json()

    handles = {StateChanged: state_changed, DecideQuery: query}


__all__ = ["DecideQuery", "DecisionEngine", "ElasticScheduler", "RuntimeTracker"]
