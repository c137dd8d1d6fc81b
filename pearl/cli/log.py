"""``pearl log verify|show|replay DIR``: read an event log without changing it.

Every sub-command opens the log read-only (no lock, no repair). Problems become one line on
stderr and a non-zero exit: damaged logs raise :class:`LogCorrupted`, unreadable paths
:class:`LogError`.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from collections.abc import Callable
from typing import Any

from pearl.cli.args import Subparsers
from pearl.config import format_gpus as _span
from pearl.core.errors import LogError
from pearl.core.events import Record
from pearl.core.schema import to_plain
from pearl.core.state import ClusterState
from pearl.log.file import FileLog
from pearl.log.segments import log_dir
from pearl.log.verify import verify

Handler = Callable[[argparse.Namespace], int]


def register(subparsers: Subparsers) -> None:
    p = subparsers.add_parser("log", help="inspect an event log (verify, show, replay)")
    sub = p.add_subparsers(dest="log_command", metavar="ACTION", required=True)

    v = sub.add_parser("verify", help="check frames, sequence numbers, replay and snapshots")
    v.add_argument("dir", help="log directory")
    v.set_defaults(handler=_guard(cmd_verify))

    s = sub.add_parser("show", help="print records, one per line")
    s.add_argument("dir", help="log directory")
    s.add_argument("--json", action="store_true", help="one JSON object per line")
    s.add_argument("--from", dest="start", type=_seq, default=1, metavar="SEQ")
    s.add_argument("--until", type=_seq, default=None, metavar="SEQ")
    s.set_defaults(handler=_guard(cmd_show))

    r = sub.add_parser("replay", help="the table as of a sequence number")
    r.add_argument("dir", help="log directory")
    r.add_argument("--until", type=_seq, default=None, metavar="SEQ")
    r.add_argument("--json", action="store_true", help="print ClusterState.to_json() as one object")
    r.set_defaults(handler=_guard(cmd_replay))


def _seq(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a sequence number, got {text!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"sequence numbers are >= 0, got {n}")
    return n


def _guard(handler: Handler) -> Handler:
    """OS errors become LogError (one line from pearl.cli.main); a closed pipe ends quietly."""

    @functools.wraps(handler)
    def run(args: argparse.Namespace) -> int:
        args.dir = log_dir(args.dir)
        try:
            return handler(args)
        except BrokenPipeError:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())  # so the exit-time flush does not complain
            return 0
        except OSError as e:
            where = e.filename or args.dir
            raise LogError(f"{where}: {e.strerror or e}") from None

    return run


def cmd_verify(args: argparse.Namespace) -> int:
    verdict = verify(args.dir)
    if verdict.ok:
        print(verdict)
    else:
        print(f"pearl log: {verdict}", file=sys.stderr)
    return 0 if verdict.ok else 1


def cmd_show(args: argparse.Namespace) -> int:
    with FileLog(args.dir, readonly=True) as log:
        out = sys.stdout
        fmt = _json_line if args.json else _text_line
        for seq, record in log.read(args.start, args.until):
            out.write(fmt(seq, record))
        out.flush()
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    with FileLog(args.dir, readonly=True) as log:
        loaded = log.load(args.until)
    if args.json:
        print(json.dumps(loaded.state.to_json()))
    else:
        print(render(loaded.state))
    return 0


def record_json(seq: int, record: Record) -> dict[str, Any]:
    """``{"seq": N, "kind": K, field: value, ...}``: the record's plain fields, no version."""
    out: dict[str, Any] = {"seq": seq, "kind": record.KIND}
    out.update(to_plain(record))
    return out


def _json_line(seq: int, record: Record) -> str:
    return json.dumps(record_json(seq, record)) + "\n"


def _text_line(seq: int, record: Record) -> str:
    fields = " ".join(f"{k}={_short(v)}" for k, v in to_plain(record).items())
    return f"{seq:>8}  {record.KIND:<18} {fields}\n"


def _short(v: object) -> str:
    if isinstance(v, list | tuple):
        return ",".join(map(str, v)) if all(isinstance(x, int) for x in v) else json.dumps(v)
    if isinstance(v, dict):
        return json.dumps(v, separators=(",", ":"))
    return str(v)


def render(state: ClusterState) -> str:
    """A human view of the table: summary lines, then one row per worker."""
    j = state.to_json()
    g = j["gpus"]
    lines = [
        f"seq {j['seq']}  tp {j['tp']}  mode {j['mode']}  "
        f"P/D/C {j['N_P']}/{j['N_D']}/{j['N_C']} active",
        f"training: phase {j['phase']}, step {j['training_step']}, "
        f"weights v{j['weights_version']}, GPUs {_span(g['training'])}",
        f"dedicated: reserved {_span(g['reserved'])}, present preemptible {_span(g['present'])}"
        + (f", reclaiming {_span(g['reclaiming'])}" if g["reclaiming"] else ""),
    ]
    plan = state.plan
    if plan is not None:
        lines.append(
            f"plan {plan.plan} in flight ({plan.cause}) -> {plan.target}: "
            f"{len(plan.done)}/{len(plan.steps)} steps done"
        )
    lines.append(f"{'worker':>6}  {'role':<10} {'activity':<13} {'zone':<9} gpus")
    for w in j["workers"]:
        lines.append(
            f"{w['id']:>6}  {w['role']:<10} {w['activity']:<13} {w['zone']:<9} {_span(w['gpus'])}"
        )
    if not j["workers"]:
        lines.append("     (no workers)")
    return "\n".join(lines)


__all__ = ["cmd_replay", "cmd_show", "cmd_verify", "record_json", "register", "render"]
