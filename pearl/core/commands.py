"""What the controller asks executors to do, sent only after the records behind it are durable.

Every command that belongs to a plan step names ``(plan, step)``; the executor answers with a
:class:`StepResult` for that pair. Commands are idempotent for a given ``(plan, step)`` so that
recovery can simply re-send the ones whose step is not done.
"""

from __future__ import annotations

from typing import Any

from pearl.core.schema import Registry
from pearl.core.state import Role, Zone

COMMANDS = Registry("command")


@COMMANDS.register("start-worker")
class StartWorker:
    """Launch a worker host on ``gpus``, initialise the engine, sync the newest weights (ADD)."""

    worker: int
    incarnation: int
    gpus: tuple[int, ...]
    role: Role
    zone: Zone
    weights_version: int
    plan: int
    step: int


@COMMANDS.register("activate-worker")
class ActivateWorker:
    """Resume a retained overlap worker's device state in ``role`` at the newest weights."""

    worker: int
    role: Role
    weights_version: int
    plan: int
    step: int


@COMMANDS.register("stop-worker")
class StopWorker:
    """Stop routing, abort in-flight requests keeping their generated prefixes, return the GPUs."""

    worker: int
    plan: int = 0  # 0: not part of a plan (cancelled joiner, unknown worker)
    step: int = -1
    keep_partial: bool = True
    force: bool = False  # kill the host now: the GPUs must be returned regardless


@COMMANDS.register("deactivate-worker")
class DeactivateWorker:
    """Drain an overlap worker (aborting keeps prefixes), release its device memory, keep its process."""

    worker: int
    plan: int = 0
    step: int = -1
    keep_partial: bool = True
    force: bool = False


@COMMANDS.register("set-role")
class SetRole:
    """Drain or hand over in-flight work, then switch the worker's role."""

    worker: int
    role: Role
    plan: int
    step: int


@COMMANDS.register("lend-training")
class LendTraining:
    """The training worker releases device memory so rollout can borrow its GPUs."""

    worker: int
    plan: int
    step: int


@COMMANDS.register("reclaim-training")
class ReclaimTraining:
    """The training worker restores its device state on its GPUs."""

    worker: int
    plan: int
    step: int


@COMMANDS.register("training-may-proceed")
class TrainingMayProceed:
    """Every borrowed GPU is back: the trainer may run step ``step``."""

    step: int


@COMMANDS.register("routing-changed")
class RoutingChanged:
    """The routable set changed at a logged commit point (sequence ``seq``)."""

    seq: int


Command = Any  # any class registered in COMMANDS

__all__ = [
    "COMMANDS",
    "ActivateWorker",
    "Command",
    "DeactivateWorker",
    "LendTraining",
    "ReclaimTraining",
    "RoutingChanged",
    "SetRole",
    "StartWorker",
    "StopWorker",
    "TrainingMayProceed",
]
