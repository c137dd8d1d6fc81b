"""``pearl demo``: the main job on the embedded default (see :mod:`pearl.demo.job`)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from pearl.cli.args import Subparsers


def register(subparsers: Subparsers) -> None:
    p = subparsers.add_parser("demo", help="run asynchronous agentic RL on an elastic pool")
    p.add_argument("--config", default="configs/local-cpu.toml", help="default: %(default)s")
    p.add_argument("--steps", type=int, default=16, help="training steps (default: %(default)s)")
    p.add_argument("--out", type=Path, help="report directory (default: runs/<time>)")
    p.add_argument(
        "--segment", help="Bamboo segment to replay: S1, S2 or S3 (default: demo.segment, S2)"
    )
    p.add_argument("--trace-s", type=float, help="seconds the 2-hour segment is squeezed into")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    p.add_argument("--quiet", action="store_true", help="no live status line")
    p.add_argument(
        "--seed",
        type=int,
        help="fixes tasks, sampling and initial weights "
        "(rl.seed and engine.torch.seed; default: the config's)",
    )
    p.add_argument(
        "--no-warm-start",
        action="store_true",
        help="start GRPO from the preset's random weights (no supervised warm start; "
        "also demo.warm_start = false)",
    )
    p.add_argument(
        "--eval-every",
        type=int,
        help="held-out evaluation every N steps, and after the last (0: none; "
        "default: demo.eval_every, 4)",
    )
    p.add_argument(
        "--eval-tasks", type=int, default=64, help="held-out tasks (default: %(default)s)"
    )
    p.add_argument(
        "--lr", type=float, default=1e-3, help="GRPO learning rate (default: %(default)s)"
    )
    p.add_argument(
        "--cache-dir",
        type=Path,
        help="where warm starts are cached (default: warm-start/ beside the run)",
    )
    p.set_defaults(handler=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    import signal

    from pearl import config as config_mod
    from pearl.demo import Learning, run, summary_table, virtual_devices

    def interrupt(*_: object) -> None:  # SIGTERM stops the demo like Ctrl-C: cleanly
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)

    if args.steps < 1:
        raise SystemExit("pearl demo: --steps must be >= 1")
    if (args.eval_every is not None and args.eval_every < 0) or args.eval_tasks < 1:
        raise SystemExit("pearl demo: --eval-every must be >= 0 and --eval-tasks >= 1")
    out = args.out or Path("runs") / time.strftime("%Y%m%d-%H%M%S")
    plan = config_mod.load(args.config, list(args.set)).demo
    devices = virtual_devices(args.config, tuple(args.set))[1]["line"]
    print(
        f"pearl demo: {args.steps} steps on {args.config}; {devices}; report in {out}/", flush=True
    )
    summary = run(
        args.config,
        args.steps,
        out,
        segment=args.segment,
        trace_s=args.trace_s,
        overrides=tuple(args.set),
        quiet=args.quiet,
        seed=args.seed,
        lr=args.lr,
        learning=Learning(
            env=plan.env,
            warm_start=plan.warm_start and not args.no_warm_start,
            eval_every=plan.eval_every if args.eval_every is None else args.eval_every,
            eval_tasks=args.eval_tasks,
            cache_dir=args.cache_dir,
        ),
    )
    print(
        f"{summary['steps']} steps in {summary['elapsed_s']:.0f} s: "
        f"{summary['throughput_tok_s']:.0f} tokens/s (generated + trained); borrowed workers "
        f"back {summary['mean_return_s'] * 1e3:.0f} ms after Training Begin on average "
        f"(max {summary['max_return_s'] * 1e3:.0f} ms); hosts declared dead for missed "
        f"heartbeats: {summary['missed_heartbeats']}"
    )
    print(summary_table(summary))
    for path in summary["plots"]:
        print(f"  {path}")
    print(f"  {out / 'report.json'}")
    return 130 if summary["interrupted"] else 0


__all__ = ["register"]
