"""Latency of the PD Decision Engine's decide() against a plain-Python loop over N_P.

The baseline evaluates the same equations and constraints (eq. 1-3, §4.2) one N_P at a time and
keeps every configuration's makespan and feasibility, as decide() does in numpy. Both run in this
process on the same profile (configs/sim-32.toml priors); the figures are medians of repeats.
Target: decide() <= 1 ms at 1,024 workers.

    .venv/bin/python benchmarks/bench_decide.py
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from pearl import config
from pearl.core.decision import decide
from pearl.core.profile import WorkloadProfile, prior_profile
from pearl.core.state import Mode, Target

SIZES = (32, 1024, 16384)
TARGET_S = 1e-3


def loop_decide(p: WorkloadProfile, N: int, max_util: float) -> tuple[Target, float]:
    """The same decision as decide(profile, N, None, cfg), one N_P at a time."""
    t_coloc = (
        p.S * (p.B / N * p.delta_L * p.t_prefill + p.r * (p.A + p.b * p.B / N) + p.T_over) + p.T_env
    )
    lam = p.B * p.S * p.delta_L
    k = 1.0 + p.theta
    makespans: list[float] = []
    feasible: list[bool] = []
    best_np, best_t = 0, math.inf
    for n_p in range(1, N):
        n_d = N - n_p
        t_pre = p.S * (p.B * p.delta_L / n_p * p.t_prefill + p.B * p.delta_L * p.K / p.BW)
        t_dec = p.S * p.r * (p.A + p.b * p.B / (n_d * k)) * k
        t = max(t_pre, t_dec) + p.T_env
        ok = p.B * p.K_seq <= n_d * p.H_max and lam * p.t_prefill / n_p <= max_util * t_dec
        makespans.append(t)
        feasible.append(ok)
        if ok and t < best_t:
            best_np, best_t = n_p, t
    if best_t < t_coloc:
        return Target(Mode.DISAGGREGATED, best_np, N - best_np, 0), best_t
    return Target(Mode.COLOCATED, 0, 0, N), t_coloc


def median_s(fn: Callable[[], object], budget_s: float = 0.5, repeats: int = 7) -> float:
    """Median seconds per call: calibrate a batch to ~budget/repeats, then time repeats."""
    n = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        dt = time.perf_counter() - t0
        if dt > budget_s / repeats / 4 or n >= 1 << 20:
            break
        n *= 2
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        runs.append((time.perf_counter() - t0) / n)
    return statistics.median(runs)


def main() -> None:
    cfg = config.load(Path(__file__).resolve().parents[1] / "configs" / "sim-32.toml")
    p = prior_profile(cfg)
    knobs = cfg.decision
    print(
        f"decide() vs plain-Python loop over N_P ({cfg.model.name} on {cfg.cluster.gpu}, "
        f"tp {cfg.cluster.tp}, B = {p.B})"
    )
    print(f"{'workers':>8} {'decide':>11} {'loop':>11} {'speedup':>8}  {'chosen':<10} target")
    for N in SIZES:
        d = decide(p, N, None, knobs)
        ref = loop_decide(p, N, knobs.prefill_max_utilization)
        assert d.target == ref[0] and math.isclose(d.predicted_makespan_s, ref[1], rel_tol=1e-9), (
            f"N={N}: decide {d.target} != loop {ref[0]}"
        )
        t_np = median_s(partial(decide, p, N, None, knobs))
        t_py = median_s(partial(loop_decide, p, N, knobs.prefill_max_utilization))
        mark = ("<= 1 ms ok" if t_np <= TARGET_S else "> 1 ms MISSED") if N == 1024 else ""
        print(
            f"{N:>8} {t_np * 1e6:>9.1f}us {t_py * 1e6:>9.1f}us {t_py / t_np:>7.1f}x  "
            f"{str(d.target):<10} {mark}"
        )


if __name__ == "__main__":
    main()
