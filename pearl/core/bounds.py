"""Bounds on the numbers PEARL takes from outside: GPU ids, training steps, weights versions,
preemption deadlines and a virtual device's share of a core.

Checked at the edge, before anything is expanded or logged: :func:`pearl.config.parse_gpus`
(config files, ``--gpus``, Ray node labels) checks a range before it expands it, and
:func:`check_event` runs where an elastic event enters pearld (the API's ``event`` message, the
embedded Runtime) and where a weights version arrives. A log record must stay encodable (msgpack
holds ints up to 2**64 - 1) and every step has a next one, so steps and versions stop at
2**63 - 1; training steps count from 1 (``training-begin`` step 0 never ran in PEARL).
"""

from __future__ import annotations

import math

from pearl.core import events as ev
from pearl.core.errors import ConfigError, SchemaError

MAX_GPU_ID = (1 << 20) - 1  # GPU ids are 0..1,048,575
MAX_GPUS = 1 << 16  # at most 65,536 GPU ids in one list
MAX_STEP = (1 << 63) - 1  # training steps are 1..2**63 - 1
MAX_VERSION = (1 << 63) - 1  # weights versions are 0..2**63 - 1
MAX_DEADLINE = float(1 << 34)  # a Unix time before the year 2514


def gpu_ids_problem(gpus: object) -> str | None:
    """Why ``gpus`` is not a list of GPU ids within bounds, or None."""
    if not isinstance(gpus, list | tuple):
        return f"expected a list of GPU ids, got {type(gpus).__name__}"
    if len(gpus) > MAX_GPUS:
        return f"{len(gpus)} GPU ids, at most {MAX_GPUS} in one list"
    for g in gpus:
        if not isinstance(g, int) or isinstance(g, bool):
            return f"GPU id {g!r} is not an int"
        if not 0 <= g <= MAX_GPU_ID:
            return f"GPU id {g} is out of range: GPU ids are 0-{MAX_GPU_ID}"
    return None


def _int_problem(name: str, value: object, lo: int, hi: int) -> str | None:
    if not isinstance(value, int) or isinstance(value, bool):
        return f"{name} {value!r} is not an int"
    if not lo <= value <= hi:
        top = "2**63 - 1" if hi == (1 << 63) - 1 else str(hi)
        return f"{name} {value} is out of range: {name}s run from {lo} to {top}"
    return None


def step_problem(step: object) -> str | None:
    """Why ``step`` is not a training step (1..2**63 - 1), or None."""
    return _int_problem(name="training step", value=step, lo=1, hi=MAX_STEP)


def version_problem(version: object) -> str | None:
    """Why ``version`` is not a weights version (0..2**63 - 1), or None."""
    return _int_problem(name="weights version", value=version, lo=0, hi=MAX_VERSION)


def deadline_problem(deadline: object) -> str | None:
    """Why ``deadline`` is not a Unix time PEARL can wait for, or None."""
    if not isinstance(deadline, int | float) or isinstance(deadline, bool):
        return f"deadline {deadline!r} is not a number"
    if not (math.isfinite(deadline) and 0 <= deadline <= MAX_DEADLINE):
        return f"deadline {deadline} is out of range: a Unix time in seconds, 0..{MAX_DEADLINE:.0f}"
    return None


def event_fault(record: object) -> tuple[str, str] | None:
    """``(field, why)`` when an elastic event or ``weights-published`` holds a number out of
    bounds, or a GPU event names no GPU; None when it is within bounds."""
    if isinstance(
        record, ev.GpusAdded | ev.GpusReclaimed | ev.GpusReclaiming | ev.GpusReclaimCancelled
    ):
        why = gpu_ids_problem(record.gpus)
        if why is None and not len(record.gpus):
            why = "no GPU id given: name at least one GPU"
        if why is not None:
            return "gpus", why
        if isinstance(record, ev.GpusReclaiming):
            why = deadline_problem(record.deadline)
            return None if why is None else ("deadline", why)
        return None
    if isinstance(record, ev.TrainingBegin | ev.TrainingFinished):
        why = step_problem(record.step)
        if why is not None:
            return "step", why
        if isinstance(record, ev.TrainingFinished) and record.weights_version is not None:
            why = version_problem(record.weights_version)
            return None if why is None else ("weights_version", why)
        return None
    if isinstance(record, ev.WeightsPublished):
        why = version_problem(record.version)
        return None if why is None else ("version", why)
    return None


def event_problem(record: object) -> str | None:
    """Why an elastic event or ``weights-published`` is out of bounds (:func:`event_fault`), or
    None."""
    fault = event_fault(record)
    return None if fault is None else fault[1]


def check_event(record: object) -> None:
    """Refuse, in one line, a record with a number out of bounds."""
    why = event_problem(record)
    if why is not None:
        raise SchemaError(f"{why}; nothing was logged")


def check_share(share: float, where: str = "device_share") -> float:
    """A virtual device's share of one core (:mod:`pearl.engines.device`): in (0, 1]."""
    if isinstance(share, bool) or not isinstance(share, int | float) or not 0.0 < share <= 1.0:
        raise ConfigError(
            f"{where} = {share!r}: a device's share of one core must be in (0, 1] "
            "(0.2 = a fifth of a core per slot)"
        )
    return float(share)


def check_fits(share: float, slots: int, cores: int, where: str = "device_share") -> None:
    """``slots`` devices of ``share`` core each must fit in ``cores``: slots x share <= cores."""
    check_share(share, where)
    if slots * share > cores + 1e-9:
        raise ConfigError(
            f"{where} = {share:g}: {slots} slots x {share:g} core = {slots * share:.2f} cores, "
            f"more than the {cores} cores here; a slot would no longer be a device of fixed "
            f"throughput. Use at most {cores / slots:.3f} (or fewer slots)"
        )


__all__ = [
    "MAX_DEADLINE",
    "MAX_GPUS",
    "MAX_GPU_ID",
    "MAX_STEP",
    "MAX_VERSION",
    "check_event",
    "check_fits",
    "check_share",
    "deadline_problem",
    "event_fault",
    "event_problem",
    "gpu_ids_problem",
    "step_problem",
    "version_problem",
]
