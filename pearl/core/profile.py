"""The workload profile and the Runtime Tracker that keeps it current (§4.3.2, §5).

A :class:`WorkloadProfile` holds every parameter of the makespan models (eq. 1-3), the capacity
constraints of §4.2 and the borrowing gate (eq. 7), under the paper's names. It starts from priors
(:func:`prior_profile`: the catalog roofline plus the workload config) and changes only through
:meth:`RuntimeTracker.observe`, which folds one step summary (the logged
:class:`pearl.core.events.Telemetry` record) in with an exponential moving average. Replaying the
logged summaries through a fresh tracker therefore rebuilds the exact profile.

Turning one step's raw telemetry into that summary is :meth:`RuntimeTracker.summarize`: S, delta_L,
r and T_env from per-trajectory counts, theta from the active-decoding fraction, A and b by least
squares over (decode batch size, iteration time), t_prefill from prefill (tokens, time) samples.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from typing import Protocol

import numpy as np

from pearl.core import catalog
from pearl.core.errors import SchemaError
from pearl.core.events import Telemetry
from pearl.core.schema import struct

# A decode-cost fit explaining less of the variance than this is ignored (A and b stay as they
# were): with a narrow spread of batch sizes the slope is noise.
MIN_DECODE_R2 = 0.3


@struct
class WorkloadProfile:
    """Parameters of eq. 1-3 and 7 for one rollout batch (seconds, tokens, bytes)."""

    B: int  # trajectories in the rollout batch
    S: float  # interaction turns of the slowest trajectory
    delta_L: float  # new prompt tokens per turn
    r: float  # generated tokens per turn
    theta: float  # bubble ratio (1 - f) / f, f = fraction of trajectories actively decoding
    A: float  # fixed cost of one decode iteration
    b: float  # marginal cost of one more sequence in a decode iteration
    t_prefill: float  # seconds per prefill token on one worker
    T_env: float  # environment interaction time over the step
    T_over: float  # per-turn prefill/decode switching overhead under colocation
    K: float  # KV bytes per token
    K_seq: float  # KV bytes per trajectory
    H_max: float  # KV bytes one worker can hold
    BW: float  # bytes/s between prefill and decode pools
    T_toggle: float  # activation + return cost of a borrowing cycle
    T_window: float = 0.0  # training-idle window a borrow must pay within (0: not measured yet)

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if not math.isfinite(v) or v < 0:
                raise SchemaError(f"WorkloadProfile.{f.name} must be finite and >= 0, got {v!r}")
        if self.BW <= 0:
            raise SchemaError("WorkloadProfile.BW must be > 0")


def context_tokens(S: float, delta_L: float, r: float, L_max: float) -> float:
    """Context a trajectory reaches: each turn appends delta_L prompt and r generated tokens."""
    return min(float(L_max), S * (delta_L + r))


class _Cluster(Protocol):
    @property
    def gpu(self) -> str: ...
    @property
    def tp(self) -> int: ...
    @property
    def mem_fraction(self) -> float: ...


class _Workload(Protocol):
    @property
    def batch(self) -> int: ...
    @property
    def max_trajectory_tokens(self) -> int: ...
    @property
    def turns(self) -> float: ...
    @property
    def new_tokens_per_turn(self) -> float: ...
    @property
    def generated_tokens_per_turn(self) -> float: ...
    @property
    def env_s(self) -> float: ...
    @property
    def theta(self) -> float: ...
    @property
    def turn_overhead_s(self) -> float: ...


class _Named(Protocol):
    @property
    def name(self) -> str: ...


class _Gate(Protocol):
    @property
    def toggle_cost_s(self) -> float: ...


class ConfigLike(Protocol):
    """The parts of :class:`pearl.config.Config` the priors read (core cannot import it)."""

    @property
    def cluster(self) -> _Cluster: ...
    @property
    def model(self) -> _Named: ...
    @property
    def workload(self) -> _Workload: ...
    @property
    def gate(self) -> _Gate: ...


def prior_profile(cfg: ConfigLike, batch: int | None = None) -> WorkloadProfile:
    """The profile before any telemetry: catalog roofline for cluster.gpu/model.name/cluster.tp,
    workload priors for S, delta_L, r, theta, T_env, T_over, and gate.toggle_cost_s for T_toggle.

    b and t_prefill are taken at the mean context over a trajectory (it grows linearly from 0 to
    K_seq / K); K_seq at the context the slowest trajectory reaches, capped by the length limit.
    """
    w = cfg.workload
    S, dL, r = w.turns, w.new_tokens_per_turn, w.generated_tokens_per_turn
    seq = context_tokens(S, dL, r, w.max_trajectory_tokens)
    roof = catalog.roofline(cfg.model.name, cfg.cluster.gpu, cfg.cluster.tp, context=seq / 2,
                            seq_tokens=seq, mem_fraction=cfg.cluster.mem_fraction)
    return WorkloadProfile(
        B=w.batch if batch is None else batch, S=S, delta_L=dL, r=r, theta=w.theta,
        A=roof.A, b=roof.b, t_prefill=roof.t_prefill, T_env=w.env_s, T_over=w.turn_overhead_s,
        K=roof.K, K_seq=roof.K_seq, H_max=roof.H_max, BW=roof.BW, T_toggle=cfg.gate.toggle_cost_s,
    )


# -- raw telemetry of one rollout step ------------------------------------------------------------


@struct
class TrajectoryStats:
    """One trajectory of the step: its turns, new prompt and generated tokens, env seconds."""

    turns: int
    new_tokens: int  # newly added input tokens, summed over its turns
    generated_tokens: int
    env_s: float


@struct
class StepTelemetry:
    """What the workers and the environment measured during one rollout step.

    ``decode_batch[i]``/``decode_s[i]``: sequences in decode iteration i and its duration.
    ``prefill_tokens[i]``/``prefill_s[i]``: tokens of prefill batch i and its duration.
    ``active_fraction``: samples of f, the share of unfinished trajectories actively decoding.
    ``toggle_s``: measured activation + return time when the step borrowed training GPUs.
    """

    step: int
    trajectories: tuple[TrajectoryStats, ...]
    decode_batch: tuple[int, ...] = ()
    decode_s: tuple[float, ...] = ()
    prefill_tokens: tuple[int, ...] = ()
    prefill_s: tuple[float, ...] = ()
    active_fraction: tuple[float, ...] = ()
    makespan_s: float = 0.0
    toggle_s: float | None = None

    def __post_init__(self) -> None:
        if len(self.decode_batch) != len(self.decode_s):
            raise SchemaError(f"decode_batch has {len(self.decode_batch)} samples, "
                              f"decode_s {len(self.decode_s)}; they must pair up")
        if len(self.prefill_tokens) != len(self.prefill_s):
            raise SchemaError(f"prefill_tokens has {len(self.prefill_tokens)} samples, "
                              f"prefill_s {len(self.prefill_s)}; they must pair up")


@struct
class DecodeFit:
    """Least-squares fit of iteration time = A + b * batch size."""

    A: float
    b: float
    r2: float
    n: int


def fit_decode(batch: Sequence[float], seconds: Sequence[float]) -> DecodeFit | None:
    """Fit A and b (both kept >= 0) with R^2; None without two distinct batch sizes."""
    x = np.asarray(batch, dtype=float)
    y = np.asarray(seconds, dtype=float)
    if x.size < 2 or np.ptp(x) == 0:
        return None
    xm, ym = x.mean(), y.mean()
    dx = x - xm
    b = float(dx @ (y - ym) / (dx @ dx))
    A = float(ym - b * xm)
    if b < 0:  # decode never gets cheaper with more sequences: flat fit
        A, b = float(ym), 0.0
    elif A < 0:  # no negative fixed cost: fit through the origin
        A, b = 0.0, float(x @ y / (x @ x))
    resid = y - (A + b * x)
    ss_tot = float((y - ym) @ (y - ym))
    r2 = 1.0 - float(resid @ resid) / ss_tot if ss_tot > 0 else 1.0
    return DecodeFit(A=A, b=b, r2=r2, n=int(x.size))


def fit_prefill(tokens: Sequence[float], seconds: Sequence[float]) -> float | None:
    """t_prefill as total prefill time over total prefill tokens; None without tokens."""
    total = float(np.sum(np.asarray(tokens, dtype=float)))
    return float(np.sum(np.asarray(seconds, dtype=float))) / total if total > 0 else None


def _check_samples(t: StepTelemetry) -> None:
    if not t.trajectories:
        raise SchemaError(f"step {t.step}: telemetry names no trajectory")
    for i, tr in enumerate(t.trajectories):
        if tr.turns < 1 or tr.new_tokens < 0 or tr.generated_tokens < 0 or not tr.env_s >= 0:
            raise SchemaError(f"step {t.step}: trajectory {i} has {tr}; expected turns >= 1 and "
                              "non-negative tokens and env time")
    for name in ("decode_batch", "decode_s", "prefill_tokens", "prefill_s"):
        v = np.asarray(getattr(t, name), dtype=float)
        if v.size and (not np.all(np.isfinite(v)) or v.min() < 0):
            raise SchemaError(f"step {t.step}: {name} must be finite and >= 0")
    f = np.asarray(t.active_fraction, dtype=float)
    if f.size and (not np.all(np.isfinite(f)) or f.min() < 0 or f.max() > 1):
        raise SchemaError(f"step {t.step}: active_fraction samples must lie in [0, 1]")


# -- the tracker ----------------------------------------------------------------------------------

_EMA_FIELDS = ("S", "delta_L", "r", "theta", "A", "b", "t_prefill", "T_env")


class RuntimeTracker:
    """Keeps the workload profile: summarize a step's telemetry, observe (fold) the summary.

    ``observe`` is the only way the profile changes after construction, so a tracker rebuilt from
    the same prior and fed the logged summaries in order ends with the same profile.
    """

    def __init__(self, prior: WorkloadProfile, alpha: float, L_max: float,
                 min_r2: float = MIN_DECODE_R2) -> None:
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"EMA alpha must be in (0, 1], got {alpha}")
        self._profile = prior
        self.alpha = alpha
        self.L_max = float(L_max)
        self.min_r2 = min_r2
        self.steps = 0

    @property
    def profile(self) -> WorkloadProfile:
        return self._profile

    @classmethod
    def replay(cls, prior: WorkloadProfile, alpha: float, L_max: float,
               summaries: Iterable[Telemetry]) -> RuntimeTracker:
        """Rebuild a tracker from logged summaries (state = fold(records))."""
        t = cls(prior, alpha, L_max)
        for s in summaries:
            t.observe(s)
        return t

    def summarize(self, t: StepTelemetry) -> Telemetry:
        """One step's summary (§5). What the step could not measure keeps the profile's value,
        so folding it leaves that parameter unchanged. Does not change the profile."""
        _check_samples(t)
        p = self._profile
        trs = t.trajectories
        turns = sum(tr.turns for tr in trs)
        # S and T_env describe the critical path: the trajectory with most turns, the longest
        # environment time (an upper bound when they are different trajectories).
        S = float(max(tr.turns for tr in trs))
        T_env = float(max(tr.env_s for tr in trs))
        delta_L = sum(tr.new_tokens for tr in trs) / turns
        r = sum(tr.generated_tokens for tr in trs) / turns
        theta = p.theta
        if t.active_fraction:
            f = float(np.mean(t.active_fraction))
            theta = (1.0 - f) / f if f > 0 else p.theta
        A, b = p.A, p.b
        fit = fit_decode(t.decode_batch, t.decode_s)
        if fit is not None and fit.r2 >= self.min_r2:
            A, b = fit.A, fit.b
        t_prefill = fit_prefill(t.prefill_tokens, t.prefill_s)
        return Telemetry(
            step=t.step, batch=len(trs), S=S, delta_L=delta_L, r=r, theta=theta, A=A, b=b,
            t_prefill=p.t_prefill if t_prefill is None else t_prefill, T_env=T_env,
            makespan_s=t.makespan_s, toggle_s=t.toggle_s,
        )

    def observe(self, summary: Telemetry) -> WorkloadProfile:
        """Fold one step summary into the profile (EMA with weight alpha on the new value).

        B becomes the summary's batch; K_seq follows the new S, delta_L and r; T_window follows
        the measured training-idle windows; T_toggle is the EMA of measured activation + return
        times (it moves only on steps that borrowed), raised toward the lower bound that a borrow
        cycle cut short gives (a censored observation, §4.6).
        """
        for name in (*_EMA_FIELDS, "makespan_s"):
            v = getattr(summary, name)
            if not math.isfinite(v) or v < 0:
                raise SchemaError(f"telemetry step {summary.step}: {name} = {v!r}, expected a "
                                  "finite value >= 0")
        if summary.batch < 1:
            raise SchemaError(f"telemetry step {summary.step}: batch = {summary.batch}, "
                              "expected >= 1")
        for name in ("toggle_s", "toggle_min_s", "window_s"):
            v = getattr(summary, name)
            if v is not None and not (math.isfinite(v) and v >= 0):
                raise SchemaError(f"telemetry step {summary.step}: {name} = {v!r}")
        p, a = self._profile, self.alpha
        new = {k: a * getattr(summary, k) + (1.0 - a) * getattr(p, k) for k in _EMA_FIELDS}
        T_toggle = p.T_toggle
        if summary.toggle_s is not None:
            T_toggle = a * summary.toggle_s + (1.0 - a) * T_toggle
        if summary.toggle_min_s is not None and summary.toggle_min_s > T_toggle:
            # Censored: the cost is at least toggle_min_s. Move toward that bound, never down.
            T_toggle = a * summary.toggle_min_s + (1.0 - a) * T_toggle
        new["T_toggle"] = T_toggle
        if summary.window_s is not None:
            w = summary.window_s
            new["T_window"] = w if p.T_window == 0 else a * w + (1.0 - a) * p.T_window
        new["K_seq"] = p.K * context_tokens(new["S"], new["delta_L"], new["r"], self.L_max)
        self._profile = dataclasses.replace(p, B=summary.batch, **new)
        self.steps += 1
        return self._profile


__all__ = [
    "MIN_DECODE_R2",
    "ConfigLike",
    "DecodeFit",
    "RuntimeTracker",
    "StepTelemetry",
    "TrajectoryStats",
    "WorkloadProfile",
    "context_tokens",
    "fit_decode",
    "fit_prefill",
    "prior_profile",
]
