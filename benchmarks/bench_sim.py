"""bench_sim: wall time to simulate one two-hour segment for all policies (target: <= 30 s).

For each model and segment it runs PEARL, ROLL, ROLL-Large and RLBoost+ in one process and
prints the wall time per policy, the total, and the speed against real time measured in the
same run (simulated seconds, warm-up included, per wall second). The last block repeats S2 at
time_scale 1 (the roofline deployment: ~40x more, shorter steps, so ~40x more events per hour).

    .venv/bin/python benchmarks/bench_sim.py [--quick | --small]
"""

from __future__ import annotations

import dataclasses
import sys
import time

from pearl.sim import availability as av
from pearl.sim.runner import Simulation
from pearl.sim.scenario import MAIN_POLICIES, POLICIES, Scenario, scenario

TARGET_S = 30.0


def bench(sc: Scenario, segment: str) -> tuple[float, dict[str, float], int]:
    avail = av.load(segment_name=segment)
    walls, events = {}, 0
    for name in MAIN_POLICIES:
        t = time.perf_counter()
        r = Simulation(sc, POLICIES[name], avail).run()
        walls[name] = time.perf_counter() - t
        events += r.events
    return sum(walls.values()), walls, events


def main() -> int:
    quick = "--quick" in sys.argv or "--small" in sys.argv
    cases = (
        [("qwen3-8b", "S2")]
        if quick
        else [(m, s) for m in ("qwen3-8b", "qwen3-30b-a3b") for s in ("S1", "S2", "S3")]
    )
    print(
        f"{'model':<14} {'seg':<3} {'total s':>8} {'vs target':>9} {'sim s / wall s':>14} "
        f"{'events':>8}  per policy (s)"
    )
    worst = 0.0
    for model, seg in cases:
        sc = scenario(model)
        total, walls, events = bench(sc, seg)
        simulated = len(MAIN_POLICIES) * (7200 + sc.warmup_s)
        worst = max(worst, total)
        per = " ".join(f"{k}={v:.2f}" for k, v in walls.items())
        print(
            f"{model:<14} {seg:<3} {total:>8.2f} {total / TARGET_S:>8.2f}x "
            f"{simulated / total:>14.0f} {events:>8}  {per}"
        )
    if not quick:
        sc = scenario("qwen3-8b")
        k = sc.engine.time_scale  # the same deployment at roofline speed, training included
        sc1 = dataclasses.replace(
            sc,
            engine=dataclasses.replace(sc.engine, time_scale=1.0),
            training=dataclasses.replace(
                sc.training, tokens_per_gpu_s=sc.training.tokens_per_gpu_s * k
            ),
        )
        total, walls, events = bench(sc1, "S2")
        print(
            f"{'8b, scale 1':<14} {'S2':<3} {total:>8.2f} {total / TARGET_S:>8.2f}x "
            f"{len(MAIN_POLICIES) * (7200 + sc.warmup_s) / total:>14.0f} {events:>8}  "
            + " ".join(f"{k}={v:.2f}" for k, v in walls.items())
        )
    print(f"worst calibrated segment: {worst:.2f} s for all policies (target <= {TARGET_S:.0f} s)")
    return 0 if worst <= TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
