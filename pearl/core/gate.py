"""Benefit-aware borrowing gate (§4.6, eq. 7).

Borrowing idle training GPUs pays an activation and a return (T_toggle, an EMA of measured costs
kept in the workload profile). With R of the B trajectories still running, it pays off when

    (R / B) (T_ded - T_full) > T_toggle,

where T_ded and T_full are the best predicted makespans (colocation or any feasible split) with
only the dedicated workers and with the dedicated plus all overlap workers.

A borrow also has to fit the training-idle window it lives in: lent workers serve only after
activation, and Training Begin takes them back. Once the window has been measured (T_window > 0),
the gate declines when activation would eat more than ``WINDOW_FRACTION`` of it — the workers
would barely serve before they are returned, and the cycle would likely be aborted unfinished.
The same rule holds for this window when its end can be foreseen: the pipeline expects the next
batch complete (and Training Begin to follow) in ``window_left_s``, from the latency of the
groups it has seen finish. Windows differ a lot from step to step (an asynchronous pipeline
alternates long and nearly empty ones), so their mean alone approves borrows in windows that
close a few ms later, before anything was lent.
"""

from __future__ import annotations

import math

from pearl.core.borrow import Verdict
from pearl.core.decision import DecisionParams, best_makespan, finite_or_none
from pearl.core.profile import WorkloadProfile
from pearl.core.schema import Value

WINDOW_FRACTION = 0.5  # activation may use at most this share of the training-idle window


class GateResult(Value, frozen=True, kw_only=True):
    """The gate's verdict and the figures behind it. A figure with no prediction is None, never
    ``inf``: T_ded without dedicated workers, T_full without any worker, and then the benefit
    (borrowing is the only capacity); ``reason`` says which."""

    enabled: bool
    benefit_s: float | None  # (R / B) (T_ded - T_full); None: unbounded (no dedicated worker)
    T_ded: float | None  # None: no dedicated worker
    T_full: float | None  # None: no worker at all
    T_toggle: float
    T_window: float = 0.0  # measured training-idle window (0: not measured yet)
    window_left_s: float | None = None  # until the next batch is expected complete (None: unknown)
    reason: str = ""

    @property
    def verdict(self) -> Verdict:
        return Verdict.of(self.enabled)


def borrow_gate(
    profile: WorkloadProfile,
    N_ded: int,
    N_overlap: int,
    R: int,
    cfg: DecisionParams,
    *,
    window_left_s: float | None = None,
) -> GateResult:
    """Eq. 7: enable borrowing N_overlap workers only when the predicted saving on the R
    unfinished trajectories strictly exceeds T_toggle (at equality it stays off), and the
    activation fits the training-idle window (measured, and ``window_left_s`` when known)."""
    if N_ded < 0 or N_overlap < 0:
        raise ValueError(f"worker counts must be >= 0, got {N_ded} dedicated, {N_overlap} overlap")
    if window_left_s is not None and not window_left_s >= 0:
        raise ValueError(f"window_left_s must be >= 0 seconds, got {window_left_s}")
    if not 0 <= R <= profile.B:
        raise ValueError(f"remaining trajectories R = {R} must lie in [0, B = {profile.B}]")
    _, T_ded = best_makespan(profile, N_ded, cfg.prefill_max_utilization)
    _, T_full = best_makespan(profile, N_ded + N_overlap, cfg.prefill_max_utilization)
    saving = T_ded - T_full
    # No overlap workers or nothing left to run: no benefit (and no inf - inf or 0 * inf).
    nothing = N_overlap == 0 or R == 0 or math.isnan(saving)
    benefit = 0.0 if nothing else R / profile.B * saving
    T_toggle, W = profile.T_toggle, profile.T_window
    if math.isfinite(benefit):
        gain = f"benefit {benefit:.3g} s"
    else:  # T_ded = inf: without the borrowed workers nothing serves the R trajectories
        gain = "benefit unbounded (no dedicated rollout worker: T_ded has no prediction)"
    if benefit <= T_toggle:
        enabled, reason = False, f"{gain} <= T_toggle {T_toggle:.3g} s (eq. 7)"
    elif W > 0 and T_toggle > WINDOW_FRACTION * W:
        enabled = False
        reason = (
            f"activation T_toggle {T_toggle:.3g} s > {WINDOW_FRACTION:g} x the "
            f"{W:.3g} s training-idle window: lent workers would barely serve"
        )
    elif window_left_s is not None and T_toggle > WINDOW_FRACTION * window_left_s:
        enabled = False
        reason = (
            f"the next batch is expected complete in {window_left_s:.3g} s: activation "
            f"T_toggle {T_toggle:.3g} s > {WINDOW_FRACTION:g} x it, lent workers would barely serve"
        )
    else:
        enabled, reason = True, f"{gain} > T_toggle {T_toggle:.3g} s (eq. 7)"
    return GateResult(
        enabled=enabled,
        benefit_s=finite_or_none(benefit),
        T_ded=finite_or_none(T_ded),
        T_full=finite_or_none(T_full),
        T_toggle=T_toggle,
        T_window=W,
        window_left_s=window_left_s,
        reason=reason,
    )


__all__ = ["WINDOW_FRACTION", "GateResult", "borrow_gate"]
