"""``pearl event ...``, ``pearl status`` and ``pearl watch``: talking to a running pearld.

The daemon is found by ``--endpoint``, else ``PEARL_ENDPOINT``, else the default endpoint; CURVE
keys (for a pearld started with ``daemon.keys_dir=DIR``) come from ``--keys-dir DIR`` or
``PEARL_KEYS``: ``DIR/client.key_secret`` and ``DIR/server.key``. When pearld does not answer, the
error says whether authentication failed or nothing listens there. Each event is acknowledged
only once its record is durable, and the reply names its sequence number; ``training-begin``
then waits until training may proceed (borrowed workers back) and says how long that took.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import TYPE_CHECKING, Any

from pearl.cli.args import Subparsers, integer
from pearl.config import DEFAULT_ENDPOINT, format_gpus, parse_gpus
from pearl.core import events as ev
from pearl.core.errors import PearlError
from pearl.core.status import ClusterStatus, status_plain

if TYPE_CHECKING:
    from transports.diagnose import DiagnosingClient
    from transports.rpc import Client

EVENTS = tuple(c.KIND for c in ev.ELASTIC_EVENTS)  # the subcommands of `pearl event`
RETURN_WAIT_S = 60.0  # training-begin: how long to wait for borrowed workers, by default
REQUEST_S = 1.5  # a request's whole wait, retries included: pearld answers in milliseconds


def connection_options(p: argparse.ArgumentParser, top: bool = False) -> None:
    """``--endpoint`` and ``--keys-dir``, before the command (``top``) or after it; a value
    given after the command wins, so the subcommand's options default to nothing."""
    endpoint = os.environ.get("PEARL_ENDPOINT", DEFAULT_ENDPOINT) if top else argparse.SUPPRESS
    keys = os.environ.get("PEARL_KEYS", "") if top else argparse.SUPPRESS
    p.add_argument(
        "--endpoint",
        default=endpoint,
        help=f"pearld's API (default: $PEARL_ENDPOINT or {DEFAULT_ENDPOINT})",
    )
    p.add_argument(
        "--keys-dir",
        default=keys,
        metavar="DIR",
        help="CURVE keys (client.key_secret, server.key) of a pearld started with "
        "--set daemon.keys_dir=DIR ($PEARL_KEYS)",
    )


def _common(p: argparse.ArgumentParser) -> None:
    connection_options(p)
    p.add_argument(
        "--timeout",
        type=float,
        default=REQUEST_S,
        help="seconds to wait for pearld's answer, retries included (default %(default)s)",
    )


def _training_begin(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--no-wait",
        action="store_true",
        help="return on the event's acknowledgement, while borrowed workers may "
        "still be coming back",
    )
    p.add_argument(
        "--return-timeout",
        type=float,
        default=RETURN_WAIT_S,
        metavar="S",
        help="seconds to wait until training may proceed (default %(default)s)",
    )


def register(subparsers: Subparsers) -> None:
    e = subparsers.add_parser("event", help="send an elastic event to pearld")
    kinds = e.add_subparsers(dest="event", metavar="EVENT", required=True)
    for kind in EVENTS:
        k = kinds.add_parser(kind, help=f"{kind} event")
        _common(k)
        if kind.startswith("gpus"):
            k.add_argument("--gpus", required=True, help="GPU ids, e.g. 4,5,6,7 or 20-23")
            if kind == "gpus-reclaiming":
                k.add_argument(
                    "--deadline",
                    required=True,
                    metavar="DURATION",
                    help="when the GPUs are taken, from now: 30s, 2m (at most 1h)",
                )
        else:
            k.add_argument(
                "--step", type=integer, help="training step (default: the next / current)"
            )
        if kind == "training-begin":
            _training_begin(k)
        if kind == "training-finished":
            k.add_argument(
                "--weights-version", type=integer, help="the weights this step published"
            )
        k.set_defaults(handler=cmd_event)
    s = subparsers.add_parser("status", help="the table, mode and ratio, budget, transitions")
    _common(s)
    s.add_argument("--json", action="store_true", help="one JSON object (docs/cli-json.md)")
    s.add_argument(
        "--wait",
        type=float,
        default=0.0,
        metavar="S",
        help="wait up to S seconds for a pearld that is starting (default: answer at once)",
    )
    s.set_defaults(handler=cmd_status)
    w = subparsers.add_parser("watch", help="print every logged change as it happens")
    _common(w)
    w.add_argument("--json", action="store_true", help="one JSON object per change")
    w.add_argument(
        "--count", type=int, default=0, help="stop after N changes (the snapshot is not one)"
    )
    w.set_defaults(handler=cmd_watch)


def client(args: argparse.Namespace) -> DiagnosingClient:
    """A client of pearld whose timeouts say why (authentication failed, or unreachable)."""
    from transports.auth import ClientKeys
    from transports.diagnose import DiagnosingClient

    keys = None
    if args.keys_dir:
        try:
            keys = ClientKeys.load(args.keys_dir)
        except PearlError as e:
            raise PearlError(f"check --keys-dir: {e}") from None
    return DiagnosingClient(
        args.endpoint,
        keys=keys,
        keys_dir=args.keys_dir,
        timeout_s=args.timeout,
        retries=1,
        name="pearl-cli",
    )


def fetch_status(c: Client) -> ClusterStatus:
    from transports.protocol import StatusRequest

    payload = c.request(StatusRequest()).payload
    if payload is None:
        raise PearlError("pearld is starting: its state is not published yet; try again")
    status: ClusterStatus = payload
    return status


def build_event(args: argparse.Namespace, c: Client) -> ev.Elastic:
    if args.event == "gpus-added":
        return ev.GpusAdded(gpus=parse_gpus(args.gpus, "--gpus"))
    if args.event == "gpus-reclaimed":
        return ev.GpusReclaimed(gpus=parse_gpus(args.gpus, "--gpus"))
    if args.event == "gpus-reclaiming":
        from pearl.core.notice import parse_duration

        seconds = parse_duration(args.deadline)
        return ev.GpusReclaiming(
            gpus=parse_gpus(args.gpus, "--gpus"), deadline=time.time() + seconds
        )
    if args.event == "gpus-reclaim-cancelled":
        return ev.GpusReclaimCancelled(gpus=parse_gpus(args.gpus, "--gpus"))
    step = args.step
    if step is None:
        status = fetch_status(c)
        step = status.training_step + (1 if args.event == "training-begin" else 0)
    if args.event == "training-begin":
        return ev.TrainingBegin(step=step)
    return ev.TrainingFinished(step=step, weights_version=args.weights_version)


def cmd_event(args: argparse.Namespace) -> int:
    from transports.protocol import Event

    with client(args) as c:
        record = build_event(args, c)
        t0 = time.monotonic()
        ack = c.request(Event.of(record))
        print(f"ok: {args.event} logged at seq {ack.seq}", flush=True)
        if isinstance(record, ev.TrainingBegin) and not args.no_wait:
            took = await_return(c=c, step=record.step, t0=t0, timeout_s=args.return_timeout)
            print(f"training may proceed: {took}")
    return 0


def await_return(c: Client, step: int, t0: float, timeout_s: float) -> str:
    """Wait for pearld's go-ahead for training ``step`` (sent at ``t0``); what came back, and
    how long it took."""
    from pearl.runtime import TrainingTimeout, wait_training_may_proceed

    first = fetch_status(c)  # read-your-writes: it includes the training-begin
    if first.training_may_proceed >= step:
        return "nothing was lent, no borrowed workers had to come back"
    lent = sum(
        w.zone == "overlap" and w.role != "training" and w.activity != "inactive"
        for w in first.workers
    )
    try:
        took = wait_training_may_proceed(lambda: fetch_status(c), step, timeout_s, since=t0)
    except TrainingTimeout:
        raise TrainingTimeout(
            f"training-begin {step} is logged, but borrowed workers are not back after "
            f"{timeout_s:g}s: do not start training yet; `pearl status --json` shows "
            f"training_may_proceed {step} once they are (a larger --return-timeout waits longer)"
        ) from None
    what = f"{lent} borrowed worker{'s' if lent != 1 else ''}" if lent else "borrowed GPUs"
    return f"{what} back in {took * 1000:.0f} ms"


def cmd_status(args: argparse.Namespace) -> int:
    deadline = time.monotonic() + max(args.wait, 0.0)
    while True:  # --wait: a pearld that is starting (or not listening yet) is asked again
        try:
            with client(args) as c:
                status = status_plain(fetch_status(c))
            break
        except PearlError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.25)
    if args.json:
        print(json.dumps(status, indent=None, sort_keys=False))
    else:
        print(render(status))
    return 0


def render(s: dict[str, Any]) -> str:
    ratio = f"{s['N_C']}C" if s["mode"] == "colocated" else f"{s['N_P']}P{s['N_D']}D"
    b = s.get("budget", {})
    lines = [
        f"pearld {s.get('endpoint', '')}  seq {s['seq']}  mode {s['mode']} {ratio}  "
        f"training {s['phase']} (step {s['training_step']})  weights v{s['weights_version']}",
        f"budget: {b.get('dedicated_gpus', 0)} dedicated GPUs, "
        f"{b.get('training_gpus', 0)} training GPUs {'lent' if b.get('lent') else 'kept'}; "
        f"tp {s['tp']}",
    ]
    stranded = b.get("stranded_gpus")
    if stranded:
        one = len(stranded) == 1
        lines.append(
            f"stranded: GPU{'' if one else 's'} {format_gpus(stranded)} present but unused: "
            f"too few free GPUs for a TP{s['tp']} worker"
        )
    d = s.get("decision")
    if d:
        pred = d.get("predicted_makespan_s")
        predicted = "no prediction" if pred is None else f"predicted {pred:.1f}s"
        line = f"decision: {d['target']} {predicted} ({d['reason']})"
        if d.get("current") is False:
            line = (
                f"decision (for {d['workers']} workers, before the budget changed to "
                f"{b.get('workers')}): {d['target']} {predicted}"
            )
        lines.append(line)
    for t in s.get("transitions", []):
        state = f"aborting ({t['aborting']})" if t.get("aborting") else "in flight"
        lines.append(
            f"plan {t['plan']} {t['cause']} -> {t['target']}: {t['done']}/{t['steps']} "
            f"steps, {state}"
        )
    lines.append(f"{'id':>4} {'gpus':<14} {'role':<10} {'activity':<13} zone")
    for w in s["workers"]:
        gpus = ",".join(map(str, w["gpus"]))
        if len(gpus) > 14:
            gpus = f"{w['gpus'][0]}-{w['gpus'][-1]}"
        lines.append(f"{w['id']:>4} {gpus:<14} {w['role']:<10} {w['activity']:<13} {w['zone']}")
    for wid, why in (s.get("worker_faults") or {}).items():  # why a host died or cannot start
        lines.append(f"worker {wid}: {why}")
    return "\n".join(lines)


def _routable(w: dict[str, Any]) -> bool:
    return bool(w["activity"] == "active" and w["role"] != "training")


def _line(seq: int, s: dict[str, Any]) -> str:
    ratio = f"{s['N_C']}C" if s["mode"] == "colocated" else f"{s['N_P']}P{s['N_D']}D"
    plans = (
        ", ".join(
            f"plan {t['plan']} {t['cause']} {t['done']}/{t['steps']}"
            for t in s.get("transitions", [])
        )
        or "steady"
    )
    return (
        f"{time.strftime('%H:%M:%S')} seq {s['seq']:>6} {s['mode']:<13} {ratio:<7} "
        f"routable {sum(_routable(w) for w in s['workers'])}"
        f"  training {s['phase']}  {plans}"
    )


def cmd_watch(args: argparse.Namespace) -> int:
    from transports.pubsub import Subscriber

    seen = 0
    with client(args) as c:
        status = fetch_status(c)

        def show(seq: int, payload: dict[str, Any]) -> None:
            print(json.dumps(payload) if args.json else _line(seq, payload), flush=True)

        def change(seq: int, payload: dict[str, Any]) -> None:  # --count counts these
            nonlocal seen
            seen += 1
            show(seq, payload)

        pub = _reachable(status.pub_endpoint, args.endpoint)
        sub = Subscriber(
            pub,
            c,
            keys=c.keys,
            on_snapshot=show,
            on_change=change,
            on_gap=lambda g: print(f"# {g}", file=sys.stderr),
        )
        try:
            sub.sync()
            if not sub.alive():  # no heartbeat: changes would never come; say why
                import zmq

                from transports.diagnose import diagnose

                why = diagnose(pub, c.keys, args.keys_dir, kind=zmq.SUB)
                print(
                    f"pearl watch: nothing heard from pearld's change stream: {why}",
                    file=sys.stderr,
                )
            while not args.count or seen < args.count:
                sub.pump(0.5)
        finally:
            sub.close()
    return 0


def _reachable(pub: str, via: str) -> str:
    """pearld announces its change stream as bound; a wildcard host (``tcp://0.0.0.0:P``)
    means "the host the client reached the API at"."""
    if not pub.startswith("tcp://") or not via.startswith("tcp://"):
        return pub
    host, _, port = pub.removeprefix("tcp://").rpartition(":")
    if host not in ("0.0.0.0", "*", "[::]", "::"):
        return pub
    return f"{via.rpartition(':')[0]}:{port}"


__all__ = ["register", "render"]
