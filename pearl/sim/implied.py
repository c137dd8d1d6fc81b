"""What the paper's own measurements imply for borrowing, with no simulator in between.

§6.2 reports PEARL over RLBoost+ per segment (+5.9/+26.9/+10.6% for Qwen3-8B). Borrowing the 16
training GPUs is most of that gain, and its size follows from three figures the paper gives
elsewhere:

- §3.1: RLBoost+-style colocated rollout of a batch on 16, 24 and 32 GPUs takes 1, 0.897 and
  0.808 of the 16-GPU time (cuts of 10.3% and a further 8.9%), and 5.7x a training step of
  163.8 s on 8 GPUs at 16 GPUs (so 934 s);
- Table 3: an activation takes 6.26 s and a return 3.18 s (Qwen3-8B);
- §6.2: the dedicated rollout pool averages 13.6, 9.0 and 11.8 GPUs in S1, S2 and S3.

:func:`borrowing_gain` runs one steady-state step of an asynchronous (staleness 1), rollout-bound
job through those figures: the dedicated pool rolls out alone during the return, the training step
and the activation, then with the borrowed GPUs until the batch is done. Between and beyond §3.1's
three points the rollout time is read two ways, both through the points: piecewise linear (the
least gain from a small pool) and Amdahl's C + D / G fitted by least squares (the same family as
the simulator's scale-out curve). Nothing here is calibrated; everything is the paper's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pearl.sim.availability import SEGMENTS
from pearl.sim.calibration import PAPER_TRAIN_8GPU_S
from pearl.sim.scenario import TABLE3

# §3.1: rollout time of one batch on G GPUs, relative to 16 GPUs (cuts of 10.3% and 8.9%).
SECTION31_GPUS = (16.0, 24.0, 32.0)
SECTION31_TIME = (1.0, 1.0 - 0.103, 1.0 - 0.103 - 0.089)
SECTION31_ROLLOUT_OVER_TRAIN = 5.7  # at 16 rollout GPUs, training on 8 GPUs
FORMS = ("linear", "amdahl")
TRAINING_GPUS = 16  # §6.1: the borrowed pool is the 16 training GPUs


def rollout_time(gpus: float, form: str = "linear") -> float:
    """§3.1's rollout time on ``gpus`` GPUs relative to 16: piecewise linear through the three
    points (extended with the end slopes), or C + D / G fitted to them by least squares."""
    if gpus <= 0:
        raise ValueError(f"gpus must be > 0, got {gpus}")
    g, t = np.asarray(SECTION31_GPUS), np.asarray(SECTION31_TIME)
    if form == "linear":
        i = 0 if gpus <= g[1] else 1
        slope = (t[i + 1] - t[i]) / (g[i + 1] - g[i])
        return float(t[i] + slope * (gpus - g[i]))
    if form == "amdahl":
        design = np.column_stack([np.ones_like(g), 1.0 / g])
        c, d = np.linalg.lstsq(design, t, rcond=None)[0]
        return float(c + d / gpus)
    raise ValueError(f"unknown form {form!r}: one of {', '.join(FORMS)}")


@dataclass(frozen=True)
class Implied:
    """One steady-state step with and without borrowing (seconds) and the gain it implies."""

    pool_gpus: float
    form: str
    train_s: float
    rollout_s: float  # the batch on the dedicated pool alone
    speedup: float  # rollout rate with the borrowed GPUs over the pool's alone
    step_s: float  # with borrowing
    gain: float  # rollout_s / step_s - 1


def borrowing_gain(
    pool_gpus: float,
    *,
    form: str = "linear",
    borrowed_gpus: float = TRAINING_GPUS,
    train_s: float = PAPER_TRAIN_8GPU_S / 2,
    activation_s: float = TABLE3["qwen3-8b"].activate_s,
    deactivation_s: float = TABLE3["qwen3-8b"].deactivate_s,
) -> Implied:
    """The throughput gain from borrowing ``borrowed_gpus`` in every training-idle window.

    Without borrowing a step lasts the batch's rollout on the pool (the job is rollout-bound:
    the trainer waits). With it, the pool alone rolls out while the lent GPUs come back
    (``deactivation_s``, on the step's path: training cannot start before), while training runs
    and while they are activated again; the rest of the batch runs at the rate of the pool plus
    the borrowed GPUs. ``train_s`` defaults to §3.1's step on 8 GPUs halved for §6's 16.
    """
    if borrowed_gpus < 0 or train_s < 0 or activation_s < 0 or deactivation_s < 0:
        raise ValueError("borrowed_gpus, train_s and the hand-off times must be >= 0")
    rollout16 = SECTION31_ROLLOUT_OVER_TRAIN * PAPER_TRAIN_8GPU_S
    t_pool = rollout_time(pool_gpus, form)
    rollout_s = rollout16 * t_pool
    speedup = t_pool / rollout_time(pool_gpus + borrowed_gpus, form)
    alone = deactivation_s + train_s + activation_s
    if rollout_s <= alone:  # the batch is done before the borrowed GPUs could serve
        step_s = max(rollout_s, deactivation_s + train_s)
    else:
        step_s = alone + (rollout_s - alone) / speedup
    return Implied(
        pool_gpus=pool_gpus,
        form=form,
        train_s=train_s,
        rollout_s=rollout_s,
        speedup=speedup,
        step_s=step_s,
        gain=rollout_s / step_s - 1,
    )


def segment_range(segment: str, model: str = "qwen3-8b") -> tuple[Implied, Implied]:
    """The least and the largest gain over both readings of §3.1 and both training times
    (§3.1's step halved for 16 GPUs, or not sped up at all), for a segment's mean pool."""
    costs = TABLE3[model]
    pool = SEGMENTS[segment].mean_rollout_gpus
    runs = [
        borrowing_gain(
            pool,
            form=form,
            train_s=train,
            activation_s=costs.activate_s,
            deactivation_s=costs.deactivate_s,
        )
        for form in FORMS
        for train in (PAPER_TRAIN_8GPU_S / 2, PAPER_TRAIN_8GPU_S)
    ]
    return min(runs, key=lambda r: r.gain), max(runs, key=lambda r: r.gain)


__all__ = ["FORMS", "Implied", "borrowing_gain", "rollout_time", "segment_range"]
