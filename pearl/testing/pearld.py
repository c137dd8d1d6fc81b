"""A real pearld process for tests and benchmarks: started with a config and ``--set``
overrides, its log in a file per start, its worker hosts found by their command lines, and
everything it started stopped by pid (``Pearld.cleanup``).

The endpoint is ``ipc://TMP/api.sock`` unless a ``port`` is given (then ``tcp://127.0.0.1:PORT``);
either stays the same across restarts, so that surviving worker hosts find the new pearld.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pearl.core.state import ClusterState
from pearl.core.status import status_plain
from pearl.log import FileLog
from pearl.testing.wait import wait_until
from transports.protocol import Event, StatusRequest
from transports.rpc import Client

if TYPE_CHECKING:
    from pearl.core import events as ev
    from transports.auth import ClientKeys

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "sim-32.toml"
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
    """pearld with this state directory (``TMP/state``) and these overrides; one log file per
    start (``TMP/pearld-N.log``). ``client`` talks to the running one."""

    tmp: Path
    sets: list[str] = field(default_factory=list)
    config: Path = CONFIG
    port: int | None = None  # tcp://127.0.0.1:PORT; None: ipc://TMP/api.sock
    env: dict[str, str] = field(default_factory=dict)  # added to pearld's environment
    metrics_port: int = 0  # where daemon.metrics serves, when the run set it
    client_keys: ClientKeys | None = None  # CURVE ClientKeys for a pearld with daemon.keys_dir
    proc: subprocess.Popen[bytes] | None = None
    client: Client | None = None
    starts: int = 0
    seen_hosts: dict[int, Host] = field(default_factory=dict)

    state: Path = field(init=False)  # TMP/state unless set
    endpoint: str = field(init=False)  # from port unless set

    def __post_init__(self) -> None:
        self.state = self.tmp / "state"
        self.endpoint = (
            f"tcp://127.0.0.1:{self.port}" if self.port else f"ipc://{self.tmp}/api.sock"
        )

    def log_path(self, n: int) -> Path:
        return self.tmp / f"pearld-{n}.log"

    def command(self, endpoint: str) -> list[str]:
        """The pearld command line for this state dir and these overrides."""
        sets = [x for s in self.sets for x in ("--set", s)]
        return [sys.executable, "-m", "pearl.daemon", "--config", str(self.config),
                "--state-dir", str(self.state), "--endpoint", endpoint, *sets]  # fmt: skip

    def start(self, timeout: float = 60.0) -> float:
        """Start pearld; the seconds until it answers status."""
        self.starts += 1
        t0 = time.monotonic()
        with open(self.log_path(self.starts), "wb") as out:
            self.proc = subprocess.Popen(
                self.command(self.endpoint),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=ROOT,
                env={**os.environ, **self.env},
                start_new_session=True,  # a Ctrl-C of the run reaches pearld only through us
            )
        self.client = Client(self.endpoint, keys=self.client_keys, timeout_s=1.0, retries=0)

        def up() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"pearld exited ({self.proc.returncode}):\n{self.tail()}")
            try:
                return bool(self.status())
            except Exception:
                return False

        wait_until(up, timeout, "pearld to answer status")
        return time.monotonic() - t0

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def status(self) -> dict[str, Any]:
        """The ``pearl status --json`` mapping ({} while pearld has published no state yet)."""
        assert self.client is not None
        payload = self.client.request(StatusRequest()).payload
        return {} if payload is None else status_plain(payload)

    def event(self, record: ev.Elastic) -> int:
        assert self.client is not None
        return int(self.client.request(Event.of(record), 5.0).seq)

    def settled(self, timeout: float = 30.0) -> dict[str, Any]:
        """Wait for no plan in flight and no failed worker."""

        seen: list[dict[str, Any]] = [{}]

        def calm() -> dict[str, Any] | None:
            s = seen[0] = self.status()
            return s if not s["transitions"] and not s["failed"] and s["plan"] is None else None

        try:
            return wait_until(calm, timeout, "pearld to settle")
        except AssertionError as e:
            s = seen[0]
            unsettled = {k: s.get(k) for k in ("plan", "transitions", "failed", "phase")}
            raise AssertionError(f"{e}\nunsettled: {unsettled}\npearld:\n{self.tail(60)}") from None

    def _close_client(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None

    def kill9(self) -> None:
        if self.running():
            assert self.proc is not None
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self._close_client()

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout``; the exit status (None: never started)."""
        self._close_client()
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

    def host_pids(self) -> dict[str, int]:
        """Worker host pids from their pid files (``state/workers/*.pid``), by file stem."""
        out = {}
        for p in (self.state / "workers").glob("*.pid"):
            with contextlib.suppress(OSError, ValueError):
                out[p.stem] = int(p.read_text())
        return out

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
        for pid in self.host_pids().values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def log_tail(self, n: int = 30) -> str:
        return self.tail(n)

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

    def replayed(self, until: int | None = None) -> ClusterState:
        with FileLog(self.state / "log", readonly=True) as log:
            return log.load(until).state

    def records(self) -> list[tuple[int, Any]]:
        with FileLog(self.state / "log", readonly=True) as log:
            return list(log.read())


__all__ = ["CONFIG", "ROOT", "Host", "Pearld", "alive", "free_port"]
