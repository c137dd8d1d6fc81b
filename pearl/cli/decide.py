"""``pearl decide``: what the PD Decision Engine would pick for a GPU budget, from the priors.

Reads a config, builds the prior workload profile (catalog roofline for cluster.gpu, model.name
and cluster.tp, plus the [workload] priors), and prints the chosen mode and P/D ratio with the
predicted makespan of colocation and of every split, naming the constraint that excluded each
infeasible one. GPU counts become workers of cluster.tp GPUs each. With ``--overlap-gpus`` the
decision covers dedicated plus borrowed workers and the borrowing gate (eq. 7) is shown too.
"""

from __future__ import annotations

import argparse
import json
import math

from pearl import config
from pearl.cli.args import Subparsers, integer
from pearl.core.decision import Decision, decide
from pearl.core.errors import ConfigError
from pearl.core.gate import GateResult, borrow_gate
from pearl.core.profile import WorkloadProfile, prior_profile
from pearl.core.schema import to_plain


def register(sub: Subparsers) -> None:
    p = sub.add_parser(
        "decide",
        help="predict makespans and pick the PD mode and ratio for a GPU budget",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", metavar="FILE", help="TOML config (default: built-in defaults)")
    p.add_argument(
        "--gpus", type=integer, required=True, metavar="N", help="dedicated rollout GPUs available"
    )
    p.add_argument(
        "--overlap-gpus",
        type=integer,
        default=0,
        metavar="M",
        help="training GPUs borrowed for rollout (default 0)",
    )
    p.add_argument("--batch", type=integer, metavar="B", help="trajectories per rollout step")
    p.add_argument(
        "--remaining",
        type=integer,
        metavar="R",
        help="unfinished trajectories for the borrowing gate (default: B)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override a config value (repeatable)",
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    overrides = list(args.set)
    if args.batch is not None:
        overrides.append(f"workload.batch={args.batch}")
    cfg = config.load(args.config, overrides)
    for flag, n in (("--gpus", args.gpus), ("--overlap-gpus", args.overlap_gpus)):
        if n < 0:
            raise ConfigError(f"{flag} must be >= 0, got {n}")
    tp = cfg.cluster.tp
    n_ded, n_ov = args.gpus // tp, args.overlap_gpus // tp
    profile = prior_profile(cfg)
    R = profile.B if args.remaining is None else args.remaining
    if not 0 <= R <= profile.B:
        raise ConfigError(f"--remaining must lie in [0, {profile.B}] (the batch), got {R}")
    d = decide(profile=profile, N=n_ded + n_ov, current=None, cfg=cfg.decision)
    gate = (
        borrow_gate(profile=profile, N_ded=n_ded, N_overlap=n_ov, R=R, cfg=cfg.decision)
        if args.overlap_gpus
        else None
    )
    idle = args.gpus % tp + args.overlap_gpus % tp
    if args.json:
        out = d.to_json()
        out.update(
            {
                "workers": {"dedicated": n_ded, "overlap": n_ov, "total": n_ded + n_ov},
                "gpus": {
                    "dedicated": args.gpus,
                    "overlap": args.overlap_gpus,
                    "idle": idle,
                    "tp": tp,
                },
                "model": cfg.model.name,
                "gpu": cfg.cluster.gpu,
                "profile": to_plain(profile),
            }
        )
        if gate is not None:  # a figure with no prediction is None already: JSON null
            out["gate"] = {**to_plain(gate), "R": R, "B": profile.B}
        print(json.dumps(out, indent=2))
        return 0
    print(
        _text(cfg=cfg, args=args, d=d, p=profile, gate=gate, R=R, n_ded=n_ded, n_ov=n_ov, idle=idle)
    )
    return 0


def _seconds(x: float | None) -> str:
    """``12.3``; ``-`` where there is no prediction (None, or an empty pool's inf)."""
    return "-" if x is None or not math.isfinite(x) else f"{x:.1f}"


def _text(
    cfg: config.Config,
    args: argparse.Namespace,
    d: Decision,
    p: WorkloadProfile,
    gate: GateResult | None,
    R: int,
    n_ded: int,
    n_ov: int,
    idle: int,
) -> str:
    tp = cfg.cluster.tp
    if args.overlap_gpus:
        budget = (
            f"{args.gpus} dedicated + {args.overlap_gpus} overlap GPUs -> "
            f"{n_ded} + {n_ov} = {n_ded + n_ov} workers"
        )
    else:
        budget = f"{args.gpus} GPUs -> {n_ded} workers"
    lines = [f"{cfg.model.name} on {cfg.cluster.gpu}, tp {tp}: {budget}, batch B = {p.B}"]
    if idle:
        lines.append(f"note: {idle} GPU(s) left idle (a worker needs {tp})")
    lines.append(
        f"profile (priors): S={p.S:g} delta_L={p.delta_L:g} r={p.r:g} theta={p.theta:g} "
        f"A={p.A * 1e3:.2f} ms b={p.b * 1e3:.3f} ms t_prefill={p.t_prefill * 1e6:.1f} us "
        f"T_env={p.T_env:g} s T_over={p.T_over:g} s"
    )
    lines.append(
        f"                  K={p.K / 1024:.0f} KiB/token K_seq={p.K_seq / 1e9:.2f} GB "
        f"H_max={p.H_max / 1e9:.1f} GB/worker BW={p.BW / 1e9:.0f} GB/s"
    )
    t = d.target
    lines.append(
        f"decision: {t.mode.value} {t}, predicted makespan "
        f"{_seconds(d.predicted_makespan_s)} s ({d.reason})"
    )
    lines.append("")
    lines.append(f"  {'config':<12} {'makespan_s':>11}  status")
    for a in d.alternatives:
        mark = "*" if a.target == t else " "
        name = f"{a.target}" + (" (coloc)" if a.N_C else "")
        status = "feasible" if a.feasible else f"excluded by {a.excluded_by}"
        lines.append(f"{mark} {name:<12} {_seconds(a.predicted_makespan_s):>11}  {status}")
    if gate is not None:
        state = "on" if gate.enabled else "off"
        lines.append("")
        lines.append(
            f"borrowing gate (eq. 7): ({R}/{p.B}) x (T_ded {_seconds(gate.T_ded)} s - T_full "
            f"{_seconds(gate.T_full)} s) = {_seconds(gate.benefit_s)} s vs T_toggle "
            f"{gate.T_toggle:g} s -> {state}"
        )
    return "\n".join(lines)
