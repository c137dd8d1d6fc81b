"""``pearl top``: a live terminal view of a running pearld, for operators without Grafana.

Every ``--interval`` it asks pearld for its status (the request ``pearl status`` makes) and redraws
one screen: the header (endpoint, log seq, training phase and step, weights), the mode and ratio
with the budget, the decision's predicted makespan against colocation's and the last measured one,
the gate's verdict and the borrow cycles, the workers by role, the plan in flight, and the last
changes. Those come from the change stream ``pearl watch`` reads: subscribed to once, drained
without blocking before each frame, each change described by what differs from the one before.

:func:`render` is pure (a status dict, events, a clock) so it is tested without a daemon, and it
reads every key defensively: what an older pearld does not send shows as ``-``. The screen is
redrawn with ANSI escapes (home, erase), no curses; ``--once``, or a stdout that is not a
terminal, prints plain frames one after the other.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TextIO

from pearl.cli.args import Subparsers
from pearl.cli.remote import _reachable, client, connection_options, fetch_status
from pearl.config import format_gpus
from pearl.core.errors import PearlError
from pearl.core.status import status_plain

if TYPE_CHECKING:
    from transports.pubsub import Subscriber
    from transports.rpc import Client

EVENTS_SHOWN = 8  # changes listed at the bottom of the screen
WIDTH = 100  # frame width when stdout is not a terminal
ROLES = ("prefill", "decode", "colocated", "training")
# ANSI: cursor home, erase to the end of the line, erase below, clear the screen, cursor off/on.
HOME, EOL, BELOW, CLEAR = "\x1b[H", "\x1b[K", "\x1b[J", "\x1b[2J"
HIDE, SHOW = "\x1b[?25l", "\x1b[?25h"

Event = dict[str, Any]  # {"time": epoch seconds, "seq": log seq or None, "text": str}


def register(subparsers: Subparsers) -> None:
    p = subparsers.add_parser(
        "top", help="a live view: workers, ratio, decision, gate, borrow cycles, last changes"
    )
    connection_options(p)
    p.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for pearld")
    p.add_argument(
        "--interval",
        type=float,
        default=1.0,
        metavar="S",
        help="seconds between frames (default %(default)s)",
    )
    p.add_argument(
        "--once", action="store_true", help="print one frame without escape codes and exit"
    )
    p.add_argument(
        "--count", type=int, default=0, metavar="N", help="stop after N frames (default: Ctrl-C)"
    )
    p.set_defaults(handler=cmd_top)


# -- rendering (pure) -----------------------------------------------------------------------------


def _get(d: object, *keys: str | int) -> Any:
    """``d[k1][k2]...``, or None where a key (or a level) is missing."""
    for k in keys:
        if isinstance(d, dict):
            d = d.get(k)
        elif isinstance(d, list) and isinstance(k, int) and -len(d) <= k < len(d):
            d = d[k]
        else:
            return None
    return d


def _dict(x: object) -> dict[str, Any]:
    return x if isinstance(x, dict) else {}


def _v(x: object) -> str:
    return "-" if x is None or x == "" else str(x)


def _secs(x: object, digits: int = 1) -> str:
    """``12.3s``; ``-`` for None or anything not a number."""
    if isinstance(x, bool) or not isinstance(x, int | float):
        return "-"
    return f"{x:.{digits}f}s"


def _span(gpus: object) -> str:
    """``[0, 1, 2, 3, 8]`` -> ``0-3,8``; ``-`` for none; anything that is not GPU ids as it is."""
    if not isinstance(gpus, list | tuple) or not gpus:
        return "-"
    if not all(isinstance(g, int) for g in gpus):
        return ",".join(map(str, gpus))
    return format_gpus(gpus)


def _clock(t: object) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t)) if isinstance(t, int | float) else "-"


def _ratio(s: dict[str, Any]) -> str:
    mode = s.get("mode")
    if mode == "colocated":
        return f"{_v(s.get('N_C'))}C"
    if mode == "disaggregated":
        return f"{_v(s.get('N_P'))}P:{_v(s.get('N_D'))}D"
    return "-"


def _workers(s: dict[str, Any]) -> list[dict[str, Any]]:
    ws = s.get("workers")
    return [w for w in ws if isinstance(w, dict)] if isinstance(ws, list) else []


def _routable(w: dict[str, Any]) -> bool:
    return w.get("activity") == "active" and w.get("role") in ROLES[:3]


def _target_n(target: object) -> int | None:
    """Workers of a target as status writes it: ``4C`` -> 4, ``3P7D`` -> 10."""
    if not isinstance(target, str):
        return None
    m = re.fullmatch(r"(\d+)C|(\d+)P(\d+)D", target)
    if m is None:
        return None
    return sum(int(g) for g in m.groups() if g is not None)


def colocated_makespan(s: dict[str, Any]) -> float | None:
    """Colocation's predicted makespan (eq. 1, from the status's ``profile``) on as many workers
    as the decision's target."""
    n = _target_n(_get(s, "decision", "target"))
    if n is None:
        n = sum(_routable(w) for w in _workers(s))
    profile = s.get("profile")
    if not n or not isinstance(profile, dict):
        return None
    try:
        from pearl.core.makespan import T_coloc
        from pearl.core.profile import WorkloadProfile
        from pearl.core.schema import from_plain

        return float(T_coloc(from_plain(WorkloadProfile, profile), n))
    except Exception:  # a profile of another version: not worth a crash
        return None


def measured_makespan(s: dict[str, Any]) -> float | None:
    """The last batch's measured makespan (None before the first, or from an older pearld)."""
    v = s.get("measured_makespan_s")
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _header(s: dict[str, Any], now: float, width: int) -> str:
    left = (
        f"pearld {_v(s.get('endpoint'))}  seq {_v(s.get('seq'))}  "
        f"training {_v(s.get('phase'))} (step {_v(s.get('training_step'))})  "
        f"weights v{_v(s.get('weights_version'))}"
    )
    right = _clock(now)
    return f"{left}{' ' * max(2, width - len(left) - len(right))}{right}"


def _mode(s: dict[str, Any]) -> list[str]:
    b = _dict(s.get("budget"))
    lent = b.get("lent")
    lent_s = "-" if lent is None else ("lent" if lent else "kept")
    ws = _workers(s)
    rollout = sum(w.get("role") in ROLES[:3] for w in ws)
    lines = [
        f"mode {_v(s.get('mode'))} {_ratio(s)}  routable {sum(_routable(w) for w in ws)}/{rollout}"
        f"  budget {_v(b.get('dedicated_gpus'))} dedicated + {_v(b.get('training_gpus'))} "
        f"training GPUs ({lent_s})  tp {_v(s.get('tp'))}"
    ]
    gpus = s.get("gpus")
    if isinstance(gpus, dict):
        lines.append(
            "gpus "
            + "  ".join(
                f"{k} {_span(gpus.get(k))}"
                for k in ("training", "reserved", "present", "reclaiming")
                if k in gpus
            )
        )
    return lines


def _decision(s: dict[str, Any]) -> list[str]:
    d = s.get("decision")
    if not isinstance(d, dict):
        return ["decision -"]
    pred = d.get("predicted_makespan_s")
    coloc = colocated_makespan(s)
    measured = measured_makespan(s)
    err = "-"
    if isinstance(pred, int | float) and measured:
        err = f"{(pred - measured) / measured * 100:+.1f}%"
    return [
        f"decision {_v(d.get('target'))}: predicted {_secs(pred)} vs colocated {_secs(coloc)}"
        f"  last measured {_secs(measured)} (error {err})",
        f"  why: {_v(d.get('reason'))}",
    ]


def _gate(s: dict[str, Any]) -> list[str]:
    g = s.get("gate")
    if not isinstance(g, dict):
        return ["gate -"]
    enabled = g.get("enabled")
    verdict = "-" if enabled is None else ("approved" if enabled else "declined")
    return [
        f"gate {verdict}: benefit {_secs(g.get('benefit_s'))} vs T_toggle "
        f"{_secs(g.get('T_toggle'), 2)}  T_ded {_secs(g.get('T_ded'))}  T_full "
        f"{_secs(g.get('T_full'))}  T_window {_secs(g.get('T_window'))}  left "
        f"{_secs(g.get('window_left_s'))}",
        f"  why: {_v(g.get('reason'))}",
    ]


def _cycle(name: str, c: object) -> str:
    if not isinstance(c, dict):
        return f"borrow {name}: -"
    out = (
        f"borrow {name}: step {_v(c.get('step'))} {_v(c.get('gate'))}  window "
        f"{_secs(c.get('window_s'))}  lent {_v(c.get('lent'))} activated {_v(c.get('activated'))}"
        f" ({_secs(c.get('activation_s'), 2)})  served {_secs(c.get('served_s'))}  return "
        f"{_secs(c.get('return_s'), 2)}"
    )
    if c.get("returning"):
        out += f"  returning {c['returning']}"
    if c.get("aborted"):
        out += f"  aborted: {c['aborted']}"
    return out


def _plans(s: dict[str, Any]) -> list[str]:
    ts = s.get("transitions")
    if not isinstance(ts, list):
        return ["plan -"]
    if not ts:
        return ["plan: none in flight"]
    out = []
    for t in ts:
        if not isinstance(t, dict):
            continue
        state = f"aborting ({t['aborting']})" if t.get("aborting") else "in flight"
        out.append(
            f"plan {_v(t.get('plan'))} {_v(t.get('cause'))} -> {_v(t.get('target'))}: "
            f"{_v(t.get('done'))}/{_v(t.get('steps'))} steps, {state}"
        )
    return out or ["plan -"]


def _trouble(s: dict[str, Any]) -> list[str]:
    bits = []
    failed = s.get("failed")
    if isinstance(failed, list) and failed:
        bits.append(f"failed workers {', '.join(map(str, failed))}")
    quarantined = s.get("quarantined_gpus")
    if isinstance(quarantined, list) and quarantined:
        bits.append(f"quarantined GPUs {_span(quarantined)}")
    recoveries = s.get("controller_recoveries")
    if isinstance(recoveries, int) and recoveries:
        bits.append(f"controller recoveries {recoveries}")
    return ["!! " + "; ".join(bits)] if bits else []


def _table(s: dict[str, Any], rows: int | None = None) -> list[str]:
    """The workers grouped by role, with counts; at most ``rows`` worker lines (each role then
    shows its first workers and how many more it has)."""
    if "workers" not in s:
        return ["workers -"]
    ws = _workers(s)
    roles = [*ROLES, *sorted({str(w.get("role")) for w in ws} - set(ROLES))]
    groups = {
        r: sorted(
            (w for w in ws if str(w.get("role")) == r), key=lambda w: str(w.get("id")).zfill(9)
        )
        for r in roles
    }
    groups = {r: g for r, g in groups.items() if g}
    cap = max((len(g) for g in groups.values()), default=0)
    while cap > 1 and rows is not None and sum(_shown(len(g), cap) for g in groups.values()) > rows:
        cap -= 1
    counts = "  ".join(f"{r} {len(g)}" for r, g in groups.items())
    lines = [f"workers {len(ws)}: {counts or 'none'}"]
    lines.append(
        f"  {'role':<16}{'id':>5}  {'activity':<14}{'zone':<11}{'gpus':<16}{'incarnation':>11}"
    )
    for r, group in groups.items():
        for i, w in enumerate(group[:cap]):
            role = f"{r} ({len(group)})" if i == 0 else ""
            lines.append(
                f"  {role:<16}{_v(w.get('id')):>5}  {_v(w.get('activity')):<14}"
                f"{_v(w.get('zone')):<11}{_span(w.get('gpus')):<16}{_v(w.get('incarnation')):>11}"
            )
        if len(group) > cap:
            lines.append(f"  {'':<16}  ... {len(group) - cap} more {r} workers")
    return lines


def _shown(n: int, cap: int) -> int:
    """Lines a role of ``n`` workers takes when it lists at most ``cap`` of them."""
    return n if n <= cap else cap + 1


def _events(events: list[Event], note: str) -> list[str]:
    lines = [f"last changes ({min(len(events), EVENTS_SHOWN)})"]
    if note:
        lines.append(f"  {note}")
    for e in events[-EVENTS_SHOWN:]:
        seq = e.get("seq")
        lines.append(
            f"  {_clock(e.get('time'))}  {'seq ' + str(seq) if seq is not None else '':<10}"
            f"{_v(e.get('text'))}"
        )
    if not events and not note:
        lines.append("  (none since top started)")
    return lines


def _clip(line: str, width: int) -> str:
    return line if len(line) <= width else line[: max(width - 3, 1)] + "..."


def render(
    status: dict[str, Any],
    events: list[Event],
    now: float,
    width: int = WIDTH,
    *,
    note: str = "",
    down_since: float | None = None,
    height: int | None = None,
) -> str:
    """One frame of ``pearl top``: ``status`` as ``pearl status --json`` has it, the newest
    ``events`` last, ``now`` for the clock. ``note`` is one line on the change stream (why there
    are no events); ``down_since``: when pearld stopped answering (the status is the last one).
    Missing keys show as ``-``; every line fits ``width``; with ``height``, the worker table
    shrinks (first workers of each role, and how many more) so that the frame fits it."""
    s = status if isinstance(status, dict) else {}
    lines = [_header(s, now, width)]
    if down_since is not None:
        lines.append(
            f"!! pearld not answering since {_clock(down_since)} (still trying); "
            "the rest is as of then"
        )
    lines += [*_mode(s), *_decision(s), *_gate(s)]
    borrow = _dict(s.get("borrow"))
    lines += [_cycle("now ", borrow.get("current")), _cycle("last", borrow.get("last"))]
    lines += _plans(s)
    lines += _trouble(s)
    table, rest = _table(s), ["", *_events(events, note)]
    if height is not None and len(lines) + 1 + len(table) + len(rest) > height:
        table = _table(s, rows=height - len(lines) - 1 - len(rest) - 2)
    lines += ["", *table, *rest]
    return "\n".join(_clip(line, width) for line in lines)


# -- changes: what differs between two consecutive views ------------------------------------------


def _by_id(s: dict[str, Any]) -> dict[Any, dict[str, Any]]:
    return {w.get("id"): w for w in _workers(s)}


def _ids(ws: Iterable[Any]) -> str:
    return ",".join(str(i) for i in sorted(ws, key=str))


def describe(prev: dict[str, Any] | None, cur: dict[str, Any]) -> list[str]:
    """What changed from view ``prev`` to view ``cur``, one short phrase each (none for the
    first view)."""
    if not isinstance(prev, dict) or not isinstance(cur, dict):
        return []
    out: list[str] = []

    def gpu_set(s: dict[str, Any], pool: str) -> set[Any]:
        g = _get(s, "gpus", pool)
        return set(g) if isinstance(g, list) else set()

    for pool, came, went in (
        ("present", "gpus added", "gpus gone"),
        ("reclaiming", "reclaiming", ""),
    ):
        before, after = gpu_set(prev, pool), gpu_set(cur, pool)
        if after - before and came:
            out.append(f"{came} {_span(sorted(after - before))}")
        if before - after and went:
            out.append(f"{went} {_span(sorted(before - after))}")

    def changed(*keys: str) -> bool:
        return any(prev.get(k) != cur.get(k) for k in keys)

    if changed("phase", "training_step"):
        out.append(f"training {_v(cur.get('phase'))} (step {_v(cur.get('training_step'))})")
    if changed("weights_version"):
        out.append(f"weights v{_v(cur.get('weights_version'))}")
    if changed("training_may_proceed"):
        out.append(f"training may proceed (step {_v(cur.get('training_may_proceed'))})")
    out += _plan_changes(prev, cur)
    if changed("mode") or _ratio(prev) != _ratio(cur):
        out.append(
            f"serving {_v(prev.get('mode'))} {_ratio(prev)} -> {_v(cur.get('mode'))} {_ratio(cur)}"
        )
    out += _worker_changes(prev, cur)
    for key, what in (("failed", "workers failed"), ("quarantined_gpus", "GPUs quarantined")):
        a, b = prev.get(key), cur.get(key)
        new = set(b) - set(a) if isinstance(a, list) and isinstance(b, list) else set()
        if new:
            out.append(f"{what} {_ids(new) if key == 'failed' else _span(sorted(new))}")
    d0, d1 = prev.get("decision"), cur.get("decision")
    if isinstance(d1, dict) and d1 != d0:
        out.append(f"decision {_v(d1.get('target'))}: {_v(d1.get('reason'))}")
    g0, g1 = prev.get("gate"), cur.get("gate")
    if isinstance(g1, dict) and g1 != g0:
        verdict = "approved" if g1.get("enabled") else "declined"
        out.append(f"gate {verdict}: {_v(g1.get('reason'))}")
    c0, c1 = _get(prev, "borrow", "last"), _get(cur, "borrow", "last")
    if isinstance(c1, dict) and c1 != c0:
        out.append(
            f"borrow cycle of step {_v(c1.get('step'))} closed: lent {_v(c1.get('lent'))}, "
            f"served {_secs(c1.get('served_s'))}, returned in {_secs(c1.get('return_s'), 2)}"
        )
    return out


def _plan_changes(prev: dict[str, Any], cur: dict[str, Any]) -> list[str]:
    def plans(s: dict[str, Any]) -> dict[Any, dict[str, Any]]:
        ts = s.get("transitions")
        return {t.get("plan"): t for t in ts if isinstance(t, dict)} if isinstance(ts, list) else {}

    a, b = plans(prev), plans(cur)
    out = []
    for pid, t in b.items():
        if pid not in a:
            out.append(
                f"plan {_v(pid)} {_v(t.get('cause'))} -> {_v(t.get('target'))} begun "
                f"({_v(t.get('done'))}/{_v(t.get('steps'))} steps)"
            )
        elif t.get("done") != a[pid].get("done"):
            out.append(f"plan {_v(pid)} step {_v(t.get('done'))}/{_v(t.get('steps'))}")
        if t.get("aborting") and not (a.get(pid) or {}).get("aborting"):
            out.append(f"plan {_v(pid)} aborting: {t['aborting']}")
    for pid, t in a.items():
        if pid not in b:
            how = "aborted" if t.get("aborting") else "finished"
            out.append(f"plan {_v(pid)} {_v(t.get('cause'))} -> {_v(t.get('target'))} {how}")
    return out


def _worker_changes(prev: dict[str, Any], cur: dict[str, Any]) -> list[str]:
    a, b = _by_id(prev), _by_id(cur)
    out = []
    added = [i for i in b if i not in a]
    if added:
        out.append(
            "added "
            + ", ".join(
                f"worker {_v(i)} {_v(b[i].get('role'))} on {_span(b[i].get('gpus'))}"
                for i in sorted(added, key=str)
            )
        )
    gone = [i for i in a if i not in b]
    if gone:
        out.append(f"removed workers {_ids(gone)}")
    roles: dict[str, list[Any]] = {}
    acts: dict[str, list[Any]] = {}
    for i in b.keys() & a.keys():
        if b[i].get("role") != a[i].get("role"):
            roles.setdefault(f"{_v(a[i].get('role'))} -> {_v(b[i].get('role'))}", []).append(i)
        if b[i].get("activity") != a[i].get("activity"):
            acts.setdefault(_v(b[i].get("activity")), []).append(i)
    out += [f"workers {_ids(ids)} {change}" for change, ids in sorted(roles.items())]
    out += [f"workers {_ids(ids)} now {act}" for act, ids in sorted(acts.items())]
    return out


class Changes:
    """The change stream, as events: subscribed to once, drained without blocking per frame;
    one event per change (its log seq, and :func:`describe`'s phrases, the cause first).

    If subscribing fails, :attr:`note` says so (``top`` then shows status only)."""

    def __init__(self, keep: int = EVENTS_SHOWN) -> None:
        self.events: deque[Event] = deque(maxlen=keep)
        self.note = ""
        self.sub: Subscriber | None = None
        self._view: dict[str, Any] | None = None
        self._failing = False
        self._silent = False

    def add(self, text: str, seq: int | None = None, now: float | None = None) -> None:
        self.events.append({"time": time.time() if now is None else now, "seq": seq, "text": text})

    def _snapshot(self, seq: int, payload: dict[str, Any]) -> None:
        log_seq = payload.get("seq") if isinstance(payload.get("seq"), int) else None
        texts = describe(self._view, payload)  # a re-snapshot after a gap: what changed
        if texts:
            self.add("; ".join(texts), log_seq)
        self._view = payload

    def _change(self, seq: int, payload: dict[str, Any]) -> None:
        log_seq = payload.get("seq") if isinstance(payload.get("seq"), int) else None
        self.add("; ".join(describe(self._view, payload)) or "state changed", log_seq)
        self._view = payload

    def subscribe(self, c: Client, status: dict[str, Any], endpoint: str, keys_dir: str) -> None:
        from transports.pubsub import Subscriber

        pub = status.get("pub_endpoint")
        if not isinstance(pub, str) or not pub:
            self.note = "change stream: this pearld announces none; showing status only"
            return
        pub = _reachable(pub, endpoint)
        try:
            self.sub = Subscriber(
                pub,
                c,
                keys=c.keys,
                on_snapshot=self._snapshot,
                on_change=self._change,
                on_gap=lambda g: self.add(f"missed changes ({g})"),
            )
            self.sub.sync()
            if not self.sub.alive():
                import zmq

                from transports.diagnose import diagnose

                why = diagnose(pub, c.keys, keys_dir, kind=zmq.SUB)
                self.note = f"change stream silent ({why}); showing status only"
                self._silent = True
        except Exception as e:  # noqa: BLE001 - any failure: status only, said in one line
            self.note = f"change stream unavailable ({e}); showing status only"
            self.close()

    def drain(self) -> None:
        if self.sub is None:
            return
        try:
            self.sub.pump(0)
            if self._failing or (self._silent and self.sub.alive()):
                self._failing = self._silent = False
                self.note = ""
        except PearlError as e:  # a re-snapshot found pearld away: try again next frame
            self._failing = True
            self.note = f"change stream: {e}"

    def close(self) -> None:
        if self.sub is not None:
            self.sub.close()
            self.sub = None


# -- the command ----------------------------------------------------------------------------------


def _poll(c: Client, timeout_s: float) -> dict[str, Any]:
    from transports.protocol import StatusRequest

    payload = c.request(StatusRequest(), timeout_s, retries=0).payload
    if payload is None:
        raise PearlError("pearld is starting")
    return status_plain(payload)


def cmd_top(args: argparse.Namespace) -> int:
    tty = not args.once and sys.stdout.isatty()
    changes, hidden = Changes(), False
    try:
        with client(args) as c:
            # Unreachable: one line on stderr, exit 1 (like status).
            status = status_plain(fetch_status(c))
            if args.once:
                changes.note = "changes are followed without --once (or: pearl watch)"
            else:
                changes.subscribe(
                    c=c, status=status, endpoint=args.endpoint, keys_dir=args.keys_dir
                )
            if tty:
                sys.stdout.write(HIDE + CLEAR)
                hidden = True
            _loop(args=args, c=c, status=status, changes=changes, tty=tty)
    except KeyboardInterrupt:
        pass  # Ctrl-C is how top ends
    finally:
        changes.close()
        if hidden:  # the cursor back, below the last frame
            sys.stdout.write(SHOW + "\n")
            sys.stdout.flush()
    return 0


def _loop(
    args: argparse.Namespace, c: Client, status: dict[str, Any], changes: Changes, tty: bool
) -> None:
    """Frames until ``--count`` (or ``--once``): poll the status, drain the changes, redraw."""
    interval = max(args.interval, 0.05)
    frames = 1 if args.once else max(args.count, 0)
    shown, down_since = 0, None
    while True:
        now = time.time()
        if shown:
            try:
                status, down_since = _poll(c, min(args.timeout, max(interval, 0.5))), None
            except PearlError:
                down_since = down_since or now  # keep the last status, and keep trying
        changes.drain()
        size = shutil.get_terminal_size((WIDTH, 40))
        frame = render(
            status=status,
            events=list(changes.events),
            now=now,
            width=size.columns if tty else WIDTH,
            note=changes.note,
            down_since=down_since,
            height=size.lines - 1 if tty else None,  # no scrolling: the frame fits
        )
        _show(sys.stdout, frame, tty, first=not shown)
        shown += 1
        if frames and shown >= frames:
            return
        _sleep_until(now + interval, changes.drain)


def _show(out: TextIO, frame: str, tty: bool, first: bool) -> None:
    if tty:  # home, each line over the old one, then erase what the old frame had below
        out.write(HOME + "".join(f"{line}{EOL}\n" for line in frame.split("\n")) + BELOW)
    else:
        out.write(("" if first else "\n") + frame + "\n")
    out.flush()


def _sleep_until(deadline: float, tick: Callable[[], None]) -> None:
    while (left := deadline - time.time()) > 0:
        time.sleep(min(left, 0.25))
        tick()  # keep the SUB socket's queue short between frames


__all__ = ["Changes", "cmd_top", "colocated_makespan", "describe", "register", "render"]
