"""Latency of the minimal-change planner, plan(), against a plain-Python rebuild-from-scratch loop.

The table holds N disaggregated workers (3:5 prefill:decode); two GPUs join and the target moves to
a 1:1 ratio over N + 2 workers. plan() computes membership and the minimal-change plan (§4.4.2).
The baseline is the strawman the paper argues against: hand out the target roles to every member
in slot order, ignoring current roles — one plain loop, same run. Both report their change count
D_worker + D_role. Target: plan() <= 20 ms at 16,384 workers.

    .venv/bin/python benchmarks/bench_plan.py [--small]
"""

from __future__ import annotations

import statistics
import sys
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pearl.core.plan import membership, plan  # noqa: E402
from pearl.core.state import (  # noqa: E402
    Activity,
    ClusterState,
    Mode,
    Role,
    Target,
    Zone,
)

SIZES = (32, 1024, 16384)
TARGET_S = 20e-3


def table(n: int) -> ClusterState:
    """n active TP1 workers, 3 prefill for every 5 decode, plus two free preemptible GPUs."""
    b = ClusterState().thaw()
    b.init(1, (), range(n), range(n, n + 2))
    b.add_gpus((n, n + 1))
    for w in range(n):
        b.add_worker(w, (w,), Role.PREFILL if w % 8 < 3 else Role.DECODE, Zone.DEDICATED)
        b.set_activity(w, Activity.ACTIVE)
    return b.freeze()


def rebuild(state: ClusterState, target: Target) -> tuple[int, int]:
    """Assign the target roles in slot order to every member; count what changes."""
    roles = [Role.PREFILL] * target.N_P + [Role.DECODE] * target.N_D + [Role.COLOCATED] * target.N_C
    members = sorted(w.id for w in state.workers.values() if w.activity is not Activity.INACTIVE)
    free = sorted(state.free_gpus(Zone.DEDICATED))
    D_worker = len(free) // state.tp
    D_role = 0
    for wid, role in zip(members, roles, strict=False):
        if state.workers[wid].role is not role:
            D_role += 1
    return D_worker, D_role


def minimal(s: ClusterState, target: Target) -> object:
    return plan(s, target, membership(s, False))


def timed(fn, repeat: int) -> tuple[float, object]:  # type: ignore[no-untyped-def]
    out = []
    value = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        value = fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out), value


def main() -> int:
    small = "--small" in sys.argv  # two sizes: a smoke run
    sizes = SIZES[:2] if small else SIZES
    print(
        f"{'workers':>8} {'plan()':>10} {'changes':>8} {'rebuild loop':>13} {'changes':>8} "
        f"{'plan/rebuild':>12}"
    )
    ok = True
    for n in sizes:
        s = table(n)
        N = n + 2
        target = Target(mode=Mode.DISAGGREGATED, N_P=N // 2, N_D=N - N // 2, N_C=0)
        repeat = 30 if n < 10000 else 7

        t_plan, p = timed(partial(minimal, s, target), repeat)
        t_base, (dw, dr) = timed(partial(rebuild, s, target), repeat)  # type: ignore[misc]
        changes = p.D_worker + p.D_role  # type: ignore[attr-defined]
        print(
            f"{n:>8,} {t_plan * 1e3:>8.2f}ms {changes:>8,} {t_base * 1e3:>11.2f}ms "
            f"{dw + dr:>8,} {t_plan / t_base:>11.1f}x"
        )
        if n == sizes[-1]:
            ok = t_plan <= TARGET_S
    print(
        f"target: plan() <= {TARGET_S * 1e3:.0f} ms at {sizes[-1]:,} workers: "
        f"{'met' if ok else 'NOT met'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
