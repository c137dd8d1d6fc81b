"""Messages between the controller and the executors.

Commands say what the controller asks executors to do; they are sent only after the records
behind them are durable. Every command that belongs to a plan step names ``(plan, step)`` and the
executor answers with a :class:`StepResult` for that pair. Commands are idempotent for a given
``(plan, step)`` so that recovery can simply re-send the ones whose step is not done.

Reports are what executors, supervisors and the pipeline tell the controller.
"""

from __future__ import annotations

from typing import Protocol, TypeAlias

from pearl.core.schema import Registry, WireStruct
from pearl.core.state import Role, Zone

COMMANDS = Registry("command")

BESIDE = -1
"""``plan`` of a hand-off step that runs beside the plan in flight (a return of borrowed GPUs
that must not wait for, or cancel, an expansion on other GPUs); its ``step`` names the worker."""


@COMMANDS.add
class StartWorker(WireStruct, tag="start-worker", frozen=True, kw_only=True):
    """Launch a worker host on ``gpus``, initialise the engine, sync the newest weights (ADD).

    ``background``: the step is done once the command is sent; the worker initialises in the
    background and reports ``WorkerUp`` when it can serve (or its host exits: a crash)."""

    worker: int
    incarnation: int
    gpus: tuple[int, ...]
    role: Role
    zone: Zone
    weights_version: int
    plan: int
    step: int
    background: bool = False


@COMMANDS.add
class ActivateWorker(WireStruct, tag="activate-worker", frozen=True, kw_only=True):
    """Resume a retained overlap worker's device state in ``role`` at the newest weights."""

    worker: int
    role: Role
    weights_version: int
    plan: int
    step: int


@COMMANDS.add
class StopWorker(WireStruct, tag="stop-worker", frozen=True, kw_only=True):
    """Stop routing, abort in-flight requests keeping their generated prefixes, return the GPUs."""

    worker: int
    plan: int = 0  # 0: not part of a plan (cancelled joiner, unknown worker)
    step: int = -1
    keep_partial: bool = True
    force: bool = False  # kill the host now: the GPUs must be returned regardless
    cancel: bool = False  # undoes a joiner of a cancelled expansion (answered with cancel=True)
    # The host to stop: one the log does not know (0: whichever host serves the worker). Its
    # worker-down names it, so it cannot fail the table's worker of the same id.
    incarnation: int = 0


@COMMANDS.add
class DeactivateWorker(WireStruct, tag="deactivate-worker", frozen=True, kw_only=True):
    """Drain an overlap worker (aborts keep prefixes), free its device memory, keep its process."""

    worker: int
    plan: int = 0
    step: int = -1
    keep_partial: bool = True
    force: bool = False
    cancel: bool = False


@COMMANDS.add
class SetRole(WireStruct, tag="set-role", frozen=True, kw_only=True):
    """Drain or hand over in-flight work, then switch the worker's role."""

    worker: int
    role: Role
    plan: int
    step: int


@COMMANDS.add
class LendTraining(WireStruct, tag="lend-training", frozen=True, kw_only=True):
    """The training worker releases device memory so rollout can borrow its GPUs."""

    worker: int
    plan: int
    step: int


@COMMANDS.add
class ReclaimTraining(WireStruct, tag="reclaim-training", frozen=True, kw_only=True):
    """The training worker restores its device state on its GPUs."""

    worker: int
    plan: int
    step: int


@COMMANDS.add
class SyncWeights(WireStruct, tag="sync-weights", frozen=True, kw_only=True):
    """Move a serving (or still initialising) worker to weights ``version`` (lazy propagation:
    workers that join later get the newest version with their start or activation)."""

    worker: int
    version: int


@COMMANDS.add
class TrainingMayProceed(WireStruct, tag="training-may-proceed", frozen=True, kw_only=True):
    """Every borrowed GPU is back: the trainer may run step ``step``."""

    step: int


@COMMANDS.add
class RoutingChanged(WireStruct, tag="routing-changed", frozen=True, kw_only=True):
    """The routable set changed at a logged commit point (sequence ``seq``)."""

    seq: int


# -- reports -------------------------------------------------------------------------------


@COMMANDS.add
class StepResult(WireStruct, tag="step-result", frozen=True, kw_only=True):
    """An executor finished (ok) or failed step ``step`` of ``plan`` (or its cancellation)."""

    plan: int
    step: int
    ok: bool = True
    error: str = ""
    cancel: bool = False
    duration_s: float = 0.0


@COMMANDS.add
class WorkerDown(WireStruct, tag="worker-down", frozen=True, kw_only=True):
    """A worker host died or stopped heart-beating; its supervisor will try to restart it."""

    worker: int
    incarnation: int
    reason: str


@COMMANDS.add
class WorkerUp(WireStruct, tag="worker-up", frozen=True, kw_only=True):
    """A worker host (re)registered and serves in the role the table gives it."""

    worker: int
    incarnation: int


@COMMANDS.add
class WorkerLost(WireStruct, tag="worker-lost", frozen=True, kw_only=True):
    """The supervisor gave up restarting a worker: remove it and keep its GPUs out for a while."""

    worker: int
    reason: str


@COMMANDS.add
class RolloutProgress(WireStruct, tag="rollout-progress", frozen=True, kw_only=True):
    """R of the current batch's B trajectories are not complete yet (for the borrowing gate).
    ``handed_out``: a batch was handed out since the last report, so R now counts the batch after
    it (inside a training-idle window, Training Begin follows). ``eta_s``: seconds until that
    batch is expected complete, from the latency of the groups finished so far (None: not known
    yet); inside a window it is how long the window has left."""

    remaining: int
    handed_out: bool = False
    eta_s: float | None = None


@COMMANDS.add
class Tick(WireStruct, tag="tick", frozen=True, kw_only=True):
    """Time passed: check step deadlines and quarantine expiry."""


Command: TypeAlias = (
    StartWorker
    | ActivateWorker
    | StopWorker
    | DeactivateWorker
    | SetRole
    | LendTraining
    | ReclaimTraining
    | SyncWeights
    | TrainingMayProceed
    | RoutingChanged
)
"""What the controller asks of executors and the trainer."""

Report: TypeAlias = StepResult | WorkerDown | WorkerUp | WorkerLost | RolloutProgress | Tick
"""What executors, supervisors and the pipeline tell the controller."""


class PlanStep(Protocol):
    """A command that is one step of a plan, answered by a :class:`StepResult` naming it."""

    @property
    def worker(self) -> int: ...

    @property
    def plan(self) -> int: ...

    @property
    def step(self) -> int: ...


STEP_COMMANDS = (
    StartWorker,
    ActivateWorker,
    StopWorker,
    DeactivateWorker,
    SetRole,
    LendTraining,
    ReclaimTraining,
)
"""The commands an executor answers with a :class:`StepResult` (they name a plan step)."""

__all__ = [
    "BESIDE",
    "COMMANDS",
    "ActivateWorker",
    "Command",
    "DeactivateWorker",
    "LendTraining",
    "PlanStep",
    "ReclaimTraining",
    "Report",
    "RolloutProgress",
    "RoutingChanged",
    "STEP_COMMANDS",
    "SetRole",
    "StartWorker",
    "StepResult",
    "StopWorker",
    "SyncWeights",
    "Tick",
    "TrainingMayProceed",
    "WorkerDown",
    "WorkerLost",
    "WorkerUp",
]
