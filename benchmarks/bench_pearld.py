"""pearld: status round trip vs a bare ZeroMQ echo, event-to-plan latency, recovery time.

1. Round trip of a ``status`` request through a real pearld process vs a bare ROUTER/DEALER echo
   process on the same kind of endpoint, measured from this process in the same run.
   Target: pearld <= 3x bare echo (median).
2. Event to plan: from a ``gpus-added`` event to its plan being logged (decision + plan + durable
   append) with the real controller and file log, at 32 and 1,024 workers. Target: <= 10 ms at 32.
3. Recovery after SIGKILL: a pearld killed with a 10,000- and a 100,000-record log (no snapshot:
   the worst case) is restarted; time until it answers ``status``. Target: <= 2 s at 100,000.

    .venv/bin/python benchmarks/bench_pearld.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import zmq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pearl import config  # noqa: E402
from pearl.core import commands as cmd  # noqa: E402
from pearl.core import events as ev  # noqa: E402
from pearl.core.controller import Controller  # noqa: E402
from pearl.core.fold import replay  # noqa: E402
from pearl.core.profile import prior_profile  # noqa: E402
from pearl.daemon import init_records, policy_of  # noqa: E402
from pearl.log import FileLog  # noqa: E402
from transports.protocol import StatusRequest  # noqa: E402
from transports.rpc import Client  # noqa: E402

ECHO = """
import sys, zmq
ctx = zmq.Context(); s = ctx.socket(zmq.ROUTER); s.linger = 0; s.bind(sys.argv[1])
print("ready", flush=True)
while True:
    s.send_multipart(s.recv_multipart())
"""
STEP_OPS = cmd.STEP_COMMANDS


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def small_sets(workers: int, preemptible: int = 4) -> list[str]:
    """A cluster of ``workers`` reserved TP2 workers plus a few preemptible GPUs, no training."""
    n = 2 * workers
    return [
        "cluster.training_gpus=",
        f"cluster.reserved_gpus=0-{n - 1}",
        f"cluster.preemptible_gpus={n}-{n + preemptible - 1}",
        "daemon.borrow=never",
        "engine.sim.time_scale=0.0005",
        "daemon.heartbeat_s=0.5",
        "daemon.reconcile_grace_s=600",
    ]


def pearld(state: Path, endpoint: str, sets: list[str]) -> subprocess.Popen[bytes]:
    args = [
        sys.executable,
        "-m",
        "pearl.daemon",
        "--config",
        str(ROOT / "configs/sim-32.toml"),
        "--state-dir",
        str(state),
        "--endpoint",
        endpoint,
    ]
    for s in sets:
        args += ["--set", s]
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)


def wait_status(endpoint: str, timeout: float = 60.0) -> float:
    t0 = time.perf_counter()
    with Client(endpoint, timeout_s=0.2, retries=0) as c:
        while time.perf_counter() - t0 < timeout:
            try:
                if c.request(StatusRequest()).payload:
                    return time.perf_counter() - t0
            except Exception:
                time.sleep(0.01)
    raise RuntimeError(f"pearld at {endpoint} did not answer in {timeout}s")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(5)


def bench_round_trip(tmp: Path, n: int) -> None:
    print("== status round trip: pearld vs bare ROUTER/DEALER echo (separate processes, TCP)")
    echo_addr = f"tcp://127.0.0.1:{free_port()}"
    echo = subprocess.Popen([sys.executable, "-c", ECHO, echo_addr], stdout=subprocess.PIPE)
    assert echo.stdout is not None and echo.stdout.readline().strip() == b"ready"
    p_addr = f"tcp://127.0.0.1:{free_port()}"
    proc = pearld(tmp / "rt", p_addr, small_sets(2))
    try:
        wait_status(p_addr)
        time.sleep(1.0)  # let its workers come up
        ctx = zmq.Context.instance()
        dealer = ctx.socket(zmq.DEALER)
        dealer.linger = 0
        dealer.connect(echo_addr)
        client = Client(p_addr, timeout_s=2.0)
        payload = b"x" * 64
        bare: list[float] = []
        rpc: list[float] = []
        for _block in range(n // 250):  # alternate blocks: machine noise hits both alike
            for _ in range(250):
                t0 = time.perf_counter()
                dealer.send(payload)
                dealer.recv()
                bare.append(time.perf_counter() - t0)
            for _ in range(250):
                t0 = time.perf_counter()
                client.request(StatusRequest())
                rpc.append(time.perf_counter() - t0)
        dealer.close()
        client.close()
    finally:
        stop(proc)
        echo.kill()
        echo.wait()
    mb, mr = statistics.median(bare), statistics.median(rpc)
    q = lambda xs: statistics.quantiles(xs, n=100)[98]  # noqa: E731
    print(f"  bare echo   median {mb * 1e6:7.1f} us   p99 {q(bare) * 1e6:7.1f} us")
    print(
        f"  pearld      median {mr * 1e6:7.1f} us   p99 {q(rpc) * 1e6:7.1f} us   "
        f"ratio {mr / mb:.2f}x (target <= 3x)"
    )


class Driver:
    """The real controller and a file log, with every step answered at once."""

    def __init__(self, cfg: config.Config, log_dir: Path) -> None:
        self.ctl = Controller(policy_of(cfg))
        self.log = FileLog(log_dir)
        self.log.append(init_records(cfg))
        self.now = 0.0
        out = self.ctl.recover(replay(r for _, r in self.log.read()), prior_profile(cfg), 0.0)
        self.s = out.state
        self.pending: list[Any] = []
        self._take(out)
        self.settle()

    def _take(self, out: Any) -> None:
        if out.records:
            self.log.append(out.records)
        self.s = out.state
        self.pending += [c for c in out.commands if isinstance(c, STEP_OPS)]

    def send(self, event: Any) -> Any:
        self.now += 0.01
        out = self.ctl.handle(self.s, event, self.now)
        self._take(out)
        return out

    def settle(self) -> None:
        while self.pending:
            c = self.pending.pop(0)
            self.send(cmd.StepResult(plan=c.plan, step=c.step, cancel=getattr(c, "cancel", False)))


def bench_event_to_plan(tmp: Path, sizes: list[int], repeat: int) -> None:
    print("== gpus-added -> plan logged (decide + plan + durable append): controller + FileLog")
    for workers in sizes:
        cfg = config.load(ROOT / "configs/sim-32.toml", small_sets(workers - 2))
        d = Driver(cfg, tmp / f"e2p-{workers}")
        n = 2 * (workers - 2)
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            out = d.send(ev.GpusAdded(gpus=(n, n + 1, n + 2, n + 3)))
            times.append(time.perf_counter() - t0)
            assert any(isinstance(r, ev.PlanBegin) for r in out.records)
            d.settle()
            d.send(ev.GpusReclaimed(gpus=(n, n + 1, n + 2, n + 3)))
            d.settle()
        d.log.close()
        print(
            f"  {workers:>5} workers: median {statistics.median(times) * 1e3:7.2f} ms, "
            f"max {max(times) * 1e3:7.2f} ms over {repeat} events"
        )


def build_log(cfg: config.Config, state: Path, records: int) -> int:
    d = Driver(cfg, state / "log")
    n = 2 * 2
    while d.log.last_seq < records:
        d.send(ev.GpusAdded(gpus=(n, n + 1)))
        d.settle()
        d.send(ev.GpusReclaimed(gpus=(n, n + 1)))
        d.settle()
    last = d.log.last_seq
    d.log.close()
    return last


def bench_recovery(tmp: Path, sizes: list[int]) -> None:
    print("== recovery after SIGKILL: restart until status answers (log without snapshots)")
    sets = small_sets(2)
    cfg = config.load(ROOT / "configs/sim-32.toml", sets)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import pearl.daemon, actors.api"], check=True, cwd=ROOT)
    startup = time.perf_counter() - t0
    print(f"  python + imports alone: {startup:.2f} s (part of every figure below)")
    for records in sizes:
        state = tmp / f"rec-{records}"
        last = build_log(cfg, state, records)
        endpoint = f"ipc://{tmp}/rec-{records}.sock"
        proc = pearld(state, endpoint, sets)
        wait_status(endpoint)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        for snap in (state / "log").glob("snap-*"):
            snap.unlink()  # worst case: replay the whole log
        t0 = time.perf_counter()
        proc = pearld(state, endpoint, sets)
        took = wait_status(endpoint)
        stop(proc)
        print(f"  {last:>7,} records: status answered {took:.2f} s after restart (target <= 2 s)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer samples")
    ap.add_argument(
        "--small", action="store_true", help="a few samples of each, small logs (a smoke run)"
    )
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_pearld-") as d:
        tmp = Path(d)
        if args.small:
            bench_round_trip(tmp, 500)
            bench_event_to_plan(tmp, [32], 2)
            bench_recovery(tmp, [1_000])
            return 0
        bench_round_trip(tmp, 2000 if args.quick else 10000)
        bench_event_to_plan(tmp, [32, 1024], 5 if args.quick else 20)
        bench_recovery(tmp, [10_000, 100_000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
