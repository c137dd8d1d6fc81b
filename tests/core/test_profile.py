"""Workload profile priors and the Runtime Tracker: fits, summaries, EMA folding, replay."""

from __future__ import annotations

import math

import msgspec
import numpy as np
import pytest

from pearl import config
from pearl.core import catalog, events
from pearl.core.errors import SchemaError
from pearl.core.profile import (
    RuntimeTracker,
    StepTelemetry,
    TrajectoryStats,
    WorkloadProfile,
    fit_decode,
    fit_iterations,
    fit_prefill,
    prior_profile,
)

TRUE_A, TRUE_B, TRUE_F = 4e-3, 4e-4, 0.6  # f = 0.6 -> theta = 0.4 / 0.6
TRUE_T_PREFILL = 2.5e-5


def _profile(**kw: float) -> WorkloadProfile:
    base = dict(
        B=64,
        S=30.0,
        delta_L=600.0,
        r=250.0,
        theta=0.5,
        A=5e-3,
        b=3e-4,
        t_prefill=2e-5,
        T_env=60.0,
        T_over=0.5,
        K=147456.0,
        K_seq=147456.0 * 25_500,
        H_max=1.2e11,
        BW=8e10,
        T_toggle=9.44,
    )
    base.update(kw)
    return WorkloadProfile(**base)  # type: ignore[arg-type]


def _synthetic_step(
    rng: np.random.Generator, step: int = 1, noise: float = 0.03, toggle_s: float | None = None
) -> StepTelemetry:
    trs = tuple(
        TrajectoryStats(
            turns=int(t),
            new_tokens=int(t) * 500,
            generated_tokens=int(t) * 200,
            env_s=float(t) * 2.0,
        )
        for t in rng.integers(5, 21, size=64)
    )
    n = rng.integers(1, 33, size=3000)
    d = (TRUE_A + TRUE_B * n) * (1 + noise * rng.standard_normal(n.size))
    # Every iteration pays the fixed cost A; chunked prefill rides on decode iterations.
    toks = rng.integers(200, 4000, size=400)
    m_n, m_p = rng.integers(1, 33, size=300), rng.integers(16, 512, size=300)
    m_d = (TRUE_A + TRUE_B * m_n + TRUE_T_PREFILL * m_p) * (1 + noise * rng.standard_normal(300))
    return StepTelemetry(
        step=step,
        trajectories=trs,
        decode_batch=tuple(int(x) for x in n),
        decode_s=tuple(float(x) for x in d),
        prefill_tokens=tuple(int(x) for x in toks),
        prefill_s=tuple(TRUE_A + float(x) * TRUE_T_PREFILL for x in toks),
        mixed_batch=tuple(int(x) for x in m_n),
        mixed_tokens=tuple(int(x) for x in m_p),
        mixed_s=tuple(float(x) for x in m_d),
        active_fraction=tuple(
            float(x) for x in np.clip(TRUE_F + 0.05 * rng.standard_normal(200), 0.01, 1)
        ),
        makespan_s=500.0,
        toggle_s=toggle_s,
    )


def test_prior_profile_combines_catalog_and_workload_config() -> None:
    cfg = config.load(
        None,
        [
            "workload.turns=10",
            "workload.new_tokens_per_turn=1000",
            "workload.generated_tokens_per_turn=200",
            "gate.toggle_cost_s=5",
        ],
    )
    p = prior_profile(cfg)
    seq = 10 * 1200
    r = catalog.roofline("qwen3-8b", "H800", 2, context=seq / 2, seq_tokens=seq)
    assert (p.B, p.S, p.delta_L, p.r, p.T_toggle) == (64, 10, 1000, 200, 5)
    assert (p.A, p.b, p.t_prefill, p.K, p.K_seq, p.H_max, p.BW) == (
        r.A,
        r.b,
        r.t_prefill,
        r.K,
        r.K_seq,
        r.H_max,
        r.BW,
    )
    assert prior_profile(cfg, batch=96).B == 96


def test_prior_kv_per_trajectory_is_capped_by_the_length_limit() -> None:
    cfg = config.load(None, ["workload.turns=100", "workload.max_trajectory_tokens=32768"])
    p = prior_profile(cfg)
    assert p.K_seq == p.K * 32768


@pytest.mark.parametrize("field", ["A", "theta", "K_seq"])
@pytest.mark.parametrize("value", [-1.0, math.nan, math.inf])
def test_profile_rejects_negative_or_non_finite(field: str, value: float) -> None:
    with pytest.raises(SchemaError, match=field):
        _profile(**{field: value})


def test_fit_decode_recovers_a_and_b_from_noisy_iterations() -> None:
    rng = np.random.default_rng(7)
    n = rng.integers(1, 65, size=2000)
    d = TRUE_A + TRUE_B * n + rng.normal(0, 0.05 * TRUE_A, n.size)
    fit = fit_decode(n, d)
    assert fit is not None and fit.n == 2000
    assert fit.A == pytest.approx(TRUE_A, rel=0.03)
    assert fit.b == pytest.approx(TRUE_B, rel=0.03)
    assert fit.r2 > 0.95


def test_decode_fit_is_used_only_when_its_slope_is_significant() -> None:
    rng = np.random.default_rng(3)
    # A low R^2 but many samples: the slope is pinned down, the fit is used.
    n = rng.integers(1, 12, size=500)
    d = 0.015 + 0.003 * n + rng.normal(0, 0.015, n.size)
    fit = fit_decode(n, d)
    assert fit is not None and fit.r2 < 0.5 and fit.significant()
    assert fit.b == pytest.approx(0.003, rel=0.2)
    # Noise around a flat cost with a narrow spread: the slope is not significant, so b stays
    # and only the level moves (A through the samples' mean), which the samples do measure.
    n = rng.integers(7, 9, size=40)
    d = 0.02 + rng.normal(0, 0.005, n.size)
    fit = fit_decode(n, d)
    assert fit is not None and not fit.significant()
    p = _profile()
    step = StepTelemetry(
        step=1,
        trajectories=(TrajectoryStats(turns=4, new_tokens=400, generated_tokens=100, env_s=3.0),),
        decode_batch=tuple(int(x) for x in n),
        decode_s=tuple(float(x) for x in d),
    )
    s = RuntimeTracker(p, alpha=0.5, L_max=32768).summarize(step)
    assert s.b == p.b
    assert s.A + s.b * n.mean() == pytest.approx(d.mean())
    # A level below what b alone explains: A never goes negative.
    step = msgspec.structs.replace(step, decode_s=tuple(0.001 for _ in n))
    assert RuntimeTracker(p, alpha=0.5, L_max=32768).summarize(step).A == 0.0


def test_summarize_measures_concurrency_and_prefilled_tokens() -> None:
    trs = (
        TrajectoryStats(
            turns=4, new_tokens=400, generated_tokens=100, env_s=1.0, prefilled_tokens=600
        ),
        TrajectoryStats(
            turns=2, new_tokens=200, generated_tokens=50, env_s=1.0, prefilled_tokens=300
        ),
    )
    s = RuntimeTracker(_profile(), 0.3, 32768).summarize(
        StepTelemetry(step=1, trajectories=trs, in_flight=12.5)
    )
    assert (s.B_flight, s.delta_L, s.delta_P) == pytest.approx((12.5, 100.0, 150.0))
    # Not measured: the batch in flight alone, each turn prefilling only its new tokens.
    trs = (
        TrajectoryStats(turns=4, new_tokens=400, generated_tokens=100, env_s=1.0),
        TrajectoryStats(
            turns=2, new_tokens=200, generated_tokens=50, env_s=1.0, prefilled_tokens=300
        ),
    )
    s = RuntimeTracker(_profile(), 0.3, 32768).summarize(StepTelemetry(step=1, trajectories=trs))
    assert (s.B_flight, s.delta_P) == pytest.approx((2.0, 100.0))


def test_fit_decode_degenerate_inputs() -> None:
    assert fit_decode([8, 8, 8], [0.01, 0.011, 0.009]) is None  # no spread: no slope
    assert fit_decode([4], [0.01]) is None
    flat = fit_decode([1, 2, 3, 4], [0.010, 0.009, 0.008, 0.007])  # time falls with batch size
    assert flat is not None and flat.b == 0.0 and flat.A == pytest.approx(0.0085)
    origin = fit_decode([10, 20, 30], [0.0, 0.2, 0.4])  # would need a negative fixed cost
    assert origin is not None and origin.A == 0.0 and origin.b > 0
    exact = fit_decode([1, 2, 3], [0.5, 0.7, 0.9])
    assert exact is not None and (exact.A, exact.b, exact.r2) == pytest.approx((0.3, 0.2, 1.0))
    assert exact.significant() and not flat.significant()


def test_fit_iterations_separates_the_fixed_decode_and_prefill_costs() -> None:
    rng = np.random.default_rng(9)
    n = rng.integers(0, 17, size=1500)
    p = np.where(rng.random(1500) < 0.3, rng.integers(1, 257, size=1500), 0)
    keep = (n > 0) | (p > 0)
    n, p = n[keep], p[keep]
    d = (0.015 + 0.002 * n + 1.3e-4 * p) * (1 + 0.2 * rng.standard_normal(n.size))
    A, b, t_p = fit_iterations(n, p, d, A=1e-5, b=1e-6, t_prefill=1e-6)
    assert (A, b, t_p) == pytest.approx((0.015, 0.002, 1.3e-4), rel=0.1)
    # No prefill in the step: t_prefill keeps its value, A and b are fitted.
    A, b, t_p = fit_iterations(n[p == 0], p[p == 0], d[p == 0], A=1e-5, b=1e-6, t_prefill=7e-5)
    assert t_p == 7e-5 and b == pytest.approx(0.002, rel=0.1)
    # A flat cost with a narrow spread: b keeps its value, the level still moves A.
    n2 = rng.integers(7, 9, size=40)
    d2 = 0.02 + rng.normal(0, 0.005, n2.size)
    A, b, t_p = fit_iterations(n2, np.zeros(40), d2, A=1e-5, b=3e-4, t_prefill=7e-5)
    assert b == 3e-4 and A + b * n2.mean() == pytest.approx(d2.mean())
    assert fit_iterations([], [], [], A=1.0, b=2.0, t_prefill=3.0) == (1.0, 2.0, 3.0)


def test_fit_prefill_is_time_per_token() -> None:
    assert fit_prefill([1000, 3000], [0.02, 0.06]) == pytest.approx(2e-5)
    assert fit_prefill([], []) is None


def test_summarize_reads_the_step() -> None:
    rng = np.random.default_rng(1)
    step = _synthetic_step(rng, step=3, toggle_s=7.0)
    tracker = RuntimeTracker(_profile(), alpha=0.3, L_max=32768)
    s = tracker.summarize(step)
    turns = [t.turns for t in step.trajectories]
    assert isinstance(s, events.Telemetry)
    assert (s.step, s.batch, s.S) == (3, 64, max(turns))
    assert s.delta_L == pytest.approx(500) and s.r == pytest.approx(200)
    assert s.T_env == pytest.approx(2.0 * max(turns))
    assert s.theta == pytest.approx((1 - TRUE_F) / TRUE_F, rel=0.05)
    assert s.A == pytest.approx(TRUE_A, rel=0.05) and s.b == pytest.approx(TRUE_B, rel=0.05)
    assert s.t_prefill == pytest.approx(TRUE_T_PREFILL, rel=0.02)
    assert (s.makespan_s, s.toggle_s) == (500.0, 7.0)
    assert tracker.profile == _profile()  # summarizing changes nothing


def test_summarize_keeps_what_the_step_did_not_measure() -> None:
    p = _profile()
    step = StepTelemetry(
        step=1,
        trajectories=(TrajectoryStats(turns=4, new_tokens=400, generated_tokens=100, env_s=3.0),),
    )
    s = RuntimeTracker(p, alpha=0.5, L_max=32768).summarize(step)
    assert (s.A, s.b, s.theta, s.t_prefill) == (p.A, p.b, p.theta, p.t_prefill)
    assert (s.S, s.delta_L, s.r, s.T_env) == (4, 100, 25, 3.0)


@pytest.mark.parametrize(
    "bad",
    [
        dict(trajectories=()),
        dict(trajectories=(TrajectoryStats(turns=0, new_tokens=1, generated_tokens=1, env_s=1.0),)),
        dict(decode_batch=(1, 2), decode_s=(0.1, -0.1)),
        dict(active_fraction=(1.5,)),
    ],
)
def test_bad_telemetry_is_rejected(bad: dict[str, object]) -> None:
    kw: dict[str, object] = dict(
        step=1,
        trajectories=(TrajectoryStats(turns=2, new_tokens=10, generated_tokens=10, env_s=1.0),),
    )
    kw.update(bad)
    with pytest.raises(SchemaError):
        RuntimeTracker(_profile(), 0.3, 32768).summarize(StepTelemetry(**kw))  # type: ignore[arg-type]


def test_unpaired_samples_are_rejected() -> None:
    with pytest.raises(SchemaError, match="pair up"):
        StepTelemetry(step=1, trajectories=(), decode_batch=(1, 2), decode_s=(0.1,))


def test_T_over_follows_the_switching_stall_where_it_was_measured() -> None:
    p = _profile()
    t = RuntimeTracker(p, alpha=0.25, L_max=1e9)
    rng = np.random.default_rng(3)
    raw = _synthetic_step(rng)
    # A step on split workers measures no colocation overhead: T_over keeps its value.
    s = t.summarize(raw)
    assert s.T_over is None
    assert t.observe(s).T_over == p.T_over
    # Colocated workers measured the stall a turn paid; it folds in like the other fields (the
    # second observation weighs 1/2).
    s = t.summarize(msgspec.structs.replace(raw, step=2, switch_s=2.0))
    assert s.T_over == 2.0
    assert t.observe(s).T_over == pytest.approx(0.5 * 2.0 + 0.5 * p.T_over)
    with pytest.raises(SchemaError, match="T_over"):
        t.observe(msgspec.structs.replace(s, step=3, T_over=-1.0))


def test_T_start_follows_the_measured_spread_of_a_batchs_start_times() -> None:
    p = _profile()
    assert p.T_start == 0.0
    t = RuntimeTracker(p, alpha=0.25, L_max=1e9)
    raw = _synthetic_step(np.random.default_rng(4))
    s = t.summarize(raw)
    assert s.T_start is None and t.observe(s).T_start == 0.0  # not measured: kept
    s = t.summarize(msgspec.structs.replace(raw, step=2, start_spread_s=0.6))
    assert s.T_start == 0.6
    assert t.observe(s).T_start == pytest.approx(0.5 * 0.6)  # the second summary weighs 1/2


def test_observe_is_an_ema_whose_first_observations_replace_the_prior() -> None:
    p = _profile()
    t = RuntimeTracker(p, alpha=0.25, L_max=1e9)
    s = events.Telemetry(
        step=1,
        batch=32,
        S=10.0,
        delta_L=1000.0,
        r=100.0,
        theta=1.0,
        A=1e-2,
        b=1e-3,
        t_prefill=4e-5,
        T_env=20.0,
        makespan_s=300.0,
    )
    q = t.observe(s)
    assert q is t.profile
    assert (q.B, q.observed) == (32, 1)
    # The k-th observation weighs max(alpha, 1/k): the first one replaces the prior ...
    assert (q.S, q.A, q.theta) == pytest.approx((10.0, 1e-2, 1.0))
    assert q.K_seq == pytest.approx(q.K * q.S * (q.delta_L + q.r))
    assert (q.T_toggle, q.T_over, q.H_max, q.BW) == (p.T_toggle, p.T_over, p.H_max, p.BW)
    # ... the second and third are running means, from the fourth on the weight is alpha.
    q = t.observe(msgspec.structs.replace(s, step=2, S=20.0))
    assert q.S == pytest.approx(15.0)
    q = t.observe(msgspec.structs.replace(s, step=3, S=30.0))
    assert q.S == pytest.approx(20.0)
    q = t.observe(msgspec.structs.replace(s, step=4, S=40.0))
    assert q.S == pytest.approx(0.25 * 40 + 0.75 * 20)
    q = t.observe(msgspec.structs.replace(s, step=5, S=40.0))
    assert q.S == pytest.approx(0.25 * 40 + 0.75 * 25)
    for k in range(60):
        q = t.observe(msgspec.structs.replace(s, step=k + 6))
    assert (q.S, q.A, q.theta) == pytest.approx((10.0, 1e-2, 1.0), rel=1e-6)


def test_concurrency_and_prefilled_tokens_follow_the_summaries() -> None:
    t = RuntimeTracker(_profile(), alpha=0.5, L_max=1e9)
    assert (t.profile.concurrency, t.profile.prefill_per_turn) == (64, 600.0)  # B, delta_L
    s = events.Telemetry(
        step=1,
        batch=32,
        S=10.0,
        delta_L=1000.0,
        r=100.0,
        theta=1.0,
        A=1e-2,
        b=1e-3,
        t_prefill=4e-5,
        T_env=20.0,
        makespan_s=300.0,
    )
    q = t.observe(s)  # a summary that predates them: B and delta_L
    assert (q.B_flight, q.delta_P) == (32.0, 1000.0)
    q = t.observe(msgspec.structs.replace(s, step=2, B_flight=64.0, delta_P=200.0))
    assert (q.concurrency, q.prefill_per_turn) == pytest.approx((48.0, 600.0))


def test_toggle_cost_moves_only_on_steps_that_borrowed() -> None:
    t = RuntimeTracker(_profile(T_toggle=10.0), alpha=0.5, L_max=32768)
    s = events.Telemetry(
        step=1,
        batch=64,
        S=30.0,
        delta_L=600.0,
        r=250.0,
        theta=0.5,
        A=5e-3,
        b=3e-4,
        t_prefill=2e-5,
        T_env=60.0,
        makespan_s=1.0,
    )
    assert t.observe(s).T_toggle == 10.0
    assert t.observe(msgspec.structs.replace(s, toggle_s=4.0)).T_toggle == pytest.approx(7.0)


def test_kv_per_trajectory_stays_under_the_length_limit() -> None:
    t = RuntimeTracker(_profile(), alpha=1.0, L_max=32768)
    s = events.Telemetry(
        step=1,
        batch=64,
        S=100.0,
        delta_L=600.0,
        r=250.0,
        theta=0.5,
        A=5e-3,
        b=3e-4,
        t_prefill=2e-5,
        T_env=60.0,
        makespan_s=1.0,
    )
    assert t.observe(s).K_seq == pytest.approx(147456.0 * 32768)


def test_bad_summary_changes_nothing() -> None:
    t = RuntimeTracker(_profile(), alpha=0.5, L_max=32768)
    s = events.Telemetry(
        step=1,
        batch=64,
        S=math.nan,
        delta_L=600.0,
        r=250.0,
        theta=0.5,
        A=5e-3,
        b=3e-4,
        t_prefill=2e-5,
        T_env=60.0,
        makespan_s=1.0,
    )
    with pytest.raises(SchemaError, match="S"):
        t.observe(s)
    with pytest.raises(SchemaError, match="batch"):
        t.observe(msgspec.structs.replace(s, S=3.0, batch=0))
    assert t.profile == _profile() and t.steps == 0


def test_tracker_converges_to_the_truth_from_a_wrong_prior() -> None:
    rng = np.random.default_rng(11)
    t = RuntimeTracker(_profile(A=2e-2, b=1e-5, theta=3.0, t_prefill=1e-4), alpha=0.3, L_max=32768)
    for k in range(25):
        t.observe(t.summarize(_synthetic_step(rng, step=k + 1)))
    p = t.profile
    assert p.A == pytest.approx(TRUE_A, rel=0.03)
    assert p.b == pytest.approx(TRUE_B, rel=0.03)
    assert p.theta == pytest.approx((1 - TRUE_F) / TRUE_F, rel=0.05)
    assert p.t_prefill == pytest.approx(TRUE_T_PREFILL, rel=0.01)


def test_replaying_logged_summaries_rebuilds_the_profile() -> None:
    rng = np.random.default_rng(5)
    prior = _profile()
    live = RuntimeTracker(prior, alpha=0.3, L_max=32768)
    logged = []
    for k in range(8):
        s = live.summarize(_synthetic_step(rng, step=k + 1, toggle_s=6.0 if k % 3 == 0 else None))
        live.observe(s)
        logged.append(events.encode(s))  # what the event log stores
    replayed = RuntimeTracker.replay(
        prior=prior, alpha=0.3, L_max=32768, summaries=(events.decode(m) for m in logged)
    )
    assert replayed.profile == live.profile
    assert replayed.steps == live.steps == 8


def test_kappa_is_the_batch_the_slowest_trajectorys_iterations_held() -> None:
    """Eq. 1-2 charge the critical path S r b B / N; the slowest trajectory paid g b n (its
    tokens at the mean batch of its own iterations): kappa = g n / (S r mean batch)."""
    p = _profile()
    trs = (
        TrajectoryStats(
            turns=4, new_tokens=400, generated_tokens=100, env_s=1.0, seen_batch=4.0, latency_s=1.0
        ),
        TrajectoryStats(
            turns=4, new_tokens=400, generated_tokens=60, env_s=1.0, seen_batch=9.0, latency_s=2.5
        ),  # the slowest
    )
    # Iterations held 4, 4, 8 and 8 sequences (mean 6); r = 160 / 8 = 20 tokens a turn, S = 4.
    raw = StepTelemetry(
        step=1,
        trajectories=trs,
        decode_batch=(4, 4, 8),
        decode_s=(0.01, 0.01, 0.02),
        mixed_batch=(8,),
        mixed_tokens=(100,),
        mixed_s=(0.03,),
    )
    s = RuntimeTracker(p, 0.5, 1e9).summarize(raw)
    assert s.kappa == pytest.approx(60 * 9.0 / (4 * 20 * 6))
    # Latencies not measured: the trajectories that generated the most stand for the path.
    untimed = tuple(msgspec.structs.replace(tr, latency_s=None) for tr in trs)
    s = RuntimeTracker(p, 0.5, 1e9).summarize(msgspec.structs.replace(raw, trajectories=untimed))
    assert s.kappa == pytest.approx(100 * 4.0 / (4 * 20 * 6))
    # A producer that reports one mean per batch size says how many iterations each stands for:
    # 4 x 3 iterations and 8 x 1, mean (12 + 8 + 8) / 5 with the mixed one.
    weighed = msgspec.structs.replace(
        raw, decode_batch=(4, 8), decode_s=(0.01, 0.02), decode_weights=(3.0, 1.0)
    )
    s = RuntimeTracker(p, 0.5, 1e9).summarize(weighed)
    assert s.kappa == pytest.approx(60 * 9.0 / (4 * 20 * (28 / 5)))
    # The engines did not say: not measured, and the profile keeps its kappa.
    blind = tuple(msgspec.structs.replace(tr, seen_batch=None) for tr in trs)
    t = RuntimeTracker(p, 0.5, 1e9)
    s = t.summarize(msgspec.structs.replace(raw, trajectories=blind))
    assert s.kappa is None and t.observe(s).kappa == 1.0
    s = t.summarize(raw)
    assert t.observe(s).kappa == pytest.approx(0.5 * s.kappa + 0.5)  # the second weighs 1/2
    with pytest.raises(SchemaError, match="decode_weights"):
        StepTelemetry(
            step=1,
            trajectories=trs,
            decode_batch=(4, 8),
            decode_s=(0.01, 0.02),
            decode_weights=(1.0,),
        )
