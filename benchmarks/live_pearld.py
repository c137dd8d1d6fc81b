"""A live pearld for the storm and chaos runs: a process on a loopback port, its worker hosts,
its structured log, and the checks that compare what it acknowledged with what it logged.

Everything started here is tracked by pid and stopped by pid (``Pearld.cleanup``): pearld
itself, and every worker host whose command line names this run's state directory.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from pearl.core import events as ev  # noqa: E402
from pearl.core.status import status_plain  # noqa: E402
from transports.protocol import Event, StatusRequest  # noqa: E402
from transports.rpc import Client, RemoteError  # noqa: E402

CONFIG = ROOT / "configs" / "sim-32.toml"
PREEMPTIBLE = tuple(range(20, 32))
# Structured lines of pearld (see pearl.daemon.StructuredFormatter) that the runs count.
HOST_DOWN = re.compile(r'msg="worker host (\d+) \(pid (\d+)\) ([^"]*)"')
ACTOR_RESTART = re.compile(r'msg="restarting actor (\w+)')
ACTOR_FAILED = re.compile(r'msg="actor (\w+) failed: ([^"]*)"')
GIVE_UP = re.compile(r'msg="actor (\w+) keeps failing')
VIOLATION = re.compile(r'msg="controller rejected its own output for ([^"]*)"')


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(pred: Callable[[], Any], timeout: float, every: float = 0.01) -> Any:
    """``pred()`` once truthy, else None after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(every)
    return None


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def _stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks) of ``pid``, None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return rest[0], int(rest[19])


def alive(pid: int) -> bool:
    st = _stat(pid)
    return st is not None and st[0] != "Z"


@dataclass
class Host:
    """A worker host process of this run: its pid, the start time that tells it from a reused
    pid, and the worker and incarnation on its command line."""

    pid: int
    start: int
    worker: int
    incarnation: int

    def same(self) -> bool:
        st = _stat(self.pid)
        return st is not None and st[1] == self.start and st[0] != "Z"

    def signal(self, sig: int) -> bool:
        if not self.same():
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, sig)
            return True
        return False


def _forked_ids(pid: int) -> tuple[int, int] | None:
    """(worker, incarnation) of a host forked by pearld's fork server, from its process name
    (pearl-w3.12); None for the server itself."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            m = re.fullmatch(r"pearl-w(\d+)\.(\d+)", f.read().strip())
    except OSError:
        return None
    return (int(m[1]), int(m[2])) if m else None


def _arg(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1] if flag in argv[:-1] else ""


@dataclass
class Pearld:
    """pearld on ``tcp://127.0.0.1:<port>`` (the same port across restarts, so that surviving
    worker hosts find the new one) with one log file per start."""

    tmp: Path
    sets: list[str] = field(default_factory=list)
    config: Path = CONFIG
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    seen_hosts: dict[int, Host] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)  # added to pearld's environment
    metrics_port: int = 0  # where daemon.metrics serves, when the run set it

    @property
    def endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    @property
    def state(self) -> Path:
        return self.tmp / "state"

    def log_path(self, n: int) -> Path:
        return self.tmp / f"pearld-{n}.log"

    def start(self, timeout: float = 60.0) -> float:
        """Start pearld; the seconds until it answers status."""
        self.starts += 1
        t0 = time.monotonic()
        sets = [x for s in self.sets for x in ("--set", s)]
        with open(self.log_path(self.starts), "wb") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "pearl.daemon",
                    "--config",
                    str(self.config),
                    "--state-dir",
                    str(self.state),
                    "--endpoint",
                    self.endpoint,
                    *sets,
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=ROOT,
                env={**os.environ, **self.env},
                start_new_session=True,  # a Ctrl-C of the run reaches pearld only through us
            )
        with Client(self.endpoint, timeout_s=0.5, retries=0, name="harness") as c:
            while time.monotonic() - t0 < timeout:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"pearld exited ({self.proc.returncode}):\n{self.tail()}")
                with contextlib.suppress(Exception):
                    if c.request(StatusRequest()).payload:
                        return time.monotonic() - t0
                time.sleep(0.05)
        raise RuntimeError(f"pearld did not answer status in {timeout}s:\n{self.tail()}")

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        if self.running():
            assert self.proc is not None
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout``; the exit status."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        return self.proc.returncode

    def hosts(self) -> list[Host]:
        """Live worker hosts of this state dir: pearld's children and every other process whose
        command line is a worker host of this state dir (adopted after a restart)."""
        state = str(self.state)
        out = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            pid = int(entry)
            argv = _cmdline(pid)
            if _arg(argv, "--state-dir") != state:
                continue
            if "actors.worker_host" in argv:  # a subprocess: its own command line
                ids = (int(_arg(argv, "--worker")), int(_arg(argv, "--incarnation")))
            elif "actors.forkserver" in argv and (found := _forked_ids(pid)) is not None:
                ids = found  # forked: the server's command line, and a name of its own
            else:
                continue
            st = _stat(pid)
            if st is None or st[0] == "Z":
                continue
            h = Host(pid, st[1], *ids)
            self.seen_hosts.setdefault(pid, h)
            out.append(h)
        return out

    def cleanup(self) -> None:
        """Stop pearld and every worker host of this run, by pid (also stopped ones)."""
        with contextlib.suppress(Exception):
            self.stop(20)
        for h in [*self.hosts(), *self.seen_hosts.values()]:
            h.signal(signal.SIGKILL)
            h.signal(signal.SIGCONT)

    def tail(self, n: int = 30) -> str:
        p = self.log_path(self.starts)
        return "\n".join(p.read_text(errors="replace").splitlines()[-n:]) if p.exists() else ""

    def log_lines(self) -> list[tuple[int, str]]:
        """Every line of every pearld start's log, with the start it came from."""
        out = []
        for n in range(1, self.starts + 1):
            p = self.log_path(n)
            if p.exists():
                out += [(n, line) for line in p.read_text(errors="replace").splitlines()]
        return out

    def log_stats(self) -> dict[str, Any]:
        """Actor restarts and failures, give-ups, controller invariant violations and worker hosts
        declared down, from the log."""
        restarts: dict[str, int] = {}
        failures: list[str] = []
        down: list[dict[str, Any]] = []
        gave_up = []
        violations: list[str] = []  # invariant violations the orchestrator recovered from
        for start, line in self.log_lines():
            if m := ACTOR_RESTART.search(line):
                restarts[m[1]] = restarts.get(m[1], 0) + 1
            if m := ACTOR_FAILED.search(line):
                failures.append(f"{m[1]}: {m[2]}")
            if m := GIVE_UP.search(line):
                gave_up.append(m[1])
            if m := VIOLATION.search(line):
                violations.append(m[1][:300])
            if m := HOST_DOWN.search(line):
                down.append(
                    {
                        "start": start,
                        "worker": int(m[1]),
                        "pid": int(m[2]),
                        "why": m[3],
                        "ts": line.split(" ", 1)[0][3:],
                    }
                )
        return {
            "restarts": restarts,
            "failures": failures,
            "gave_up": gave_up,
            "violations": violations,
            "down": down,
        }


class Trainer:
    """The Python client (``pearl.connect``) with every acknowledged event remembered."""

    def __init__(self, endpoint: str, timeout_s: float = 5.0) -> None:
        import pearl

        self.rt = pearl.connect(endpoint, timeout_s=timeout_s)
        self.acked: dict[int, Any] = {}  # seq -> record, as acknowledged
        self.refused: dict[str, int] = {}
        self.unacked = 0  # sent, no reply: may or may not be logged
        self.told_failed: list[Any] = []  # records pearld answered with an error: not logged
        self.unknown: list[Any] = []  # records sent with no answer: logged or not
        self.last_refusal = ""  # the error text of the last refusal

    def close(self) -> None:
        self.rt.stop()

    def status(self, timeout_s: float = 2.0) -> dict[str, Any]:
        """The status view; one try (a dead pearld must not stall the caller for long)."""
        payload = self.rt.client.request(StatusRequest(), timeout_s, retries=0).payload
        if not payload:
            raise RuntimeError("pearld has not published its state yet")
        return status_plain(payload)

    def publish(self, version: int, data: bytes, timeout_s: float = 10.0) -> bool:
        """Upload weights ``version`` (pearld stores them and logs weights-published)."""
        from actors.messages import WeightsUpload

        try:
            self.rt.client.request(WeightsUpload(version), timeout_s, retries=0, frames=(data,))
        except Exception:
            return False
        return True

    def event(self, record: Any, timeout_s: float = 5.0) -> int | None:
        """Send ``record``; its sequence number once acknowledged, None when refused or not
        answered. No retry: a retry that crosses a pearld restart could be logged twice."""
        self.last_refusal = ""
        try:
            seq = int(self.rt.client.request(Event.of(record), timeout_s, retries=0).seq)
        except RemoteError as e:
            self.last_refusal = str(e)
            why = str(e).split(":", 2)[-1].strip()[:80]
            self.refused[why] = self.refused.get(why, 0) + 1
            self.told_failed.append(record)
            return None
        except Exception:
            self.unacked += 1
            self.unknown.append(record)
            return None
        self.acked[seq] = record
        return seq

    def reported_failed_but_durable(self, state: Path) -> list[str]:
        """Logged records of the kinds this client sends that pearld did not acknowledge and
        that no unanswered attempt explains: each was answered with an error, yet happened."""
        kinds = (ev.GpusAdded, ev.GpusReclaimed, ev.TrainingBegin, ev.TrainingFinished)
        unknown = list(self.unknown)
        out = []
        for seq, r in read_log(state):
            if seq in self.acked or not isinstance(r, kinds):
                continue
            if r in unknown:
                unknown.remove(r)  # sent with no answer: may well be logged
            elif r in self.told_failed:
                out.append(f"seq {seq}: {r}")
        return out

    def wait_proceed(self, step: int, timeout: float) -> float | None:
        """Seconds from now until status says training step ``step`` may proceed."""
        t0 = time.monotonic()

        def ok() -> bool:
            try:
                return bool(self.status()["training_may_proceed"] >= step)
            except Exception:
                return False

        return time.monotonic() - t0 if wait_until(ok, timeout, 0.005) else None


def safetensors_blob() -> bytes:
    """A one-tensor safetensors file (sim engines only look at the version)."""
    header = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    return len(header).to_bytes(8, "little") + header + b"\0\0\0\0"


def read_log(state: Path) -> list[tuple[int, Any]]:
    from pearl.log import FileLog

    with FileLog(state / "log", readonly=True) as log:
        return list(log.read())


def lost_events(state: Path, acked: dict[int, Any], published: set[int]) -> list[str]:
    """Acknowledged events (and uploaded weight versions) that the log does not hold."""
    logged = dict(read_log(state))
    lost = [f"seq {s}: {r}" for s, r in sorted(acked.items()) if logged.get(s) != r]
    versions = {r.version for r in logged.values() if isinstance(r, ev.WeightsPublished)}
    return lost + [f"weights v{v}" for v in sorted(published - versions)]


def pearl_cli(*args: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    """``pearl ARGS...`` as an operator runs it."""
    return subprocess.run(
        [sys.executable, "-m", "pearl", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


def pearl_json(*args: str) -> dict[str, Any]:
    out = pearl_cli(*args)
    if out.returncode:
        raise RuntimeError(f"pearl {' '.join(args)}: {out.stderr.strip()}")
    return dict(json.loads(out.stdout))


def status_vs_replay(d: Pearld, tries: int = 10) -> tuple[bool, dict[str, Any]]:
    """``pearl status --json`` against ``pearl log replay DIR --until SEQ --json`` for the same
    sequence number: equal on every key the replay has."""
    diff: dict[str, Any] = {}
    for _ in range(tries):
        s = pearl_json("status", "--json", "--endpoint", d.endpoint)
        r = pearl_json("log", "replay", str(d.state), "--until", str(s["seq"]), "--json")
        diff = {k: {"status": s.get(k), "replay": v} for k, v in r.items() if s.get(k) != v}
        if not diff:
            return True, {}
        time.sleep(0.5)
    return False, diff


def summary(xs: list[float]) -> dict[str, float]:
    if not xs:
        return {"n": 0, "median_s": 0.0, "max_s": 0.0}
    return {"n": len(xs), "median_s": round(statistics.median(xs), 3), "max_s": round(max(xs), 3)}


def overlap_serving(s: dict[str, Any]) -> bool:
    """An overlap worker (on a lent training GPU) is active: borrowing is under way."""
    return any(
        w["zone"] == "overlap" and w["role"] != "training" and w["activity"] == "active"
        for w in s["workers"]
    )


def parser(doc: str) -> argparse.ArgumentParser:
    """The flags storm and chaos share: --seed, --json, --set K=V (repeatable), --keep DIR."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", help="write the figures to this file")
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="K=V",
        help="pearld config override (repeatable)",
    )
    ap.add_argument("--keep", help="keep pearld's state dir and logs here (default: a temp dir)")
    return ap


def in_state_dir(
    args: argparse.Namespace, prefix: str, run: Callable[[argparse.Namespace, Path], Any]
) -> Any:
    """``run(args, dir)`` in ``--keep DIR`` or in a temporary directory removed afterwards."""
    if args.keep:
        Path(args.keep).mkdir(parents=True, exist_ok=True)
        return run(args, Path(args.keep))
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        return run(args, Path(tmp))


__all__ = [
    "PREEMPTIBLE",
    "Host",
    "Pearld",
    "Trainer",
    "alive",
    "lost_events",
    "overlap_serving",
    "status_vs_replay",
    "summary",
    "wait_until",
]
