"""Benefit-aware borrowing gate (§4.6, eq. 7).

Borrowing idle training GPUs pays an activation and a return (T_toggle, an EMA of measured costs
kept in the workload profile). With R of the B trajectories still running, it pays off when

    (R / B) (T_ded - T_full) > T_toggle,

where T_ded and T_full are the best predicted makespans (colocation or any feasible split) with
only the dedicated workers and with the dedicated plus all overlap workers.
"""

from __future__ import annotations

import math

from pearl.core.decision import DecisionParams, best_makespan
from pearl.core.profile import WorkloadProfile
from pearl.core.schema import struct


@struct
class GateResult:
    enabled: bool
    benefit_s: float  # (R / B) (T_ded - T_full)
    T_ded: float
    T_full: float
    T_toggle: float


def borrow_gate(profile: WorkloadProfile, N_ded: int, N_overlap: int, R: int,
                cfg: DecisionParams) -> GateResult:
    """Eq. 7: enable borrowing N_overlap workers only when the predicted saving on the R
    unfinished trajectories strictly exceeds T_toggle (at equality it stays off)."""
    if N_ded < 0 or N_overlap < 0:
        raise ValueError(f"worker counts must be >= 0, got {N_ded} dedicated, {N_overlap} overlap")
    if not 0 <= R <= profile.B:
        raise ValueError(f"remaining trajectories R = {R} must lie in [0, B = {profile.B}]")
    _, T_ded = best_makespan(profile, N_ded, cfg.prefill_max_utilization)
    _, T_full = best_makespan(profile, N_ded + N_overlap, cfg.prefill_max_utilization)
    saving = T_ded - T_full
    # No overlap workers or nothing left to run: no benefit (and no inf - inf or 0 * inf).
    nothing = N_overlap == 0 or R == 0 or math.isnan(saving)
    benefit = 0.0 if nothing else R / profile.B * saving
    return GateResult(enabled=benefit > profile.T_toggle, benefit_s=benefit, T_ded=T_ded,
                      T_full=T_full, T_toggle=profile.T_toggle)


__all__ = ["GateResult", "borrow_gate"]
