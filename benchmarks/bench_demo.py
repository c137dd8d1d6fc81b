"""The demo job with PEARL's adaptive control vs a fixed colocated configuration, same trace.

Both run ``pearl demo``'s job (tiny Qwen3 workers on the torch engine, the tool-use environment,
real GRPO steps) on configs/local-cpu.toml with the same Bamboo segment squeezed into the same
wall time. PEARL decides the PD mode and ratio and borrows the training slots through the gate;
the baselines keep every worker colocated and never borrow (what an elastic but PD-unaware
system does) or always borrow (an ungated toggle). Runs alternate (PEARL, baselines, PEARL, ...)
so machine noise hits all alike. Also reports the time from Training Begin to the last borrowed
worker being back, the median error of PEARL's predicted step makespan from step 3 on (eq. 1-3 on
the profile of the steps before, for the workers and concurrency the batch ran with; and the pure
forecast made before the batch was handed out), and the share of gate-approved borrow windows in
which lent workers really served.

    .venv/bin/python benchmarks/bench_demo.py [--steps 16] [--rounds 2] [--segment S2]
        [--set KEY=VALUE ...] [--json FILE] [--keep DIR]

``--set`` changes the job for every policy alike (e.g. ``--set workload.batch=48``); the figures
in the README are for the default job.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pearl import demo  # noqa: E402
from pearl.demo import makespan_errors  # noqa: E402

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "local-cpu.toml"
POLICIES = {
    "pearl": (),
    "fixed colocated": ("daemon.pd=colocated", "daemon.borrow=never"),
    "always borrow": ("daemon.pd=colocated", "daemon.borrow=always"),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--segment", default="S2")
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config override for every policy's run (e.g. workload.batch=48); repeatable",
    )
    ap.add_argument("--json", type=Path, help="write the figures as JSON to this file")
    ap.add_argument("--keep", type=Path, help="keep each run's directory (report.json) under DIR")
    ap.add_argument("--small", action="store_true", help="1 step of 8 trajectories (a smoke run)")
    args = ap.parse_args()
    if args.small:  # every policy still runs; only the batch is cut (its --set still wins)
        args.steps, args.rounds = 1, 1
        args.set = ["workload.batch=8", "rl.max_new_tokens=16", *args.set]
    if args.keep is not None and args.keep.exists() and any(args.keep.iterdir()):
        ap.error(f"--keep {args.keep}: not empty (each run needs a fresh directory)")
    trace_s = 4.0 * args.steps
    results: dict[str, list[dict]] = {name: [] for name in POLICIES}
    with tempfile.TemporaryDirectory(prefix="bench_demo-") as tmp:
        runs = args.keep or Path(tmp)
        for r in range(args.rounds):
            for name, overrides in POLICIES.items():
                out = runs / f"{name.replace(' ', '-')}-{r}"
                s = demo.run(
                    CONFIG,
                    args.steps,
                    out,
                    segment=args.segment,
                    trace_s=trace_s,
                    overrides=(*args.set, *overrides),
                    quiet=True,
                )
                results[name].append(s)
                print(
                    f"round {r + 1} {name:<16} {s['throughput_tok_s']:8.0f} tok/s over "
                    f"{s['elapsed_s']:5.1f} s; return after Training Begin mean "
                    f"{1e3 * s['mean_return_s']:.0f} ms, max {1e3 * s['max_return_s']:.0f} ms",
                    flush=True,
                )
    print()
    tput = {n: statistics.mean(x["throughput_tok_s"] for x in v) for n, v in results.items()}
    print(f"{'policy':<16} {'tokens/s':>9} {'vs fixed':>9} {'return mean':>12} {'return max':>11}")
    for name, v in results.items():
        mean_ret = statistics.mean(x["mean_return_s"] for x in v)
        max_ret = max(x["max_return_s"] for x in v)
        print(
            f"{name:<16} {tput[name]:>9.0f} {tput[name] / tput['fixed colocated']:>8.2f}x "
            f"{1e3 * mean_ret:>10.0f}ms {1e3 * max_ret:>9.0f}ms"
        )
    pearl = results["pearl"]
    errors = [abs(e) for s in pearl for e in makespan_errors(s["records"])]
    forecast = [abs(e) for s in pearl for e in makespan_errors(s["records"], "forecast_makespan_s")]
    approved = sum(s["borrow"]["approved"] for s in pearl)
    served = sum(s["borrow"]["served"] for s in pearl)
    figures = {
        "pearl_over_fixed": tput["pearl"] / tput["fixed colocated"],
        "pearl_over_always_borrow": tput["pearl"] / tput["always borrow"],
        "makespan_median_abs_error": statistics.median(errors) if errors else None,
        "makespan_forecast_median_abs_error": statistics.median(forecast) if forecast else None,
        "borrow_served_fraction": served / approved if approved else None,
        "borrow_windows_approved": approved,
        "borrow_aborted_by_training_begin": sum(
            s["borrow"]["aborted_by_training_begin"] for s in pearl
        ),
        "return_max_s": max(x["max_return_s"] for v in results.values() for x in v),
        "pearl_return_max_s": max(s["max_return_s"] for s in pearl),
        # Generations aborted while a step trained (the return, a removal), mean per run.
        "migrated_per_run": {
            n: statistics.mean(x["borrow"].get("migrated", 0) for x in v)
            for n, v in results.items()
        },
        "throughput_tok_s": tput,
        "steps": args.steps,
        "rounds": args.rounds,
    }
    print()
    for k in (
        "pearl_over_fixed",
        "pearl_over_always_borrow",
        "makespan_median_abs_error",
        "makespan_forecast_median_abs_error",
        "borrow_served_fraction",
        "borrow_aborted_by_training_begin",
        "return_max_s",
        "pearl_return_max_s",
    ):
        v = figures[k]
        print(f"{k:<34} {'-' if v is None else f'{v:.3f}'}")
    migrated = ", ".join(f"{n} {m:.1f}" for n, m in figures["migrated_per_run"].items())
    print(f"{'migrated while training':<34} {migrated} (mean per run)")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
