"""The workload profile and the Runtime Tracker that keeps it current (§4.3.2, §5).

A :class:`WorkloadProfile` holds every parameter of the makespan models (eq. 1-3), the capacity
constraints of §4.2 and the borrowing gate (eq. 7), under the paper's names. It starts from priors
(:func:`prior_profile`: the catalog roofline plus the workload config) and changes only through
:meth:`RuntimeTracker.observe`, which folds one step summary (the logged
:class:`pearl.core.events.Telemetry` record) in with an exponential moving average. Replaying the
logged summaries through a fresh tracker therefore rebuilds the exact profile.

Turning one step's raw telemetry into that summary is :meth:`RuntimeTracker.summarize`: S, delta_L,
r and T_env from per-trajectory counts, theta from the active-decoding fraction, A, b and
t_prefill by least squares over the step's iterations, iteration time = A + b (sequences
decoding) + t_prefill (prompt tokens computed) (:mod:`pearl.core.fit`).

Two measurements make eq. 1-3 describe an asynchronous, multi-turn pipeline rather than one batch
run alone with fresh prompts: ``B_flight``, the trajectories really in flight while the batch ran
(the pipeline keeps up to 1 + staleness batches of groups going, so the decode batch per worker is
B_flight / N, not B / N), and ``delta_P``, the prompt tokens really prefilled per turn (prefix
reuse leaves only each turn's new tokens; a turn on a worker without its prefix prefills it all).

The EMA gives the k-th observation the weight max(alpha, 1/k): the first measurements replace the
priors at once (a roofline prior can be orders of magnitude off on a CPU slot), later ones move
the profile by alpha.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Protocol

import msgspec
import numpy as np

from pearl.core import catalog
from pearl.core.errors import SchemaError
from pearl.core.events import Telemetry
from pearl.core.fit import MIN_SLOPE_T, DecodeFit, fit_decode, fit_iterations, fit_prefill
from pearl.core.schema import Value


class WorkloadProfile(Value, frozen=True, kw_only=True):
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
    B_flight: float | None = None  # trajectories in flight while a batch runs (None: B)
    delta_P: float | None = None  # prompt tokens prefilled per turn (None: delta_L)
    r_crit: float | None = None  # generated tokens per turn on the critical path (None: r)
    # Workers sharing one link to other nodes (a node's NIC), packed in order: eq. 3's transfers
    # spread over the links the pools span (0: both pools share one link, eq. 3 as written).
    workers_per_link: int = 0
    # A batch's last trajectories start this long after its first: an asynchronous pipeline
    # starts groups as capacity frees, so the batch's makespan spans that spread as well.
    T_start: float = 0.0
    # The decode batch the critical path's iterations hold, over eq. 1-2's (r / r_c) B / N (1 where
    # not measured). A worker's work counts every iteration once, at the mean batch; a
    # trajectory's path counts the iterations it is in, and the fuller ones hold more sequences
    # (a pool that grows and shrinks, uneven load: more than 1), or it runs alone at the end of a
    # long tail (less than 1).
    kappa: float = 1.0
    observed: int = 0  # step summaries folded in (the EMA weight of the next is max(alpha, 1/k))

    def __post_init__(self) -> None:
        for f in msgspec.structs.fields(self):
            v = getattr(self, f.name)
            if v is not None and (not math.isfinite(v) or v < 0):
                raise SchemaError(f"WorkloadProfile.{f.name} must be finite and >= 0, got {v!r}")
        if self.BW <= 0:
            raise SchemaError("WorkloadProfile.BW must be > 0")

    @property
    def concurrency(self) -> float:
        """Trajectories sharing the workers while a batch runs: B_flight, else B (eq. 1's)."""
        return float(self.B) if self.B_flight is None else self.B_flight

    @property
    def r_path(self) -> float:
        """Decode iterations per turn on the critical path: r_crit, else r. The batch ends with
        its longest trajectory, whose turns take r_crit iterations each; the per-sequence cost
        of those iterations is the whole batch's tokens, r per trajectory and turn."""
        return self.r if self.r_crit is None else self.r_crit

    @property
    def prefill_per_turn(self) -> float:
        """Prompt tokens a turn really prefills: delta_P, else delta_L (full prefix reuse)."""
        return self.delta_L if self.delta_P is None else self.delta_P


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
    seq = context_tokens(S=S, delta_L=dL, r=r, L_max=w.max_trajectory_tokens)
    roof = catalog.roofline(
        cfg.model.name,
        cfg.cluster.gpu,
        cfg.cluster.tp,
        context=seq / 2,
        seq_tokens=seq,
        mem_fraction=cfg.cluster.mem_fraction,
    )
    return WorkloadProfile(
        B=w.batch if batch is None else batch,
        S=S,
        delta_L=dL,
        r=r,
        theta=w.theta,
        A=roof.A,
        b=roof.b,
        t_prefill=roof.t_prefill,
        T_env=w.env_s,
        T_over=w.turn_overhead_s,
        K=roof.K,
        K_seq=roof.K_seq,
        H_max=roof.H_max,
        BW=roof.BW,
        T_toggle=cfg.gate.toggle_cost_s,
    )


# -- raw telemetry of one rollout step ------------------------------------------------------------


class TrajectoryStats(Value, frozen=True, kw_only=True):
    """One trajectory of the step: its turns, new prompt and generated tokens, env seconds, and
    the prompt tokens the engines really prefilled for it (None: not measured)."""

    turns: int
    new_tokens: int  # newly added input tokens, summed over its turns
    generated_tokens: int
    env_s: float
    prefilled_tokens: int | None = None  # prompt tokens computed, not reused from a prefix
    # The mean decode batch of the iterations that generated its tokens (None: not measured).
    seen_batch: float | None = None
    latency_s: float | None = None  # from its start to its end (None: not measured)


class StepTelemetry(Value, frozen=True, kw_only=True):
    """What the workers and the environment measured during one rollout step.

    ``decode_batch[i]``/``decode_s[i]``: sequences in decode iteration i and its duration.
    ``prefill_tokens[i]``/``prefill_s[i]``: tokens of prefill batch i and its duration.
    ``mixed_batch[i]``/``mixed_tokens[i]``/``mixed_s[i]``: an iteration that did both (chunked
    prefill riding on decode): its decoding sequences, prefill tokens and duration.
    ``active_fraction``: samples of f, the share of unfinished trajectories actively decoding.
    ``toggle_s``: measured activation + return time when the step borrowed training GPUs.
    ``in_flight``: mean trajectories in flight while the batch ran (0: not measured, then B).
    ``switch_s``: colocation's switching overhead per turn (T_over) as the decoding sequences
    paid it: seconds a turn's decode was stalled by prefills inserted into its running batch,
    beyond their compute (None: not measured). ``prefill_s`` then holds the compute only.
    ``start_spread_s``: how long after the batch's first trajectories its last ones started (an
    asynchronous pipeline starts groups as capacity frees; None: not measured).
    ``decode_weights[i]``: the iterations ``decode_batch[i]`` stands for, where a producer reports
    one mean per batch size (the simulator); empty: one iteration each.
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
    in_flight: float = 0.0
    mixed_batch: tuple[int, ...] = ()
    mixed_tokens: tuple[int, ...] = ()
    mixed_s: tuple[float, ...] = ()
    switch_s: float | None = None
    start_spread_s: float | None = None
    decode_weights: tuple[float, ...] = ()  # iterations each decode_batch entry stands for

    def __post_init__(self) -> None:
        if len(self.decode_batch) != len(self.decode_s):
            raise SchemaError(
                f"decode_batch has {len(self.decode_batch)} samples, "
                f"decode_s {len(self.decode_s)}; they must pair up"
            )
        if not len(self.mixed_batch) == len(self.mixed_tokens) == len(self.mixed_s):
            raise SchemaError(
                f"mixed_batch, mixed_tokens and mixed_s have "
                f"{len(self.mixed_batch)}, {len(self.mixed_tokens)} and "
                f"{len(self.mixed_s)} samples; they must pair up"
            )
        if self.decode_weights and len(self.decode_weights) != len(self.decode_batch):
            raise SchemaError(
                f"decode_weights has {len(self.decode_weights)} entries, decode_batch "
                f"{len(self.decode_batch)}; they must pair up (or decode_weights be empty)"
            )
        if len(self.prefill_tokens) != len(self.prefill_s):
            raise SchemaError(
                f"prefill_tokens has {len(self.prefill_tokens)} samples, "
                f"prefill_s {len(self.prefill_s)}; they must pair up"
            )


def _check_samples(t: StepTelemetry) -> None:
    if not t.trajectories:
        raise SchemaError(f"step {t.step}: telemetry names no trajectory")
    for i, tr in enumerate(t.trajectories):
        if (
            tr.turns < 1
            or tr.new_tokens < 0
            or tr.generated_tokens < 0
            or not tr.env_s >= 0
            or (tr.prefilled_tokens is not None and tr.prefilled_tokens < 0)
            or any(
                v is not None and not (math.isfinite(v) and v >= 0)
                for v in (tr.seen_batch, tr.latency_s)
            )
        ):
            raise SchemaError(
                f"step {t.step}: trajectory {i} has {tr}; expected turns >= 1 and "
                "non-negative tokens and env time"
            )
    for name in (
        "decode_batch",
        "decode_s",
        "prefill_tokens",
        "prefill_s",
        "mixed_batch",
        "mixed_tokens",
        "mixed_s",
        "decode_weights",
    ):
        v = np.asarray(getattr(t, name), dtype=float)
        if v.size and (not np.all(np.isfinite(v)) or v.min() < 0):
            raise SchemaError(f"step {t.step}: {name} must be finite and >= 0")
    f = np.asarray(t.active_fraction, dtype=float)
    if f.size and (not np.all(np.isfinite(f)) or f.min() < 0 or f.max() > 1):
        raise SchemaError(f"step {t.step}: active_fraction samples must lie in [0, 1]")
    if not (math.isfinite(t.in_flight) and t.in_flight >= 0):
        raise SchemaError(
            f"step {t.step}: in_flight = {t.in_flight!r}, expected a finite value >= 0"
        )


def _kappa(t: StepTelemetry, trs: tuple[TrajectoryStats, ...], S: float, r: float) -> float | None:
    """kappa (:attr:`WorkloadProfile.kappa`). Eq. 1-2 charge the critical path S r b B / N for
    its tokens' share of the batch (B / N the mean decode batch); the slowest trajectory really
    paid g b n, its g generated tokens times the mean batch n of its own decode iterations. So
    kappa = g n / (S r mean), the mean decode batch per iteration measured. The slowest is the
    one that took longest; where latencies are not measured, the ones that generated the most.
    None without the engines' measure or a decode iteration."""
    if all(tr.latency_s is not None for tr in trs):
        slowest = max(trs, key=lambda tr: tr.latency_s or 0.0)
        crit: tuple[TrajectoryStats, ...] = (slowest,)
    else:
        most = max(tr.generated_tokens for tr in trs)
        crit = tuple(tr for tr in trs if tr.generated_tokens == most)
    w = t.decode_weights or (1.0,) * len(t.decode_batch)
    iterations = sum(w) + len(t.mixed_batch)
    tokens = sum(n * k for n, k in zip(t.decode_batch, w, strict=True)) + sum(t.mixed_batch)
    if any(tr.seen_batch is None for tr in crit) or iterations <= 0 or tokens <= 0 or r <= 0:
        return None
    paid = sum(tr.generated_tokens * (tr.seen_batch or 0.0) for tr in crit) / len(crit)
    return paid / (S * r * tokens / iterations)


# -- the tracker ----------------------------------------------------------------------------------

_EMA_FIELDS = ("S", "delta_L", "r", "theta", "A", "b", "t_prefill", "T_env")
# Measured only by pipelines that report them; a summary without them reads as B and delta_L.
_FLOW_FIELDS = ("B_flight", "delta_P", "r_crit")


class RuntimeTracker:
    """Keeps the workload profile: summarize a step's telemetry, observe (fold) the summary.

    ``observe`` is the only way the profile changes after construction, so a tracker rebuilt from
    the same prior and fed the logged summaries in order ends with the same profile.
    """

    def __init__(
        self, prior: WorkloadProfile, alpha: float, L_max: float, min_slope_t: float = MIN_SLOPE_T
    ) -> None:
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"EMA alpha must be in (0, 1], got {alpha}")
        self._profile = prior
        self.alpha = alpha
        self.L_max = float(L_max)
        self.min_slope_t = min_slope_t
        self.steps = 0

    @property
    def profile(self) -> WorkloadProfile:
        return self._profile

    @classmethod
    def replay(
        cls, prior: WorkloadProfile, alpha: float, L_max: float, summaries: Iterable[Telemetry]
    ) -> RuntimeTracker:
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
        prefilled = [tr.prefilled_tokens for tr in trs]
        delta_P = (
            delta_L
            if any(n is None for n in prefilled)
            else sum(n for n in prefilled if n is not None) / turns
        )
        r = sum(tr.generated_tokens for tr in trs) / turns
        r_crit = max(tr.generated_tokens for tr in trs) / S
        theta = p.theta
        if t.active_fraction:
            f = float(np.mean(t.active_fraction))
            theta = (1.0 - f) / f if f > 0 else p.theta
        A, b, t_prefill = fit_iterations(
            decode=(*t.decode_batch, *(0 for _ in t.prefill_tokens), *t.mixed_batch),
            prefill=(*(0 for _ in t.decode_batch), *t.prefill_tokens, *t.mixed_tokens),
            seconds=(*t.decode_s, *t.prefill_s, *t.mixed_s),
            A=p.A,
            b=p.b,
            t_prefill=p.t_prefill,
            min_t=self.min_slope_t,
        )
        return Telemetry(
            step=t.step,
            batch=len(trs),
            S=S,
            delta_L=delta_L,
            r=r,
            theta=theta,
            A=A,
            b=b,
            t_prefill=t_prefill,
            T_env=T_env,
            makespan_s=t.makespan_s,
            toggle_s=t.toggle_s,
            B_flight=t.in_flight if t.in_flight > 0 else float(len(trs)),
            delta_P=delta_P,
            r_crit=max(r, r_crit),
            T_over=t.switch_s,
            T_start=t.start_spread_s,
            kappa=_kappa(t=t, trs=trs, S=S, r=r),
        )

    def observe(self, summary: Telemetry) -> WorkloadProfile:
        """Fold one step summary into the profile: an EMA whose weight on the k-th summary is
        max(alpha, 1/k), so the first measurements replace the priors and later ones move by alpha.

        B becomes the summary's batch; K_seq follows the new S, delta_L and r; T_window follows
        the measured training-idle windows; T_toggle is the EMA of measured activation + return
        times (it moves only on steps that borrowed), raised toward the lower bound that a borrow
        cycle cut short gives (a censored observation, §4.6).
        """
        for name in (*_EMA_FIELDS, "makespan_s"):
            v = getattr(summary, name)
            if not math.isfinite(v) or v < 0:
                raise SchemaError(
                    f"telemetry step {summary.step}: {name} = {v!r}, expected a finite value >= 0"
                )
        if summary.batch < 1:
            raise SchemaError(
                f"telemetry step {summary.step}: batch = {summary.batch}, expected >= 1"
            )
        for name in (
            "toggle_s",
            "toggle_min_s",
            "window_s",
            "T_over",
            "T_start",
            "kappa",
            *_FLOW_FIELDS,
        ):
            v = getattr(summary, name)
            if v is not None and not (math.isfinite(v) and v >= 0):
                raise SchemaError(f"telemetry step {summary.step}: {name} = {v!r}")
        p, a = self._profile, self.alpha
        w = max(a, 1.0 / (p.observed + 1))
        new: dict[str, float] = {
            k: w * getattr(summary, k) + (1.0 - w) * getattr(p, k) for k in _EMA_FIELDS
        }
        B_flight = float(summary.batch) if summary.B_flight is None else summary.B_flight
        delta_P = summary.delta_L if summary.delta_P is None else summary.delta_P
        new["B_flight"] = w * B_flight + (1.0 - w) * p.concurrency
        new["delta_P"] = w * delta_P + (1.0 - w) * p.prefill_per_turn
        r_crit = summary.r if summary.r_crit is None else summary.r_crit
        new["r_crit"] = w * r_crit + (1.0 - w) * p.r_path
        if summary.T_over is not None:  # measured only where workers ran colocated
            new["T_over"] = w * summary.T_over + (1.0 - w) * p.T_over
        if summary.T_start is not None:
            new["T_start"] = w * summary.T_start + (1.0 - w) * p.T_start
        if summary.kappa is not None:
            new["kappa"] = w * summary.kappa + (1.0 - w) * p.kappa
        # T_toggle and T_window keep their own rules: they are measured only on some steps.
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
        new["K_seq"] = p.K * context_tokens(
            S=new["S"], delta_L=new["delta_L"], r=new["r"], L_max=self.L_max
        )
        self._profile = msgspec.structs.replace(p, B=summary.batch, observed=p.observed + 1, **new)
        self.steps += 1
        return self._profile


__all__ = [
    "MIN_SLOPE_T",
    "ConfigLike",
    "DecodeFit",
    "RuntimeTracker",
    "StepTelemetry",
    "TrajectoryStats",
    "WorkloadProfile",
    "context_tokens",
    "fit_decode",
    "fit_iterations",
    "fit_prefill",
    "prior_profile",
]
