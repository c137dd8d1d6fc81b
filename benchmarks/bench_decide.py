"""Latency of the PD Decision Engine's decide() against a plain-Python loop over N_P.

The baseline is an exhaustive search over the same model: it calls pearl.core.makespan's
functions (eq. 1-3, the §4.2 constraints) one N_P at a time, and must choose what decide() does
in numpy. Both run in this
process on the same profile (configs/sim-32.toml priors); the figures are medians of repeats.
Target: decide() <= 1 ms at 1,024 workers.

    .venv/bin/python benchmarks/bench_decide.py [--small]
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from pearl import config
from pearl.core import makespan as ms
from pearl.core.decision import decide
from pearl.core.profile import WorkloadProfile, prior_profile
from pearl.core.state import Mode, Target

SIZES = (32, 1024, 16384)
TARGET_S = 1e-3


def loop_decide(p: WorkloadProfile, N: int, max_util: float) -> tuple[Target, float]:
    """The same decision as decide(profile, N, None, cfg) by exhaustive search: every N_P in
    turn, through the model's own scalar functions (pearl.core.makespan), so the reference is the
    same model evaluated one configuration at a time, not a second copy of it."""
    best_np, best_t = 0, math.inf
    for n_p in range(1, N):
        n_d = N - n_p
        if not (
            ms.decode_hbm_ok(p, n_d)
            and ms.prefill_keeps_up(p=p, N_P=n_p, N_D=n_d, max_util=max_util)
        ):
            continue
        t = float(ms.T_dis(p, n_p, n_d))
        if t < best_t:
            best_np, best_t = n_p, t
    t_coloc = float(ms.T_coloc(p, N))
    if best_t < t_coloc:
        return Target(mode=Mode.DISAGGREGATED, N_P=best_np, N_D=N - best_np, N_C=0), best_t
    return Target(mode=Mode.COLOCATED, N_P=0, N_D=0, N_C=N), t_coloc


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
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--small", action="store_true", help="two sizes, short timings (a smoke run)")
    a = ap.parse_args()
    sizes = SIZES[:2] if a.small else SIZES
    budget = 0.05 if a.small else 0.5
    cfg = config.load(Path(__file__).resolve().parents[1] / "configs" / "sim-32.toml")
    p = prior_profile(cfg)
    knobs = cfg.decision
    print(
        f"decide() vs plain-Python loop over N_P ({cfg.model.name} on {cfg.cluster.gpu}, "
        f"tp {cfg.cluster.tp}, B = {p.B})"
    )
    print(f"{'workers':>8} {'decide':>11} {'loop':>11} {'speedup':>8}  {'chosen':<10} target")
    for N in sizes:
        d = decide(profile=p, N=N, current=None, cfg=knobs)
        ref = loop_decide(p, N, knobs.prefill_max_utilization)
        assert d.target == ref[0] and math.isclose(d.predicted_makespan_s, ref[1], rel_tol=1e-9), (
            f"N={N}: decide {d.target} != loop {ref[0]}"
        )
        t_np = median_s(partial(decide, p, N, None, knobs), budget)
        t_py = median_s(partial(loop_decide, p, N, knobs.prefill_max_utilization), budget)
        mark = ("<= 1 ms ok" if t_np <= TARGET_S else "> 1 ms MISSED") if N == 1024 else ""
        print(
            f"{N:>8} {t_np * 1e6:>9.1f}us {t_py * 1e6:>9.1f}us {t_py / t_np:>7.1f}x  "
            f"{str(d.target):<10} {mark}"
        )


if __name__ == "__main__":
    main()
