"""``pearl simulate``: replay a preemptible-GPU trace at paper scale and compare policies.

The real controller (``pearl.core.controller``) drives a simulated cluster: 16 training GPUs, 4
reserved rollout GPUs and up to 12 preemptible ones following the trace, TP2 workers. Prints each
policy's average system throughput (generation + training tokens per second, §6.1) and its ratio
to ROLL, with the controller's invariant violations and late GPU returns (both must be 0).

Traces: Bamboo event logs (``t_ms,add|remove,nodeN``; --segment S1|S2|S3 picks the paper's
two-hour windows and, without --trace, the packaged file) or a CSV ``t_s,gpus`` of preemptible GPU
counts. --experiments adds the ablation (Figure 7), the PD-ratio selection against the brute-force
best (Table 2) and the workload sensitivity (Figure 8).

--from-log STATE_DIR replays a recorded pearld run instead: the log's elastic events, training
steps and telemetry drive the same controller under each --policy (own = the run's own policy,
pearl, rlboost, roll, colocated, disaggregated, no-borrow, always-borrow; comma list or all), and
the result is printed beside what really happened (pearl/sim/counterfactual.py). --config and
--set give the run's config (priors, decision knobs, policy); default: the embedded defaults.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from pearl.cli.args import Subparsers
from pearl.core.errors import ConfigError
from pearl.sim import availability as av
from pearl.sim import experiments as ex
from pearl.sim import plots, report
from pearl.sim.scenario import MAIN_POLICIES, MODELS, POLICIES, scenario

EXPERIMENTS = ("ablation", "ratio", "sensitivity")


def register(sub: Subparsers) -> None:
    p = sub.add_parser(
        "simulate",
        help="replay a GPU availability trace at paper scale and compare policies",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", default="qwen3-8b", help=f"one of {', '.join(MODELS)}")
    p.add_argument(
        "--trace",
        metavar="FILE",
        help="Bamboo event trace or t_s,gpus CSV (default with --segment: packaged)",
    )
    p.add_argument("--segment", metavar="S", help="S1, S2 or S3 (paper §6.1, SEGMENTS.md)")
    p.add_argument("--start-min", type=float, metavar="M", help="start of the window (minutes)")
    p.add_argument("--minutes", type=float, metavar="N", help="length of the window (default 120)")
    p.add_argument(
        "--policy", default="all", help="pearl, roll, roll-large, rlboost+ or all (default all)"
    )
    p.add_argument("--seed", type=int, default=0, help="workload seed (default 0)")
    p.add_argument(
        "--experiments",
        default="",
        metavar="LIST",
        help="comma list of ablation, ratio, sensitivity, or all",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="N",
        help="processes for independent runs (default 1)",
    )
    p.add_argument("--json", metavar="FILE", help="write the results as JSON")
    p.add_argument("--plot", metavar="DIR", help="write PNG figures into DIR")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument(
        "--from-log", metavar="DIR", help="replay a pearld state dir's log under other policies"
    )
    p.add_argument("--config", metavar="FILE", help="with --from-log: the run's config")
    p.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="with --from-log: config override (repeatable)",
    )
    p.set_defaults(handler=run)


class Bar:
    """A one-line progress bar on stderr (a line per 10% when stderr is not a terminal)."""

    def __init__(self, stream: TextIO, enabled: bool = True) -> None:
        self.stream, self.enabled = stream, enabled
        self.tty = stream.isatty()
        self.last = -1
        self.t0 = time.monotonic()

    def __call__(self, frac: float, label: str) -> None:
        if not self.enabled:
            return
        pct = int(100 * min(max(frac, 0.0), 1.0))
        step = 1 if self.tty else 10
        if pct // step == self.last // step and pct != 100:
            return
        self.last = pct
        bar = "#" * (pct // 4) + "." * (25 - pct // 4)
        line = f"[{bar}] {pct:3d}% {label} ({time.monotonic() - self.t0:.0f}s)"
        if self.tty:
            self.stream.write("\r" + line.ljust(78)[:78])
            if pct == 100:
                self.stream.write("\n")
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def stage(self, name: str) -> Any:
        self.last = -1
        return lambda f, label="": self(f, f"{name}: {label}" if label else name)


def _policies(arg: str) -> tuple[str, ...]:
    if arg == "all":
        return MAIN_POLICIES
    if arg not in POLICIES:
        raise ConfigError(f"unknown policy {arg!r} (known: {', '.join(POLICIES)}, all)")
    return (arg,)


def _experiments(arg: str) -> tuple[str, ...]:
    names = tuple(x.strip() for x in arg.split(",") if x.strip())
    if names == ("all",):
        return EXPERIMENTS
    bad = [n for n in names if n not in EXPERIMENTS]
    if bad:
        raise ConfigError(f"unknown experiment {bad[0]!r} (known: {', '.join(EXPERIMENTS)}, all)")
    return names


def plot_directory(plot: str | None) -> Path | None:
    """``--plot DIR``, created (None without it); a directory that cannot be made is an error."""
    plot_dir = Path(plot) if plot else None
    if plot_dir is not None:
        try:
            plot_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"cannot create plot directory {plot_dir}: {e}") from None
    return plot_dir


def run(args: argparse.Namespace) -> int:
    if args.from_log:
        from pearl.cli.whatif import run_from_log

        return run_from_log(args)
    if args.config or args.sets:
        raise ConfigError("--config and --set apply to --from-log only")
    if args.model not in MODELS:
        raise ConfigError(f"unknown model {args.model!r} (simulated: {', '.join(MODELS)})")
    if args.workers < 1:
        raise ConfigError(f"--workers must be >= 1, got {args.workers}")
    names = _policies(args.policy)
    wanted = _experiments(args.experiments)
    avail = av.load(
        args.trace, segment_name=args.segment, start_min=args.start_min, minutes=args.minutes
    )
    plot_dir = plot_directory(args.plot)
    sc = scenario(args.model, seed=args.seed)
    bar = Bar(sys.stderr, not args.no_progress)
    runs = ex.compare(
        sc=sc, avail=avail, names=names, workers=args.workers, progress=bar.stage("policies")
    )
    where = args.segment or f"{Path(args.trace).name} from minute {args.start_min or 0:g}"
    print(
        f"{args.model}, {where}: mean {4 + avail.mean():.1f} rollout GPUs, "
        f"{len(avail.changes())} changes in {avail.duration_s / 60:.0f} min, seed {args.seed}"
    )
    print(report.main_table(runs))
    extras: dict[str, Any] = {}
    if "ablation" in wanted:
        extras["ablation"] = ex.ablation(sc, workers=args.workers, progress=bar.stage("ablation"))
        print("\nAblation, throughput over ROLL (Figure 7):")
        print(report.ablation_table(extras["ablation"]))
    if "ratio" in wanted:
        extras["ratio_selection"] = ex.ratio_selection(
            sc, workers=args.workers, progress=bar.stage("ratio selection")
        )
        print("\nPD ratio selection vs brute-force best (Table 2):")
        print(report.ratio_table(extras["ratio_selection"]))
    if "sensitivity" in wanted:
        extras["sensitivity"] = ex.sensitivity(
            sc, workers=args.workers, progress=bar.stage("sensitivity")
        )
        print("\nWorkload sensitivity, 8 dedicated GPUs (Figure 8):")
        print(report.sensitivity_table(extras["sensitivity"]))
    if args.json:
        doc = report.document(
            model=args.model,
            avail=avail,
            runs=runs,
            extras=extras,
            seed=args.seed,
            segment=args.segment,
        )
        try:
            Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
        except OSError as e:
            raise ConfigError(f"cannot write {args.json}: {e}") from None
    if plot_dir is not None:
        tag = f"{args.model}-{args.segment or 'trace'}"
        plots.per_step(runs, plot_dir / f"per-step-{tag}.png", f"{args.model}, {where}")
        if "ablation" in extras:
            plots.ablation(extras["ablation"], plot_dir / f"ablation-{args.model}.png")
        if "ratio_selection" in extras:
            plots.ratio_selection(extras["ratio_selection"], plot_dir / f"ratio-{args.model}.png")
        if "sensitivity" in extras:
            plots.sensitivity(extras["sensitivity"], plot_dir / f"sensitivity-{args.model}.png")
    bad = sum(r.invariant_violations + r.late_returns for r in runs.values())
    return 0 if bad == 0 else 3
