"""Simulated executors: each controller command changes the rollout cluster and, after the
operation's latency (Table 3 and :class:`pearl.sim.scenario.ReconfigCosts`), answers with a
``StepResult``.

- ``StartWorker``: a new worker prepares in the background (``prepare_s``), loads the current
  weight version from a peer at the link rate (lazy weight propagation, §4.5: the newest snapshot
  after init), then the finalization (``finalize_s``) updates routing, pausing admission of new
  requests cluster-wide while requests already running continue (§6.5.2). It serves once the
  plan commits, or, joining in the background (``background``), once its ``WorkerUp`` arrives.
- ``ActivateWorker``: a retained overlap worker restores its device state (``activate_s``) and
  loads the version training just produced from the trainer on its own GPUs' node (NVLink).
- ``StopWorker`` / ``DeactivateWorker`` / ``SetRole``: in-flight requests are aborted at once,
  keeping their generated prefixes, and resubmitted elsewhere; the GPUs come back after
  ``remove_s`` / ``deactivate_s``, the new role after ``role_switch_s``.
- ``LendTraining`` / ``ReclaimTraining``: the trainer's side of a hand-off.

Commands issued at the very start of a run complete at once: the run begins with the job's
initial workers already serving.
"""

from __future__ import annotations

from pearl.core import commands as cmd
from pearl.core.state import Role
from pearl.sim import clock as ck
from pearl.sim.clock import Clock
from pearl.sim.rollout import Rollout
from pearl.sim.scenario import ReconfigCosts


class Executors:
    """Turns step commands into cluster changes and timed ``StepResult`` events."""

    def __init__(self, clock: Clock, rollout: Rollout, costs: ReconfigCosts, t0: float) -> None:
        self.clock = clock
        self.rollout = rollout
        self.costs = costs
        self.t0 = t0
        self.retained: dict[int, Role] = {}  # overlap workers kept inactive: id -> role
        self.preparing: dict[int, int] = {}  # worker id -> incarnation being started
        self.ops: dict[str, int] = {}
        self.gpus: dict[int, tuple[int, ...]] = {}  # worker id -> its GPU binding

    def _latency(self, seconds: float) -> float:
        return 0.0 if self.clock.now <= self.t0 else seconds

    def _answer(self, c: cmd.PlanStep, seconds: float, cancel: bool = False) -> None:
        if c.plan == 0:
            return  # not part of a plan: nobody waits for an answer
        lat = self._latency(seconds)
        result = cmd.StepResult(plan=c.plan, step=c.step, ok=True, cancel=cancel, duration_s=lat)
        self.clock.at(self.clock.now + lat, ck.STEP, result)
        name = type(c).__name__
        self.ops[name] = self.ops.get(name, 0) + 1

    def command(self, c: cmd.Command) -> None:
        ro, k = self.rollout, self.costs
        if isinstance(c, cmd.StartWorker):
            ro.add_worker(c.worker, c.role, c.gpus)
            self.preparing[c.worker] = c.incarnation
            self.gpus[c.worker] = c.gpus
            prep = k.prepare_s + ro.costs.weight_sync_s()
            lat = self._latency(prep + k.finalize_s)
            if lat > 0:
                self.clock.at(self.clock.now + prep, ck.PAUSE, (c.worker, c.incarnation))
            if c.background:  # the plan is over; the worker serves once it says it is up
                up = cmd.WorkerUp(worker=c.worker, incarnation=c.incarnation)
                self.clock.at(self.clock.now + lat, ck.STEP, up)
                self.ops["StartWorker"] = self.ops.get("StartWorker", 0) + 1
            else:
                self._answer(c, prep + k.finalize_s)
        elif isinstance(c, cmd.ActivateWorker):
            ro.add_worker(c.worker, c.role, self.gpus.get(c.worker, ()))
            self.retained.pop(c.worker, None)
            self._answer(c, k.activate_s + ro.costs.weight_sync_s(intra_node=True))
        elif isinstance(c, cmd.StopWorker):
            ro.remove_worker(c.worker)
            self.preparing.pop(c.worker, None)
            self.retained.pop(c.worker, None)
            self._answer(c, k.remove_s, cancel=c.cancel)
        elif isinstance(c, cmd.DeactivateWorker):
            w = ro.workers.get(c.worker)
            if w is not None:
                self.retained[c.worker] = w.role
            ro.remove_worker(c.worker)
            self.preparing.pop(c.worker, None)
            self._answer(c, k.deactivate_s, cancel=c.cancel)
        elif isinstance(c, cmd.SetRole):
            ro.set_role(c.worker, c.role)
            self._answer(c, k.role_switch_s)
        elif isinstance(c, cmd.LendTraining):
            self._answer(c, k.lend_s)
        elif isinstance(c, cmd.ReclaimTraining):
            self._answer(c, k.reclaim_s)
        else:
            raise TypeError(f"not an executor command: {type(c).__name__}")

    def on_pause(self, worker: int, incarnation: int) -> None:
        """A joiner finished preparing: its finalization pauses admission of new requests."""
        if self.preparing.get(worker) == incarnation and worker in self.rollout.workers:
            self.rollout.pause(self.clock.now + self.costs.finalize_s)


STEP_COMMANDS = cmd.STEP_COMMANDS

__all__ = ["STEP_COMMANDS", "Executors"]
