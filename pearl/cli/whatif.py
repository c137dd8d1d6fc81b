"""``pearl simulate --from-log DIR``: a recorded run replayed under other policies (thin shell)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pearl import config as pconfig
from pearl.cli.simulate import plot_directory
from pearl.core.errors import ConfigError
from pearl.core.profile import prior_profile
from pearl.sim import fromlog, plots
from pearl.sim.counterfactual import OWN, choice, policy_of
from pearl.sim.replay_report import compare, render

ALL = (OWN, "pearl", "rlboost", "roll", "colocated")


def run_from_log(args: argparse.Namespace) -> int:
    cfg = pconfig.load(args.config, args.sets)
    own = policy_of(cfg)
    names = list(ALL) if args.policy == "all" else [n.strip() for n in args.policy.split(",")]
    for name in names:
        choice(name, own)  # an unknown name fails before the log is read
    plot_dir = plot_directory(args.plot)
    rec = fromlog.read(args.from_log)
    init = rec.init
    c = cfg.cluster
    if (init.tp, tuple(sorted(init.training_gpus))) != (c.tp, tuple(sorted(c.training_gpus))):
        print(
            f"pearl simulate: warning: the config's cluster (tp {c.tp}, training GPUs "
            f"{pconfig.format_gpus(c.training_gpus)}) is not the log's; "
            "pass the run's --config and --set",
            file=sys.stderr,
        )
    doc, summaries = compare(rec=rec, own=own, prior=prior_profile(cfg), names=names)
    print(
        f"{rec.path}: {len(rec.records)} records, {len(rec.telemetry)} telemetry, clock {rec.clock}"
    )
    for note in doc["notes"]:
        print(f"note: {note}")
    print(render(doc))
    if args.json:
        try:
            Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
        except OSError as e:
            raise ConfigError(f"cannot write {args.json}: {e}") from None
    if plot_dir is not None:
        unit = "s" if rec.clock == "telemetry" else "records"
        plots.role_timelines(summaries, plot_dir / "roles-from-log.png", unit)
    return 0
