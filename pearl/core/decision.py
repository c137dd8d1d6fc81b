"""PD Decision Engine (§4.3.2): enumerate, constrain, compare, hysteresis, forced switches.

``decide`` evaluates colocation (eq. 1) and every split N_P in [1, N-1] (eq. 2-3) of the N
available workers in one vectorised pass, drops splits that violate the §4.2 capacity constraints,
and picks the least predicted makespan. Against the ``current`` configuration it applies
mode-dependent hysteresis: a candidate replaces the current configuration only when its predicted
makespan is lower by more than ``mode_switch_threshold`` (colocated <-> disaggregated) or
``ratio_change_threshold`` (another N_P:N_D). A current configuration that is not valid for N
workers (wrong size, an empty role, violated constraints) is replaced by the best one regardless.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, overload

from pearl.core.makespan import EXCLUDED_BY, NO_WORKERS, Sweep, sweep
from pearl.core.profile import WorkloadProfile
from pearl.core.schema import Value
from pearl.core.state import Mode, Target

NO_PREDICTION = "no rollout worker in the budget: no makespan to predict"
"""Why a decision for an empty pool has no predicted makespan (a normal state, not an error)."""


class DecisionParams(Protocol):
    """The knobs ``decide`` reads; :class:`pearl.config.DecisionConfig` has them all."""

    @property
    def mode_switch_threshold(self) -> float: ...
    @property
    def ratio_change_threshold(self) -> float: ...
    @property
    def prefill_max_utilization(self) -> float: ...


class Alternative(Value, frozen=True, kw_only=True):
    """One configuration the engine considered."""

    mode: Mode
    N_P: int
    N_D: int
    N_C: int
    predicted_makespan_s: float
    feasible: bool
    excluded_by: str | None = None

    @property
    def target(self) -> Target:
        return Target(mode=self.mode, N_P=self.N_P, N_D=self.N_D, N_C=self.N_C)

    def to_json(self) -> dict[str, Any]:
        return {
            "mode": self.mode.value,
            "N_P": self.N_P,
            "N_D": self.N_D,
            "N_C": self.N_C,
            "predicted_makespan_s": finite_or_none(self.predicted_makespan_s),
            "feasible": self.feasible,
            "excluded_by": self.excluded_by,
        }


class Alternatives(Sequence[Alternative]):
    """Colocation first, then N_P = 1 .. N-1, built on access from the sweep's arrays.

    Materialising a thousand records would cost more than the decision itself.
    """

    __slots__ = ("_sweep",)

    def __init__(self, s: Sweep) -> None:
        self._sweep = s

    def __len__(self) -> int:
        return 1 + int(self._sweep.N_P.size)

    @overload
    def __getitem__(self, i: int) -> Alternative: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[Alternative]: ...

    def __getitem__(self, i: int | slice) -> Alternative | Sequence[Alternative]:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"alternative {i} out of range ({n})")
        s = self._sweep
        if i == 0:
            ok = s.N >= 1
            return Alternative(
                mode=Mode.COLOCATED,
                N_P=0,
                N_D=0,
                N_C=max(s.N, 0),
                predicted_makespan_s=s.T_coloc,
                feasible=ok,
                excluded_by=None if ok else NO_WORKERS,
            )
        n_p = int(s.N_P[i - 1])
        code = int(s.excluded[i - 1])
        return Alternative(
            mode=Mode.DISAGGREGATED,
            N_P=n_p,
            N_D=s.N - n_p,
            N_C=0,
            predicted_makespan_s=float(s.T_dis[i - 1]),
            feasible=code == 0,
            excluded_by=EXCLUDED_BY[code],
        )

    def __iter__(self) -> Iterator[Alternative]:
        return (self[k] for k in range(len(self)))

    def feasible(self) -> list[Alternative]:
        return [a for a in self if a.feasible]

    def __repr__(self) -> str:
        return f"Alternatives(N={self._sweep.N}, {len(self)} configurations)"


@dataclass(frozen=True, slots=True)
class Decision:
    """The engine's answer: the target, its predicted makespan, what else it weighed and why."""

    target: Target
    predicted_makespan_s: float
    alternatives: Alternatives
    reason: str
    forced: bool = False

    def to_json(self) -> dict[str, Any]:
        t = self.target
        return {
            "mode": t.mode.value,
            "N_P": t.N_P,
            "N_D": t.N_D,
            "N_C": t.N_C,
            "predicted_makespan_s": finite_or_none(self.predicted_makespan_s),
            "reason": self.reason,
            "forced": self.forced,
            "alternatives": [a.to_json() for a in self.alternatives],
        }


def keeping_roles(d: Decision, current: Target) -> Decision:
    """``d`` restricted to targets that keep every current worker's role: the best feasible
    alternative of ``current``'s mode with at least its prefill and decode workers (borrowed
    workers then only add capacity; re-roling the dedicated pool for a training-idle window
    of seconds would be undone at the return). ``d`` itself when it already keeps them, when no
    alternative does, or when it is forced (the current configuration is infeasible)."""
    t = d.target
    if d.forced:  # the current configuration is infeasible (a role missing): fix it now
        return d

    def keeps(a: Target) -> bool:
        if current.N == 0 or a.mode is not current.mode:
            return current.N == 0
        return a.N_P >= current.N_P and a.N_D >= current.N_D and a.N_C >= current.N_C

    if keeps(t):
        return d
    fits = [a for a in d.alternatives if a.feasible and keeps(a.target)]
    if not fits:
        return d
    best = min(fits, key=lambda a: a.predicted_makespan_s)
    reason = f"borrowing keeps the dedicated roles ({current}); unconstrained: {t} ({d.reason})"
    return Decision(
        target=best.target,
        predicted_makespan_s=best.predicted_makespan_s,
        alternatives=d.alternatives,
        reason=reason,
        forced=d.forced,
    )


def finite_or_none(x: float) -> float | None:
    """``x`` where it is a prediction (finite), None where there is none (an empty pool's inf,
    or NaN): what leaves the core, never ``inf`` (JSON has none; it would read back as null)."""
    return float(x) if math.isfinite(x) else None


def _predicted(s: Sweep, t: Target) -> tuple[float, str | None]:
    """Predicted makespan of ``t`` in the sweep, and why it is not valid (None: valid)."""
    if t.N != s.N:
        return float("inf"), f"{t} has {t.N} workers, the budget is {s.N}"
    if t.mode is Mode.COLOCATED:
        if t.N_P or t.N_D:
            return float("inf"), f"colocated target {t!r} has prefill or decode workers"
        return s.T_coloc, None
    if t.N_C or t.N_P < 1 or t.N_D < 1:
        return float("inf"), f"{t} is not a full split (needs N_P, N_D >= 1 and N_C = 0)"
    i = t.N_P - 1
    code = int(s.excluded[i])
    if code:
        return float("inf"), f"{t} violates {EXCLUDED_BY[code]}"
    return float(s.T_dis[i]), None


def _best_of_mode(s: Sweep, mode: Mode) -> tuple[Target, float] | None:
    """The best feasible configuration of ``mode`` for the sweep's N, if any."""
    if mode is Mode.COLOCATED:
        return _coloc(s.N), s.T_coloc
    i = s.best_split()
    return None if i is None else (_split(s.N, int(s.N_P[i])), float(s.T_dis[i]))


def _coloc(N: int) -> Target:
    return Target(mode=Mode.COLOCATED, N_P=0, N_D=0, N_C=N)


def _split(N: int, n_p: int) -> Target:
    return Target(mode=Mode.DISAGGREGATED, N_P=n_p, N_D=N - n_p, N_C=0)


def best_makespan(profile: WorkloadProfile, N: int, max_util: float) -> tuple[Target, float]:
    """The feasible configuration of N workers with the least predicted makespan (no hysteresis).

    Ties go to colocation, then to the fewest prefill workers. N = 0: empty target, inf.
    """
    s = sweep(profile, N, max_util)
    return _best(s)


def _best(s: Sweep) -> tuple[Target, float]:
    i = s.best_split()
    if i is not None and s.T_dis[i] < s.T_coloc:
        return _split(s.N, int(s.N_P[i])), float(s.T_dis[i])
    return _coloc(max(s.N, 0)), s.T_coloc


def decide(
    profile: WorkloadProfile, N: int, current: Target | None, cfg: DecisionParams
) -> Decision:
    """PD Decision Engine (§4.3.2): the target configuration for N available workers."""
    if N < 0:
        raise ValueError(f"worker count must be >= 0, got {N}")
    s = sweep(profile, N, cfg.prefill_max_utilization)
    alts = Alternatives(s)
    if N == 0:
        return Decision(
            target=_coloc(0),
            predicted_makespan_s=float("inf"),
            alternatives=alts,
            reason=NO_PREDICTION,
        )
    best, t_best = _best(s)
    if current is None:
        return Decision(target=best, predicted_makespan_s=t_best, alternatives=alts, reason="best")
    t_cur, invalid = _predicted(s, current)
    if invalid is not None and current.N != N:
        # The budget changed: the old configuration cannot be kept, but its mode can. Switching
        # mode re-roles every worker, so it must still clear the mode-switch threshold.
        same = _best_of_mode(s, current.mode)
        if same is not None:
            tgt, t = same
            gain = _gain(t, t_best)
            if best.mode is current.mode or gain <= cfg.mode_switch_threshold:
                return Decision(
                    target=tgt,
                    predicted_makespan_s=t,
                    alternatives=alts,
                    reason=f"budget {current.N} -> {N}: kept {tgt.mode} "
                    f"mode as {tgt} (switch gain {_pct(gain)})",
                )
            return Decision(
                target=best,
                predicted_makespan_s=t_best,
                alternatives=alts,
                reason=f"budget {current.N} -> {N}: {best} over {tgt} "
                f"(gain {_pct(gain)} > {_pct(cfg.mode_switch_threshold)})",
            )
    if invalid is not None:
        return Decision(
            target=best,
            predicted_makespan_s=t_best,
            alternatives=alts,
            reason=f"forced: {invalid}",
            forced=True,
        )
    if current == best:
        return Decision(
            target=best, predicted_makespan_s=t_best, alternatives=alts, reason="best: kept"
        )
    # Each candidate must beat the current configuration by its own threshold: the best of the
    # other mode by the mode-switch threshold, the best of the same mode by the ratio threshold.
    i = s.best_split()
    candidates: list[tuple[float, Target, float]] = []
    if current.mode is Mode.COLOCATED:
        if i is not None:
            candidates.append(
                (float(s.T_dis[i]), _split(N, int(s.N_P[i])), cfg.mode_switch_threshold)
            )
    else:
        candidates.append((s.T_coloc, _coloc(N), cfg.mode_switch_threshold))
        if i is not None and int(s.N_P[i]) != current.N_P:
            candidates.append(
                (float(s.T_dis[i]), _split(N, int(s.N_P[i])), cfg.ratio_change_threshold)
            )
    passing = [(t, tgt, thr) for t, tgt, thr in candidates if _gain(t_cur, t) > thr]
    if passing:
        t, tgt, thr = min(passing, key=lambda c: c[0])
        return Decision(
            target=tgt,
            predicted_makespan_s=t,
            alternatives=alts,
            reason=f"best: {tgt} over {current} (gain {_pct(_gain(t_cur, t))} > {_pct(thr)})",
        )
    t, tgt, thr = min(candidates, key=lambda c: c[0])
    return Decision(
        target=current,
        predicted_makespan_s=t_cur,
        alternatives=alts,
        reason=f"hysteresis: kept {current} (gain {_pct(_gain(t_cur, t))} <= {_pct(thr)})",
    )


def _gain(t_cur: float, t_new: float) -> float:
    """Relative makespan reduction of moving from t_cur to t_new."""
    return (t_cur - t_new) / t_cur if t_cur > 0 else 0.0


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


__all__ = [
    "Alternative",
    "Alternatives",
    "Decision",
    "DecisionParams",
    "NO_PREDICTION",
    "best_makespan",
    "decide",
    "finite_or_none",
]
