"""Replay a real preemptible-GPU trace against a live pearld, with training steps in between.

Starts pearld on ``configs/sim-32.toml`` (the paper's 32-GPU cluster on sim engines), replays a
Bamboo segment (S2 by default) compressed in time through the same ZeroMQ API the ``pearl`` CLI
uses, and runs a training step every few trace minutes: Training Begin is acknowledged, pearld
returns every borrowed GPU, and only then does the "trainer" proceed. Prints one line per change
and a summary.

    python examples/elastic_trace.py [--segment S2] [--seconds 60] [--train-every-min 10]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pearl.core import events as ev  # noqa: E402
from pearl.core.status import ClusterStatus  # noqa: E402
from pearl.sim import availability  # noqa: E402
from transports.protocol import Event, StatusRequest  # noqa: E402
from transports.rpc import Client, RemoteError, RequestTimeout  # noqa: E402

PREEMPTIBLE = list(range(20, 32))  # configs/sim-32.toml


def deliver(client: Client, record: Any, patience_s: float = 60.0) -> int:
    """Send a fact until pearld logs it: a trace's events happened, so one that pearld could
    not take yet (no answer, its disk refusing writes) is sent again, never dropped. Bad input
    (an event the table cannot fit) is raised."""
    deadline = time.monotonic() + patience_s
    while True:
        try:
            return int(client.request(Event.of(record)).seq)
        except RemoteError as e:
            if "LogWriteFailed" not in str(e) or time.monotonic() > deadline:
                raise
        except RequestTimeout:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.1)


def line(s: ClusterStatus, what: str) -> str:
    ratio = f"{s.N_C}C" if s.mode == "colocated" else f"{s.N_P}P{s.N_D}D"
    routable = sum(w.activity == "active" and w.role != "training" for w in s.workers)
    plans = (
        " ".join(f"plan {t.plan} {t.cause} {t.done}/{t.steps}" for t in s.transitions) or "steady"
    )
    return (
        f"seq {s.seq:>5}  {what:<28} {s.mode:<13} {ratio:<6} workers {routable:>2}  "
        f"training {s.phase:<8} {plans}"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--segment", default="S2", help="S1, S2 or S3 (SEGMENTS.md)")
    ap.add_argument("--seconds", type=float, default=60.0, help="wall time for the 2-hour segment")
    ap.add_argument("--train-every-min", type=float, default=10.0, help="trace minutes per step")
    ap.add_argument("--train-s", type=float, default=1.0, help="wall seconds a training step takes")
    args = ap.parse_args()

    trace = availability.load(segment_name=args.segment)
    scale = args.seconds / trace.duration_s
    tmp = Path(tempfile.mkdtemp(prefix="pearl-trace-"))
    endpoint = f"ipc://{tmp}/pearld.sock"
    print(
        f"pearld on configs/sim-32.toml, state in {tmp}; segment {args.segment} "
        f"({trace.duration_s / 60:.0f} trace minutes in {args.seconds:.0f} s)"
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pearl.daemon",
            "--config",
            str(ROOT / "configs/sim-32.toml"),
            "--state-dir",
            str(tmp / "state"),
            "--endpoint",
            endpoint,
            "--set",
            "engine.sim.time_scale=0.01",
        ],
        stdout=subprocess.DEVNULL,
        stderr=open(tmp / "pearld.log", "wb"),  # noqa: SIM115 (the child owns it)
        cwd=ROOT,
    )
    client = Client(endpoint, timeout_s=5.0)
    returns: list[float] = []
    events = 0
    try:
        for _ in range(100):
            try:
                if client.request(StatusRequest(), 0.5).payload:
                    break
            except Exception:
                time.sleep(0.1)
        present: list[int] = []
        step, version = 0, 0
        schedule = [(0.0, trace.at(0.0))] + trace.changes()
        next_train = args.train_every_min * 60.0
        t0 = time.monotonic()
        for t_trace, gpus in schedule + [(trace.duration_s, -1)]:
            while next_train <= t_trace:  # training steps that fall before this change
                time.sleep(max(0.0, t0 + next_train * scale - time.monotonic()))
                step += 1
                deliver(client, ev.TrainingBegin(step=step))
                began = time.monotonic()
                while client.request(StatusRequest()).payload.training_may_proceed < step:
                    time.sleep(0.01)
                returns.append(time.monotonic() - began)
                print(
                    line(client.request(StatusRequest()).payload, f"training step {step} runs"),
                    flush=True,
                )
                time.sleep(args.train_s)
                version += 1
                deliver(client, ev.TrainingFinished(step=step, weights_version=version))
                next_train += args.train_every_min * 60.0
            if gpus < 0:
                break
            time.sleep(max(0.0, t0 + t_trace * scale - time.monotonic()))
            want = gpus - gpus % 2
            if want > len(present):
                add = [g for g in PREEMPTIBLE if g not in present][: want - len(present)]
                deliver(client, ev.GpusAdded(gpus=tuple(add)))
                present += add
                what = f"+{len(add)} GPUs ({want} preemptible)"
            elif want < len(present):
                gone, present = present[want:], present[:want]
                deliver(client, ev.GpusReclaimed(gpus=tuple(gone)))
                what = f"-{len(gone)} GPUs ({want} preemptible)"
            else:
                continue
            events += 1
            print(line(client.request(StatusRequest()).payload, what), flush=True)
        time.sleep(2.0)
        s = client.request(StatusRequest()).payload
        print(line(s, "end of segment"))
        print(
            f"\n{events} GPU changes and {step} training steps replayed; borrowed GPUs were back "
            f"{1e3 * sum(returns) / max(len(returns), 1):.0f} ms (mean) after Training Begin "
            f"(max {1e3 * max(returns, default=0):.0f} ms, sim engines at 1/100 of real time)."
        )
        print(f"inspect: pearl log show {tmp / 'state'} | pearl log replay {tmp / 'state'}")
    finally:
        client.close()
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
