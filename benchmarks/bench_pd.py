"""Adaptive PD on the torch engine: colocation against every P/D split, measured and predicted.

The paper's §3.3 observation, on real engines: N torch-engine workers, each a virtual device of
the same share of one core (:mod:`pearl.engines.device`), play a multi-turn agentic batch
(tool outputs appended each turn, prefix reuse, environment time per turn; see
``benchmarks/torch_workers.py``) in every configuration of N workers: colocated NC and every split
N_P:N_D, for each worker budget N and batch size B. The same worker processes serve every run
(roles set, KV pools emptied in between); rounds alternate the order of the points and of the
configurations, so drift on the shared machine hits all of them alike.

For each point the table prints the measured best configuration and its gain over colocation,
the decision engine's pick and its measured throughput relative to the best. The pick is
``pearl.core.decision.decide`` (the code pearld runs) on the profile the Runtime Tracker
(``pearl.core.profile.RuntimeTracker``) folds from the point's colocated runs, one step per
round — what a colocated cluster knows after that many steps when it decides — with the KV bytes per
token and the link rate measured between two of the workers. Every configuration's eq. 1-3
prediction (``pearl.core.makespan.sweep``) is printed against its measured makespan.

    .venv/bin/python benchmarks/bench_pd.py [--budgets 2 3 4 6] [--batches 8 32] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, field

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.torch_workers import (  # noqa: E402
    Run,
    Worker,
    env_seconds,
    play,
    set_roles,
    stop_all,
)
from pearl.config import DecisionConfig  # noqa: E402
from pearl.core.decision import decide  # noqa: E402
from pearl.core.makespan import sweep  # noqa: E402
from pearl.core.profile import (  # noqa: E402
    RuntimeTracker,
    StepTelemetry,
    TrajectoryStats,
    WorkloadProfile,
)
from pearl.core.schema import to_plain  # noqa: E402
from pearl.engines.device import available_cores, check_fits, default_share  # noqa: E402


def config_name(N: int, n_p: int) -> str:
    """``"colocated"`` or ``"2P2D"`` (the names bench_pd's JSON and the report use)."""
    return "colocated" if n_p == 0 else f"{n_p}P{N - n_p}D"


@dataclass
class Point:
    """One (budget, batch) point: every configuration's measured makespans over the rounds."""

    N: int
    B: int
    makespans: dict[int, list[float]] = field(default_factory=dict)  # n_p -> seconds per round
    tokens: dict[int, int] = field(default_factory=dict)  # n_p -> tokens generated a run
    colocated: list[Run] = field(default_factory=list)  # the colocated runs, round by round

    def tokens_per_s(self, n_p: int) -> float:
        return self.tokens[n_p] / statistics.median(self.makespans[n_p])

    def best(self) -> int:
        return max(self.makespans, key=self.tokens_per_s)


# -- the tracker's view of a run ------------------------------------------------------------------


def step_telemetry(run: Run, a: argparse.Namespace, B: int, step: int = 1) -> StepTelemetry:
    """A run as the pipeline reports a rollout step: every worker's iterations (pure decode, pure
    prefill, mixed), each trajectory's counts, the active fraction, the makespan."""
    its = [i for t in run.telemetry for i in t["iterations"]]
    dec = [(int(n), d) for _, d, n, p in its if n > 0 and p == 0]
    pre = [(int(p), d) for _, d, n, p in its if n == 0 and p > 0]
    mix = [(int(n), int(p), d) for _, d, n, p in its if n > 0 and p > 0]
    trajs = tuple(
        TrajectoryStats(
            turns=c["turns"],
            new_tokens=c["new"],
            generated_tokens=c["generated"],
            env_s=sum(env_seconds(a, t, k) for k in range(c["turns"] - 1)),
            prefilled_tokens=c["prefilled"],
            seen_batch=c["batch_sum"] / c["steps"] if c.get("steps") else None,
            latency_s=c["latency_ms"] / 1000 if "latency_ms" in c else None,
        )
        for t, c in run.traj.items()
    )
    return StepTelemetry(
        step=step,
        trajectories=trajs,
        decode_batch=tuple(n for n, _ in dec),
        decode_s=tuple(d for _, d in dec),
        prefill_tokens=tuple(p for p, _ in pre),
        prefill_s=tuple(d for _, d in pre),
        mixed_batch=tuple(n for n, _, _ in mix),
        mixed_tokens=tuple(p for _, p, _ in mix),
        mixed_s=tuple(d for _, _, d in mix),
        active_fraction=(min(1.0, max(1e-3, run.active_fraction)),),
        makespan_s=run.makespan_s,
        in_flight=float(B),
    )


def tracked_profile(
    runs: list[Run], a: argparse.Namespace, B: int, K: float, BW: float
) -> WorkloadProfile:
    """What the Runtime Tracker makes of ``runs``, one step each (its EMA: the first summary
    replaces the prior, the k-th weighs max(alpha, 1/k))."""
    L_max = a.first_prompt + a.turns * (a.gen + a.obs)
    prior = WorkloadProfile(
        B=B,
        S=a.turns,
        delta_L=a.obs + a.gen,
        r=a.gen,
        theta=0.0,
        A=1e-3,
        b=1e-4,
        t_prefill=1e-4,
        T_env=(a.turns - 1) * a.env_ms / 1000,
        T_over=0.0,
        K=K,
        K_seq=K * L_max,
        H_max=float(a.kv_budget_mib << 20),
        BW=BW,
        T_toggle=0.0,
    )
    tracker = RuntimeTracker(prior, alpha=0.3, L_max=L_max)
    profile = prior
    for k, run in enumerate(runs, 1):
        profile = tracker.observe(tracker.summarize(step_telemetry(run, a, B, step=k)))
    return profile


def link_rate(src: Worker, dst: Worker, nbytes: int, n: int = 20) -> float:
    """Bytes/s of the engines' KV channel: the upper quartile over ``n`` KV-sized messages,
    workers idle. A capacity, like a ping's least round trip: a message that waited for a core
    held by another process says how busy the machine was, not how fast the link is (the median
    of one run under load read 1.7 MB/s for a 330 MB/s link)."""
    addr = dst.call("sink", n=n, raw=False)
    src.call("send", addr=addr, sizes=[nbytes] * n, gap_s=0.005, raw=False)
    got = dst.call("sink_result")
    return float(np.percentile([b / max(arr - sent, 1e-9) for b, sent, arr in got], 75))


# -- the run --------------------------------------------------------------------------------------


def measure(workers: list[Worker], a: argparse.Namespace) -> list[Point]:
    points = [Point(N, B) for N in a.budgets for B in a.batches]
    t_start = time.monotonic()
    total = a.rounds * sum(p.N for p in points)
    done = 0
    for r in range(a.rounds):
        order = points if r % 2 == 0 else points[::-1]
        for pt in order:
            configs = list(range(pt.N))  # 0 = colocated, then N_P = 1 .. N-1
            configs = configs[r % len(configs) :] + configs[: r % len(configs)]
            for n_p in configs:
                name = config_name(pt.N, n_p)
                set_roles(workers[: pt.N], n_p)
                run = play(
                    name=f"r{r}-{pt.N}-{pt.B}-{name}",
                    workers=workers[: pt.N],
                    n_prefill=n_p,
                    a=a,
                    batch=pt.B,
                )
                pt.makespans.setdefault(n_p, []).append(run.makespan_s)
                pt.tokens[n_p] = run.generated
                if n_p == 0:
                    pt.colocated.append(run)
                done += 1
                elapsed = time.monotonic() - t_start
                print(
                    f"  [{done}/{total}, {elapsed:.0f} s] round {r} N={pt.N} B={pt.B} "
                    f"{name:>9}: {run.makespan_s:6.2f} s, {run.generated / run.makespan_s:7.1f} "
                    "tok/s",
                    file=sys.stderr,
                    flush=True,
                )
    return points


def analyse(points: list[Point], a: argparse.Namespace, K: float, BW: float) -> list[dict]:
    cfg = DecisionConfig()
    rows = []
    for pt in points:
        profile = tracked_profile(runs=pt.colocated, a=a, B=pt.B, K=K, BW=BW)
        dec = decide(profile=profile, N=pt.N, current=None, cfg=cfg)
        s = sweep(profile, pt.N, cfg.prefill_max_utilization)
        predicted = {0: s.T_coloc} | {int(n): float(t) for n, t in zip(s.N_P, s.T_dis, strict=True)}
        excluded = {0: None} | {
            int(n): (None if e == 0 else int(e)) for n, e in zip(s.N_P, s.excluded, strict=True)
        }
        best = pt.best()
        pick = dec.target.N_P
        coloc = pt.tokens_per_s(0)
        configs = []
        for n_p in sorted(pt.makespans):
            m = statistics.median(pt.makespans[n_p])
            configs.append(
                {
                    "config": config_name(pt.N, n_p),
                    "measured_s": m,
                    "rounds_s": pt.makespans[n_p],
                    "tokens_per_s": pt.tokens_per_s(n_p),
                    "vs_colocated": pt.tokens_per_s(n_p) / coloc,
                    "predicted_s": predicted[n_p],
                    "error": (predicted[n_p] - m) / m,
                    "excluded": excluded[n_p] is not None,
                }
            )
        rows.append(
            {
                "budget": pt.N,
                "batch": pt.B,
                "best": config_name(pt.N, best),
                "best_gain_over_colocated": pt.tokens_per_s(best) / coloc - 1.0,
                "pick": config_name(pt.N, pick),
                "pick_vs_best": pt.tokens_per_s(pick) / pt.tokens_per_s(best),
                "predicted_s": predicted[pick],
                "measured_s": statistics.median(pt.makespans[pick]),
                "profile": to_plain(profile),  # all of it: predictions can be re-evaluated
                "configs": configs,
            }
        )
    return rows


def report(rows: list[dict], a: argparse.Namespace, share: float, K: float, BW: float) -> None:
    print(
        f"\nworkload: {a.turns} turns, first prompt {a.first_prompt}, +{a.obs} observation "
        f"tokens/turn, {a.gen} generated/turn (+- {a.gen_spread:.0%}), env {a.env_ms:.0f} ms "
        f"(+- {a.env_spread:.0%}); preset {a.preset}; each "
        f"worker a virtual device of {share:g} core; KV {K:.0f} B/token, link {BW / 1e9:.2f} GB/s; "
        f"{a.rounds} rounds (median)\n"
    )
    print("per configuration: measured makespan (median of rounds), tokens/s vs colocated, eq. 1-3")
    for row in rows:
        cells = "  ".join(
            f"{c['config']} {c['measured_s']:.2f}s {c['vs_colocated']:.2f}x "
            f"pred {c['predicted_s']:.2f}s ({c['error']:+.0%}){' excl' if c['excluded'] else ''}"
            for c in row["configs"]
        )
        print(f"  N={row['budget']} B={row['batch']}: {cells}")
    print(
        f"\n{'budget':>6} {'batch':>5} {'best':>9} {'gain vs C':>9} {'pick':>9} "
        f"{'pick/best':>9} {'predicted':>9} {'measured':>8}"
    )
    for row in rows:
        print(
            f"{row['budget']:>6} {row['batch']:>5} {row['best']:>9} "
            f"{row['best_gain_over_colocated']:>+9.1%} {row['pick']:>9} "
            f"{row['pick_vs_best']:>9.3f} {row['predicted_s']:>8.2f}s {row['measured_s']:>7.2f}s"
        )
    errs = [abs(c["error"]) for row in rows for c in row["configs"]]
    within = sum(row["pick_vs_best"] >= 0.95 for row in rows)
    print(
        f"\npicks within 5% of the measured best: {within} of {len(rows)}; eq. 1-3 abs error over "
        f"all configurations: median {statistics.median(errs):.1%}, worst {max(errs):.1%}"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--budgets", type=int, nargs="+", default=[2, 3, 4, 6])
    ap.add_argument("--batches", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--share", type=float, help="each worker's share of one core (default: fit)")
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--first-prompt", type=int, default=128, help="tokens of the first prompt")
    ap.add_argument("--obs", type=int, default=400, help="observation tokens added per turn")
    ap.add_argument("--gen", type=int, default=32, help="tokens generated per turn")
    ap.add_argument("--env-ms", type=float, default=30.0, help="environment time per turn")
    ap.add_argument(
        "--gen-spread", type=float, default=0.5, help="generated tokens vary by +- this share"
    )
    ap.add_argument(
        "--env-spread", type=float, default=0.9, help="environment time varies by +- this share"
    )
    ap.add_argument("--token-budget", type=int, default=256)
    ap.add_argument("--kv-budget-mib", type=int, default=256)
    ap.add_argument("--json", help="write the figures as JSON to this file")
    ap.add_argument(
        "--small",
        action="store_true",
        help="a budget of 2, one batch of 4, one round of 2 turns (a smoke run)",
    )
    a = ap.parse_args()
    if a.small:
        a.budgets, a.batches, a.rounds, a.turns = [2], [4], 1, 2
    if min(a.budgets) < 2 or min(a.batches) < 1:
        ap.error("budgets must be >= 2 workers (a split needs two) and batches >= 1")
    cores = sorted(os.sched_getaffinity(0))
    slots = max(a.budgets)
    share = a.share if a.share is not None else default_share(slots, available_cores(), 0.9)
    check_fits(share=share, slots=slots, cores=available_cores(), where="--share")
    print(
        f"{slots} workers, each a virtual device of {share:g} core, on {len(cores)} cores",
        file=sys.stderr,
    )
    workers: list[Worker] = []
    try:
        for i in range(slots):
            workers.append(Worker(cores[i % len(cores)], a, share, slot=i))
        K = float(workers[0].call("kv_bytes_per_token"))
        BW = link_rate(workers[0], workers[1], int(K * (a.obs + a.gen)))
        points = measure(workers, a)
    finally:
        stop_all(workers)
    rows = analyse(points=points, a=a, K=K, BW=BW)
    report(rows=rows, a=a, share=share, K=K, BW=BW)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"share": share, "K": K, "BW": BW, "args": vars(a), "points": rows}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
