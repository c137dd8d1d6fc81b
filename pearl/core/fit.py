"""Least-squares fits of per-iteration engine telemetry (§5): the costs of eq. 1-3.

:func:`fit_iterations` is what the Runtime Tracker uses: every scheduler iteration of the step,
iteration time = A + b * (sequences decoding) + t_prefill * (prompt tokens computed). Chunked
prefill rides on decode iterations, so most prefill work is in mixed iterations; fitting all of
them at once gives eq. 1's terms as the engine pays them (one fixed cost A per iteration, not one
per prefill chunk as total-time-over-tokens of pure prefill iterations would count it).

A slope is used only when it is statistically significant (t-statistic at least ``MIN_SLOPE_T``):
with many noisy samples a low R^2 still pins it down, while a narrow spread of batch sizes gives a
slope that is noise whatever its R^2. A slope that is not significant keeps the profile's value
and the rest is refitted around it; the level of the iteration time (A) is measured well either
way.

:func:`fit_decode` and :func:`fit_prefill` are the single-cost fits (pure decode, pure prefill
iterations) the engine benchmark reports.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from pearl.core.schema import Value

# |b| / SE(b) a decode fit needs to be used: ~p < 0.003 two-sided for the sample sizes a step has.
MIN_SLOPE_T = 3.0


class DecodeFit(Value, frozen=True, kw_only=True):
    """Least-squares fit of iteration time = A + b * batch size.

    ``t`` is the slope's t-statistic b / SE(b) of the unconstrained fit (0 when b was clamped to
    0; inf for an exact fit)."""

    A: float
    b: float
    r2: float
    n: int
    t: float = 0.0

    def significant(self, min_t: float = MIN_SLOPE_T) -> bool:
        """The slope is distinguishable from noise: b > 0 and t >= min_t."""
        return self.b > 0 and self.t >= min_t


def fit_decode(batch: Sequence[float], seconds: Sequence[float]) -> DecodeFit | None:
    """Fit A and b (both kept >= 0) with R^2 and the slope's t; None without two distinct batch
    sizes."""
    x = np.asarray(batch, dtype=float)
    y = np.asarray(seconds, dtype=float)
    if x.size < 2 or np.ptp(x) == 0:
        return None
    xm, ym = x.mean(), y.mean()
    dx = x - xm
    sxx = float(dx @ dx)
    b = float(dx @ (y - ym) / sxx)
    A = float(ym - b * xm)
    ols = y - (A + b * x)
    t = _slope_t(b=b, ssr=float(ols @ ols), sxx=sxx, n=int(x.size))
    if b < 0:  # decode never gets cheaper with more sequences: flat fit
        A, b, t = float(ym), 0.0, 0.0
    elif A < 0:  # no negative fixed cost: fit through the origin
        A, b = 0.0, float(x @ y / (x @ x))
    resid = y - (A + b * x)
    ss_tot = float((y - ym) @ (y - ym))
    r2 = 1.0 - float(resid @ resid) / ss_tot if ss_tot > 0 else 1.0
    return DecodeFit(A=A, b=b, r2=r2, n=int(x.size), t=t)


def _slope_t(b: float, ssr: float, sxx: float, n: int) -> float:
    """b / SE(b), SE(b)^2 = ssr / (n - 2) / sxx; 0 with too few samples to estimate the noise."""
    if n < 3:
        return 0.0
    var = ssr / (n - 2) / sxx
    if var <= 0:
        return math.inf if b > 0 else 0.0
    return b / math.sqrt(var)


def fit_iterations(
    decode: Sequence[float],
    prefill: Sequence[float],
    seconds: Sequence[float],
    A: float,
    b: float,
    t_prefill: float,
    min_t: float = MIN_SLOPE_T,
) -> tuple[float, float, float]:
    """(A, b, t_prefill) after one step's iterations: least squares of seconds = A + b decode +
    t_prefill prefill; a slope without spread in its samples or not significant keeps the given
    value; A < 0 refits the slopes through the origin. No samples: as given."""
    n = np.asarray(decode, dtype=float)
    p = np.asarray(prefill, dtype=float)
    y = np.asarray(seconds, dtype=float)
    if y.size == 0:
        return A, b, t_prefill
    values = {"b": b, "t_prefill": t_prefill}
    columns = {"b": n, "t_prefill": p}
    free = [k for k in columns if np.ptp(columns[k]) > 0]
    while True:
        target = y - sum(
            (values[k] * columns[k] for k in columns if k not in free), np.zeros_like(y)
        )
        coef, t = _ols([np.ones_like(y), *(columns[k] for k in free)], target)
        weak = [
            (t[i + 1], k) for i, k in enumerate(free) if not (coef[i + 1] > 0 and t[i + 1] >= min_t)
        ]
        if not weak:
            break
        free.remove(min(weak)[1])  # fix the least significant slope, refit the others
    fit_A = coef[0]
    if fit_A < 0 and free:  # no negative fixed cost: the slopes through the origin
        fit_A = 0.0
        coef, _ = _ols([columns[k] for k in free], target)
        coef = np.concatenate(([0.0], coef))
    for i, k in enumerate(free):
        if coef[i + 1] > 0:
            values[k] = float(coef[i + 1])
    return max(0.0, float(fit_A)), values["b"], values["t_prefill"]


def _ols(columns: Sequence[np.ndarray], y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Least-squares coefficients and their t-statistics (0 where the noise cannot be
    estimated: no more samples than coefficients; inf for an exact fit of a positive one)."""
    X = np.column_stack(columns)
    coef = np.linalg.lstsq(X, y, rcond=None)[0]
    dof = y.size - X.shape[1]
    if dof < 1:
        return coef, np.zeros_like(coef)
    resid = y - X @ coef
    var = float(resid @ resid) / dof * np.diag(np.linalg.pinv(X.T @ X))
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(var > 0, coef / np.sqrt(np.maximum(var, 0.0)), np.where(coef > 0, np.inf, 0.0))
    return coef, t


def fit_prefill(tokens: Sequence[float], seconds: Sequence[float]) -> float | None:
    """t_prefill as total prefill time over total prefill tokens; None without tokens."""
    total = float(np.sum(np.asarray(tokens, dtype=float)))
    return float(np.sum(np.asarray(seconds, dtype=float))) / total if total > 0 else None


__all__ = ["MIN_SLOPE_T", "DecodeFit", "fit_decode", "fit_iterations", "fit_prefill"]
