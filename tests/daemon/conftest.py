"""A real pearld subprocess with sim worker hosts, cleaned up by pid."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pearl.core.events import RECORDS
from pearl.core.fold import replay
from pearl.core.state import ClusterState
from pearl.core.status import status_plain
from pearl.log import FileLog
from transports.protocol import Event, StatusRequest
from transports.rpc import Client

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "sim-32.toml"
# A small cluster: 2 overlap workers on training GPUs 0-3, 2 reserved workers on 4-7, up to 4
# preemptible workers on 8-15. Sim engines run 1000x faster than real time.
SMALL = [
    "cluster.training_gpus=0-3",
    "cluster.reserved_gpus=4-7",
    "cluster.preemptible_gpus=8-15",
    "engine.time_scale=0.001",
    "daemon.heartbeat_s=0.2",
    "daemon.tick_s=0.1",
    "daemon.reconcile_grace_s=2.0",
    "daemon.restart_backoff_s=0.2",
    "daemon.worker_orphan_s=20",
]


def wait_until(pred: Callable[[], Any], timeout: float, what: str, every: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


class Pearld:
    def __init__(self, tmp: Path, sets: list[str]) -> None:
        self.tmp, self.sets = tmp, sets
        self.state = tmp / "state"
        self.endpoint = f"ipc://{tmp}/api.sock"
        self.proc: subprocess.Popen[bytes] | None = None
        self.client: Client | None = None
        self.client_keys: Any = None  # CURVE ClientKeys for a pearld with daemon.keys_dir
        self.starts = 0

    def start(self, timeout: float = 30.0) -> None:
        self.starts += 1
        log = open(self.tmp / f"pearld-{self.starts}.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            self.command(self.endpoint),
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )
        log.close()
        self.client = Client(self.endpoint, keys=self.client_keys, timeout_s=1.0, retries=0)

        def up() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"pearld exited: {self.log_tail()}")
            try:
                return bool(self.status())
            except Exception:
                return False

        wait_until(up, timeout, "pearld to answer status")

    def command(self, endpoint: str) -> list[str]:
        """The pearld command line for this state dir and these overrides."""
        sets = [x for s in self.sets for x in ("--set", s)]
        return [sys.executable, "-m", "pearl.daemon", "--config", str(CONFIG),
                "--state-dir", str(self.state), "--endpoint", endpoint, *sets]  # fmt: skip

    def log_tail(self, n: int = 30) -> str:
        path = self.tmp / f"pearld-{self.starts}.log"
        return (
            "\n".join(path.read_text(errors="replace").splitlines()[-n:]) if path.exists() else ""
        )

    def status(self) -> dict[str, Any]:
        """The ``pearl status --json`` mapping."""
        assert self.client is not None
        return status_plain(self.client.request(StatusRequest()).payload)

    def event(self, record: Any) -> int:
        assert self.client is not None
        return int(self.client.request(Event.of(record), 5.0).seq)

    def settled(self, timeout: float = 30.0) -> dict[str, Any]:
        """Wait for no plan in flight and no failed worker."""

        def calm() -> dict[str, Any] | None:
            s = self.status()
            return s if not s["transitions"] and not s["failed"] and s["plan"] is None else None

        return wait_until(calm, timeout, "pearld to settle")  # type: ignore[no-any-return]

    def host_pids(self) -> dict[str, int]:
        out = {}
        for p in (self.state / "workers").glob("*.pid"):
            with contextlib.suppress(OSError, ValueError):
                out[p.stem] = int(p.read_text())
        return out

    def kill9(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        if self.client is not None:
            self.client.close()
            self.client = None

    def stop(self) -> int:
        if self.client is not None:
            self.client.close()
            self.client = None
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        os.kill(self.proc.pid, signal.SIGTERM)
        try:
            return self.proc.wait(20)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            return self.proc.wait(5)

    def cleanup(self) -> None:
        self.stop()
        for pid in self.host_pids().values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def replayed(self, until: int | None = None) -> ClusterState:
        with FileLog(self.state / "log", readonly=True) as log:
            return log.load(until).state

    def records(self) -> list[tuple[int, Any]]:
        with FileLog(self.state / "log", readonly=True) as log:
            return list(log.read())


@pytest.fixture
def pearld_factory(tmp_path: Path) -> Iterator[Callable[..., Pearld]]:
    made: list[Pearld] = []

    def make(*extra: str, start: bool = True) -> Pearld:
        p = Pearld(tmp_path / f"d{len(made)}", [*SMALL, *extra])
        p.tmp.mkdir(parents=True)
        made.append(p)
        if start:
            p.start()
        return p

    yield make
    for p in made:
        p.cleanup()


__all__ = ["RECORDS", "Pearld", "replay", "wait_until"]
