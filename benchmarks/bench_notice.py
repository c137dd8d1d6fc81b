"""Preemption notices: what a warning before a reclaim saves (issue 18, part 1).

An in-process :class:`pearl.Runtime` (pearld's actors, its worker hosts and the rollout pipeline,
``tool_use``, PD mode held at colocated so that no telemetry-driven switch lands inside the
segment) runs while a consumer thread takes batches as fast as they come (the trainer never
publishes, so nothing goes stale). Half the preemptible GPUs are reclaimed at the same moment of
every scenario (``lead`` seconds into the segment; the first event, the notice or the reclaim
without one, is held back until the workers to be reclaimed have generations in flight): without
a notice (a plain ``gpus-reclaimed`` out of the blue) and after notices of two lengths, each
scenario a fresh runtime on the same config, seed and event times, all in the same run. Every
scenario must have generations in flight on the workers to be reclaimed at its first event (the
router's load on them is printed): otherwise the baseline proves nothing.

- ``--engine sim``: ``configs/sim-32.toml`` shrunk to 2 reserved + 4 preemptible TP2 workers,
  4 of the 8 preemptible GPUs reclaimed. Time is scaled by ``--scale`` (the sim engines run that
  much faster than real): the notices of 30 s and 120 s, the lead and the settle time are that
  much shorter in real seconds (the pearld deadlines and the notice rules run on the wall clock,
  so a 30 s notice at x0.1 is a 3 s wall-clock notice).
- ``--engine torch``: ``configs/local-cpu.toml``, tiny Qwen3 on the torch engine, every slot a
  fixed-capacity virtual device (``engine.torch.device_share``), 3 reserved + 2 preemptible workers,
  1 reclaimed; notices in real seconds (``--torch-notices``, default 30 s and 3 s: a notice
  shorter than a turn, so that the early migration is exercised). Generations are long
  (``rl.max_new_tokens=256``) on slow devices, so that turns are in flight on every worker when
  the reclaim or the notice comes.

Measured per scenario, over the segment [start, reclaim + settle]:

- aborted: generations that came back aborted (at the reclaim, or migrated early off a leaving
  worker by the notice) and resumed elsewhere from their prefix — ``Pipeline.migrations``, whose
  entries are (abort time, prompt tokens the resumption prefilled again), counted for aborts in
  the segment once their resumptions have completed;
- recomputed: the sum of those prefilled tokens: every token of a resumed prompt had been
  computed before, on the worker that lost it;
- migrated: how many of the aborts were the router's early migrations (``Router.migrated``);
- in flight: the router's load on the workers being reclaimed when the notice came (the figure a
  notice has to deal with) and just before the reclaim moment (what the reclaim hits: 0 means
  the notice emptied them);
- paused: the rollout standing still around the reclaim, from the pipeline's generation timeline
  (every generation's submit and completion time, recorded by wrapping the pipeline's generate
  function): the longest interval without a completed turn (a generation that came back not
  aborted) among the intervals that overlap the window [reclaim - longest notice - 0.5 s,
  reclaim + settle] — the same window in every scenario — less the median such interval between
  the warm-up batches and the window (both are printed with it: "gap/typ"). Completions come in
  bursts on the torch engine (a worker's batch of sequences ends together), so this figure is
  noisy there;
- plan ready: when the plan that removed the reclaimed workers committed, relative to the reclaim
  moment (negative: done before the GPUs went);
- throughput: generated tokens (every generation's output, aborted prefixes included: they are
  kept) completed in the segment, per second of the segment.

Ratios are against the no-notice baseline of the same round (``--repeat`` runs every scenario
that many times, in rounds). With a notice, pearld treats the deadline (less its stop lead) as the
reclaim; the benchmark then does not send its own ``gpus-reclaimed`` at the deadline (pearld would
refuse it: those GPUs are no longer present) and says so in the JSON ("reclaim").

    .venv/bin/python benchmarks/bench_notice.py [--engine sim|torch|both] [--scale 0.1]
        [--torch-notices 30 3] [--repeat 1] [--json FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import shutil
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from actors import names  # noqa: E402
from pearl.core import events as ev  # noqa: E402
from pearl.core.status import status_plain  # noqa: E402
from pearl.engines.base import FinishReason  # noqa: E402
from pearl.testing.wait import wait_until  # noqa: E402


@dataclass(frozen=True)
class Setup:
    """One engine's scenario family: config, overrides, GPUs added at start and reclaimed."""

    name: str
    config: Path
    overrides: tuple[str, ...]
    added: tuple[int, ...]
    reclaimed: tuple[int, ...]
    rollout_workers: int  # active rollout workers once serving
    lead_s: float  # segment start -> reclaim moment (nominal: see min_in_flight)
    settle_s: float  # reclaim moment -> segment end
    warm_batches: int  # taken before the segment: the tracker fits real turn times from them
    notices: tuple[float, ...]  # real (wall-clock) seconds
    label: tuple[str, ...]  # how each notice is named in the table
    min_in_flight: int = 1  # generations on the leaving workers the first event waits for
    trigger_s: float = 30.0  # ... at most this long after its nominal time
    start_timeout_s: float = 180.0


def sim_setup(scale: float, small: bool = False) -> Setup:
    """The shrunk sim cluster; ``small``: one notice, one warm batch, a short lead and settle (a
    smoke run)."""
    notices = (30.0,) if small else (30.0, 120.0)
    return Setup(
        name=f"sim engines (configs/sim-32.toml shrunk), time x{scale:g}",
        config=ROOT / "configs" / "sim-32.toml",
        overrides=(
            "cluster.training_gpus=0-3",
            "cluster.reserved_gpus=4-7",
            "cluster.preemptible_gpus=8-15",
            "daemon.borrow=never",
            "daemon.pd=colocated",
            "daemon.tick_s=0.1",
            "rl.env=tool_use",
            "workload.batch=16",
            "workload.group_size=4",
            "rl.max_turns=4",
            "rl.max_new_tokens=256",
            f"engine.sim.time_scale={scale}",
        ),
        added=tuple(range(8, 16)),
        reclaimed=(8, 9, 10, 11),
        rollout_workers=6,
        # small: the warm batch has the pipeline running; 2 s before the first event and 2 s
        # after the reclaim are enough for a smoke run's figures
        lead_s=max(notices) * scale + (2.0 if small else 6.0),
        settle_s=2.0 if small else max(8.0, 60 * scale),
        min_in_flight=4,
        trigger_s=5.0,
        warm_batches=1 if small else 2,
        notices=tuple(n * scale for n in notices),
        label=tuple(f"{n:g} s (x{scale:g}: {n * scale:g} s)" for n in notices),
    )


def torch_setup(notices: tuple[float, ...], share: float) -> Setup:
    return Setup(
        name=f"torch engine (configs/local-cpu.toml, tiny, device_share={share:g})",
        config=ROOT / "configs" / "local-cpu.toml",
        overrides=(
            "cluster.training_gpus=0",
            "cluster.reserved_gpus=1-3",
            "cluster.preemptible_gpus=4-5",
            "daemon.borrow=never",
            "daemon.pd=colocated",
            "daemon.heartbeat_s=1.0",
            "daemon.tick_s=0.1",
            "rl.env=tool_use",
            "workload.batch=8",
            "workload.group_size=4",
            "workload.max_trajectory_tokens=1024",
            "rl.max_turns=2",
            "rl.max_new_tokens=256",
            f"engine.torch.device_share={share}",
        ),
        added=(4, 5),
        reclaimed=(5,),
        rollout_workers=5,
        lead_s=max(notices) + 6.0,
        settle_s=25.0,
        min_in_flight=2,
        warm_batches=1,
        notices=notices,
        label=tuple(f"{n:g} s" for n in notices),
        start_timeout_s=300.0,
    )


@dataclass
class Gen:
    submit: float
    done: float
    prompt: int
    out: int
    cached: int
    aborted: bool
    trajectory: str


@dataclass
class Recorder:
    """Every generation of the pipeline: wraps its generate function (set at ``start()``)."""

    gens: list[Gen] = field(default_factory=list)

    def attach(self, pipeline: Any) -> None:
        inner = pipeline.generate_fn
        assert inner is not None, "the pipeline actor attaches generate at start()"

        async def generate(ids: tuple[int, ...], sampling: Any, trajectory_id: str) -> Any:
            t = time.monotonic()
            r = await inner(ids, sampling, trajectory_id)
            self.gens.append(
                Gen(
                    submit=t,
                    done=time.monotonic(),
                    prompt=len(ids),
                    out=len(r.output_ids),
                    cached=r.cached_tokens,
                    aborted=r.finish_reason is FinishReason.ABORT,
                    trajectory=trajectory_id,
                )
            )
            return r

        pipeline.attach(generate)


def router_stats(rt: Any) -> dict[str, Any]:
    ref = rt.daemon.directory.get(names.ROUTER).ref
    return dict(ref.proxy().stats().get(timeout=5.0))


def wait_for(rt: Any, pred: Any, timeout: float, what: str) -> dict[str, Any]:
    """The status once ``pred`` holds of it."""

    def ready() -> dict[str, Any] | None:
        s: dict[str, Any] = status_plain(rt.status())
        return s if pred(s) else None

    got: dict[str, Any] = wait_until(ready, timeout, what, every=0.1)
    return got


def run(setup: Setup, notice_s: float | None) -> dict[str, Any]:
    import pearl

    tmp = Path(tempfile.mkdtemp(prefix="bench-notice-"))
    rt = pearl.Runtime.from_config(setup.config, state_dir=tmp / "state", overrides=setup.overrides)
    rec = Recorder()
    rt.start()
    out: dict[str, Any] = {"notice_s": notice_s}
    try:
        pipeline = rt.daemon.batches()
        rec.attach(pipeline)
        rt.event(ev.GpusAdded(gpus=setup.added))

        def serving(s: dict[str, Any]) -> bool:
            n = [w for w in s["workers"] if w["role"] != "training" and w["activity"] == "active"]
            return len(n) == setup.rollout_workers and s["plan"] is None

        s = wait_for(
            rt=rt, pred=serving, timeout=setup.start_timeout_s, what="every rollout worker serving"
        )
        leaving = sorted(
            w["id"]
            for w in s["workers"]
            if w["role"] != "training" and set(w["gpus"]) & set(setup.reclaimed)
        )
        for _ in range(setup.warm_batches):
            if rt.next_batch(timeout_s=setup.start_timeout_s) is None:
                raise TimeoutError("no warm-up batch")
        warm = time.monotonic()
        batches: list[float] = []
        stop = threading.Event()

        def consume() -> None:
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):  # none yet: ask again
                    if rt.next_batch(timeout_s=1.0) is not None:
                        batches.append(time.monotonic())

        loads: list[tuple[float, int, int]] = []  # (t, load on leaving workers, total load)

        def sample() -> None:
            while not stop.is_set():
                with contextlib.suppress(Exception):
                    load = router_stats(rt)["load"]
                    loads.append(
                        (
                            time.monotonic(),
                            sum(load.get(w, 0) for w in leaving),
                            sum(load.values()),
                        )
                    )
                time.sleep(0.1)

        threads = [threading.Thread(target=f, daemon=True) for f in (consume, sample)]
        migrated0 = router_stats(rt)["migrated"]
        t0 = time.monotonic()
        for th in threads:
            th.start()

        def on_leaving() -> int:
            return sum(router_stats(rt)["load"].get(w, 0) for w in leaving)

        # The first event (the notice, or the reclaim without one) waits from its nominal time
        # until the workers to be reclaimed hold min_in_flight generations: every scenario meets
        # work in flight there, whatever the timing noise.
        first = t0 + setup.lead_s - (notice_s or 0.0)
        time.sleep(max(0.0, first - time.monotonic()))
        while on_leaving() < setup.min_in_flight and time.monotonic() < first + setup.trigger_s:
            time.sleep(0.02)
        out["trigger_wait_s"] = time.monotonic() - first
        first = time.monotonic()
        reclaim_at = first + (notice_s or 0.0)
        if notice_s is not None:
            out["in_flight_at_notice"] = on_leaving()
            rt.event(ev.GpusReclaiming(gpus=setup.reclaimed, deadline=time.time() + notice_s))
        time.sleep(max(0.0, reclaim_at - 0.05 - time.monotonic()))
        out["in_flight_at_reclaim"] = on_leaving()
        time.sleep(max(0.0, reclaim_at - time.monotonic()))
        present = set(status_plain(rt.status())["gpus"]["present"])
        if set(setup.reclaimed) & present:
            out["reclaim"] = "gpus-reclaimed sent"
            try:
                rt.event(ev.GpusReclaimed(gpus=setup.reclaimed))
            except Exception as e:  # noqa: BLE001 - recorded: the table says what happened
                out["reclaim"] = f"gpus-reclaimed refused: {e}"
        else:
            out["reclaim"] = "already reclaimed at the deadline"
        if notice_s is None:
            out["in_flight_at_notice"] = out["in_flight_at_reclaim"]
        t1 = reclaim_at + setup.settle_s
        time.sleep(max(0.0, t1 - time.monotonic()))
        stop.set()
        for th in threads:
            th.join(10)
        migrated = router_stats(rt)["migrated"] - migrated0
        # An abort is in Pipeline.migrations once its resumption completed: give them time.
        aborts = [g for g in rec.gens if g.aborted and t0 <= g.done <= t1]
        deadline = time.monotonic() + 60.0
        while time.monotonic() < deadline:
            moved = [m for m in list(pipeline.migrations) if t0 <= m[0] <= t1]
            if len(moved) >= len(aborts):
                break
            time.sleep(0.2)
        plans = rt.daemon.plans.plans()
        final = status_plain(rt.status())
    finally:
        rt.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    seg = t1 - t0
    gens = [g for g in rec.gens if t0 <= g.done <= t1]
    turns = sorted(g.done for g in rec.gens if not g.aborted)
    gaps = list(zip(turns, turns[1:], strict=False))
    # The same window in every scenario: from the longest notice (and 0.5 s) before the reclaim.
    w0 = reclaim_at - max(setup.notices) - 0.5
    before = [b - a for a, b in gaps if warm <= a and b < w0]
    window = [b - a for a, b in gaps if b >= w0 and a <= t1]
    typical = statistics.median(before) if before else 0.0
    removal = [
        p
        for p in plans
        if p.begin >= first - 0.5
        and p.outcome == "committed"
        and setup.rollout_workers > p.target.N
    ]
    held = [x[1] for x in loads if first - 0.5 <= x[0] <= reclaim_at]
    out.update(
        {
            "leaving_workers": leaving,
            "aborted": len(moved),
            "aborted_generations_seen": len(aborts),
            "migrated_early": migrated,
            "tokens_recomputed": sum(m[1] for m in moved),
            "paused_s": max(0.0, max(window, default=0.0) - typical),
            "longest_gap_s": max(window, default=0.0),
            "typical_gap_s": typical,
            "plan_ready_s": (removal[0].end - reclaim_at)
            if removal and removal[0].end is not None
            else None,
            "plans": [
                f"{p.cause}: {p.before} -> {p.target} ({p.outcome}) "
                f"{p.begin - reclaim_at:+.2f}..{(p.end or float('nan')) - reclaim_at:+.2f}s"
                for p in plans
                if p.begin >= t0
            ],
            "max_in_flight_on_leaving": max(held, default=0),
            "turns_completed": sum(1 for g in gens if not g.aborted),
            "turn_s_median": statistics.median([g.done - g.submit for g in gens if not g.aborted])
            if any(not g.aborted for g in gens)
            else None,
            "batches": len(batches),
            "generated_tokens": sum(g.out for g in gens),
            "segment_s": seg,
            "throughput_tok_s": sum(g.out for g in gens) / seg,
            "failed_trajectories": pipeline.failed,
            "final_workers": sum(
                1 for w in final["workers"] if w["role"] != "training" and w["activity"] == "active"
            ),
        }
    )
    return out


def report(setup: Setup, rows: list[dict[str, Any]]) -> str:
    base = rows[0]
    lines = [
        setup.name,
        f"  reclaim of GPUs {list(setup.reclaimed)} at ~+{setup.lead_s:g} s of a "
        f"~{setup.lead_s + setup.settle_s:g} s segment; the first event waits for "
        f">= {setup.min_in_flight} generations on the workers to be reclaimed",
        f"{'notice':>24} {'in flight':>9} {'aborted':>7} {'migr.':>5} {'recomputed':>10} "
        f"{'paused s':>8} {'gap/typ s':>11} {'plan s':>7} {'tok/s':>7}  vs no notice",
    ]
    for r, name in zip(rows, ("none", *setup.label), strict=True):
        thr = r["throughput_tok_s"] / base["throughput_tok_s"] if base["throughput_tok_s"] else 0
        rec = (
            f"{r['tokens_recomputed'] / base['tokens_recomputed']:.2f}x"
            if base["tokens_recomputed"]
            else "-"
        )
        plan = "-" if r["plan_ready_s"] is None else f"{r['plan_ready_s']:+.2f}"
        lines.append(
            f"{name:>24} {r['in_flight_at_notice']:>4}/{r['in_flight_at_reclaim']:<4} "
            f"{r['aborted']:>7} {r['migrated_early']:>5} {r['tokens_recomputed']:>10} "
            f"{r['paused_s']:>8.2f} {r['longest_gap_s']:>5.2f}/{r['typical_gap_s']:<5.2f} "
            f"{plan:>7} {r['throughput_tok_s']:>7.0f}  "
            f"throughput {thr:.2f}x, recomputed {rec}"
        )
    lines.append(
        "  in flight: the router's load on the reclaimed workers at the notice / just before the "
        "reclaim moment"
    )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", choices=("sim", "torch", "both"), default="both")
    ap.add_argument("--scale", type=float, default=0.1, help="sim time scale (notices too)")
    ap.add_argument(
        "--torch-notices", type=float, nargs="+", default=[30.0, 3.0], help="seconds (real)"
    )
    ap.add_argument("--device-share", type=float, default=0.15, help="torch: cores per slot")
    ap.add_argument("--repeat", type=int, default=1, help="rounds of every scenario")
    ap.add_argument("--json", type=Path, help="write the figures here")
    ap.add_argument("-v", "--verbose", action="store_true")
    ap.add_argument(
        "--small",
        action="store_true",
        help="sim engines only, at time x0.02, one notice (a smoke run)",
    )
    args = ap.parse_args()
    if args.small:
        args.engine, args.scale = "sim", 0.02
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING)
    setups = []
    if args.engine in ("sim", "both"):
        setups.append(sim_setup(args.scale, args.small))
    if args.engine in ("torch", "both"):
        setups.append(torch_setup(tuple(args.torch_notices), args.device_share))
    results: dict[str, Any] = {}
    tables = []
    for setup in setups:
        for k in range(args.repeat):  # every scenario once per round, rounds in turn
            rows = []
            for n in (None, *setup.notices):
                t = time.monotonic()
                r = run(setup, n)
                print(f"  [{setup.name}] notice {n}: {time.monotonic() - t:.0f}s wall", flush=True)
                print("   ", json.dumps(r, default=str), flush=True)
                rows.append(r)
            tables.append(report(setup, rows) + f"\n  (round {k + 1} of {args.repeat})")
            print(tables[-1], flush=True)
            results.setdefault(setup.name, []).append(rows)
    print("\n" + "\n\n".join(tables))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
