"""The two executors of the orchestration plan (§4.5, §4.6), as thin translators.

The InterScaleRebuilder runs the dedicated zone's steps: a new worker host is spawned and given
its ``start-worker`` command; a leaving one is told to stop (it aborts its requests keeping their
generated prefixes, reports, and exits) and is not restarted; a role switch goes to the worker.
The IntraScaleToggleManager runs the overlap zone's: retained overlap workers are activated or
deactivated in place (process retention), and the training GPUs are lent or reclaimed through the
trainer when one is connected (otherwise the trainer manages its memory itself and the step is
done at once).
"""

from __future__ import annotations

from actors import names
from actors.base import Directory, PearlActor
from actors.supervisor import Deliver, Retire, Spawn
from pearl.core import commands as cmd


def _result(c: cmd.PlanStep, ok: bool = True, error: str = "") -> cmd.StepResult:
    return cmd.StepResult(
        plan=c.plan, step=c.step, ok=ok, error=error, cancel=getattr(c, "cancel", False)
    )


class InterScaleRebuilder(PearlActor):
    name = names.REBUILDER

    def __init__(self, directory: Directory) -> None:
        super().__init__()
        self.directory = directory

    def on_start_worker(self, c: cmd.StartWorker) -> None:
        self.directory.tell(names.SUPERVISOR, Spawn(c))

    def on_stop_worker(self, c: cmd.StopWorker) -> None:
        # A plan step is answered by the worker itself (or, when forced, once it is gone); a stop
        # beside any plan (a reclaimed worker leaving now) is answered when its host has exited.
        gone = cmd.WorkerDown(worker=c.worker, incarnation=c.incarnation, reason="stopped")
        report = _result(c) if c.plan else gone
        ref = self.directory.find(names.worker_name(c.worker))
        if ref is not None and not c.force and self.directory.tell(ref.name, c):
            # A plan's step is answered by the host, or by the supervisor if the host dies first.
            retire = (
                Retire(c.worker, fallback=_result(c)) if c.plan else Retire(c.worker, report=gone)
            )
            self.directory.tell(names.SUPERVISOR, retire)
        else:
            retire = Retire(c.worker, force=True, report=report, incarnation=c.incarnation)
            self.directory.tell(names.SUPERVISOR, retire)

    def on_set_role(self, c: cmd.SetRole) -> None:
        if not self.directory.tell(names.worker_name(c.worker), c):
            # A host still starting (a joiner in the background) switches once it is up.
            self.directory.tell(names.SUPERVISOR, Deliver(c))

    handles = {
        cmd.StartWorker: on_start_worker,
        cmd.StopWorker: on_stop_worker,
        cmd.SetRole: on_set_role,
    }


class IntraScaleToggleManager(PearlActor):
    name = names.TOGGLE

    def __init__(self, directory: Directory) -> None:
        super().__init__()
        self.directory = directory

    def activate(self, c: cmd.ActivateWorker) -> None:
        if not self.directory.tell(names.worker_name(c.worker), c):
            self.directory.tell(names.SUPERVISOR, Spawn(c))  # no retained process: cold start

    def deactivate(self, c: cmd.DeactivateWorker) -> None:
        name = names.worker_name(c.worker)
        if c.force and self.directory.find(name) is not None:
            # Out of time: the GPUs come back by ending the process.
            self.directory.tell(names.SUPERVISOR, Retire(c.worker, force=True, report=_result(c)))
        elif not self.directory.tell(name, c):
            if c.cancel:  # a cold start still launching: end it, or it activates once it is up
                self.directory.tell(
                    names.SUPERVISOR, Retire(c.worker, force=True, report=_result(c))
                )
            else:
                self.directory.tell(names.ORCHESTRATOR, _result(c))  # nothing holds device memory

    def hand_off(self, c: cmd.LendTraining | cmd.ReclaimTraining) -> None:
        if not self.directory.tell(names.TRAINER, c):
            self.directory.tell(names.ORCHESTRATOR, _result(c))

    handles = {
        cmd.ActivateWorker: activate,
        cmd.DeactivateWorker: deactivate,
        cmd.LendTraining: hand_off,
        cmd.ReclaimTraining: hand_off,
    }


__all__ = ["InterScaleRebuilder", "IntraScaleToggleManager"]
