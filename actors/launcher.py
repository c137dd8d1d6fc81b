"""Starting worker host processes: a local-subprocess launcher, and the interface that another
cluster engine implements too (:class:`actors.ray_launcher.RayLauncher`: Ray actors on the nodes
that hold the workers' GPUs).

A worker host is ``python -m actors.worker_host`` with its identity, GPUs and engine settings on
the command line; it finds pearld through ``--endpoint`` and registers itself. A launcher names
each host it starts by a handle (a pid here, an actor's name on Ray) and tracks and stops it by
that handle, never by a process name.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from actors.messages import WorkerHello
from pearl.config import EngineConfig
from pearl.core.errors import PearlError


class LaunchError(PearlError):
    """A worker host could not be started (no process exists for it)."""


@dataclass(frozen=True)
class WorkerSpec:
    worker: int
    incarnation: int
    gpus: tuple[int, ...]
    endpoint: str  # pearld's API
    engine: EngineConfig
    model: str
    gpu: str
    tp: int
    heartbeat_s: float
    orphan_s: float
    state_dir: str
    keys_dir: str = ""  # pearld's daemon.keys_dir: the host's CURVE keys (transports.auth.HostKeys)
    metrics: str = ""  # HOST:PORT where the host serves GET /metrics (port 0: a free one); "": off


Handle = int | str  # how a launcher names a host it started: a pid, a Ray actor's name


class Launcher(Protocol):
    def launch(self, spec: WorkerSpec) -> Handle:
        """Start a worker host; returns its handle (truthy)."""

    def alive(self, handle: Handle) -> bool: ...

    def kill(self, handle: Handle, force: bool = False) -> None: ...

    def cpu_s(self, handle: Handle) -> float | None:
        """CPU seconds the host has used while it can run; None when stopped, gone or unknown."""

    def handle_of(self, hello: WorkerHello) -> Handle:
        """The handle of the host that sent ``hello`` (one this pearld may not have started)."""

    def adopt(self, handle: Handle) -> None:
        """A host of an earlier pearld registered: stop it with ours at shutdown."""

    def reap_all(self, timeout_s: float = 3.0) -> None:
        """Stop every host started or adopted (pearld's shutdown without --keep-workers)."""

    def close(self) -> None:
        """Let go of the cluster engine (after reap_all, or leaving the hosts running)."""


def host_args(spec: WorkerSpec, python: str = sys.executable) -> list[str]:
    """The worker host's command line for ``spec``."""
    return [
        python,
        "-m",
        "actors.worker_host",
        "--endpoint",
        spec.endpoint,
        "--worker",
        str(spec.worker),
        "--incarnation",
        str(spec.incarnation),
        "--gpus",
        ",".join(str(g) for g in spec.gpus),
        "--engine",
        json.dumps(asdict(spec.engine)),
        "--model",
        spec.model,
        "--gpu",
        spec.gpu,
        "--tp",
        str(spec.tp),
        "--heartbeat-s",
        str(spec.heartbeat_s),
        "--orphan-s",
        str(spec.orphan_s),
        "--state-dir",
        spec.state_dir,
        *(["--metrics", spec.metrics] if spec.metrics else []),
    ]


class LocalProcessLauncher:
    """One subprocess per worker host on this machine (CUDA_VISIBLE_DEVICES set to its GPUs)."""

    def __init__(self, log_dir: Path | None = None) -> None:
        self.log_dir = log_dir
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        self._adopted: set[int] = set()  # hosts of an earlier pearld that registered with us

    def launch(self, spec: WorkerSpec) -> Handle:
        env = dict(os.environ)
        if spec.engine.kind != "sim":
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in spec.gpus)
        args = host_args(spec)
        if spec.keys_dir:  # the host loads its CURVE keys (DIR/worker.key_secret, DIR/server.key)
            args += ["--keys-dir", str(Path(spec.keys_dir).absolute())]
        out: Any = subprocess.DEVNULL
        try:
            if self.log_dir is not None:
                self.log_dir.mkdir(parents=True, exist_ok=True)
                path = self.log_dir / f"worker-{spec.worker}-{spec.incarnation}.log"
                out = open(path, "ab")  # noqa: SIM115 - the child owns it
            proc = subprocess.Popen(
                args,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as e:
            raise LaunchError(
                f"worker host {spec.worker} (incarnation {spec.incarnation}) could not be "
                f"started: {' '.join(args[:3])}: {e}"
            ) from None
        finally:
            if not isinstance(out, int):
                out.close()
        self._children[proc.pid] = proc
        return proc.pid

    def alive(self, pid: Handle) -> bool:
        assert isinstance(pid, int)
        child = self._children.get(pid)
        if child is not None:
            if child.poll() is None:
                return True
            self._children.pop(pid, None)
            return False
        try:  # a host adopted after a pearld restart is not our child
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return not _zombie(pid)

    def handle_of(self, hello: WorkerHello) -> Handle:
        return hello.pid

    def adopt(self, pid: Handle) -> None:
        """A host that said hello after a pearld restart: not our child, but ours to stop."""
        if isinstance(pid, int) and pid and pid not in self._children:
            self._adopted.add(pid)

    def cpu_s(self, pid: Handle) -> float | None:
        """From /proc: user + system CPU of a running or sleeping process (not stopped/zombie)."""
        assert isinstance(pid, int)
        fields = _stat(pid)
        if fields is None or fields[0] in ("T", "t", "Z", "X", "x"):
            return None
        return (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime

    def kill(self, pid: Handle, force: bool = False) -> None:
        assert isinstance(pid, int)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL if force else signal.SIGTERM)
        child = self._children.get(pid)
        if child is not None:
            try:
                child.wait(timeout=5.0 if not force else 1.0)
            except subprocess.TimeoutExpired:
                os.kill(pid, signal.SIGKILL)
                child.wait(timeout=2.0)
            self._children.pop(pid, None)

    def reap_all(self, timeout_s: float = 3.0) -> None:
        """Stop every host we started or adopted (daemon shutdown); kill those that linger."""
        for pid in [*self._children, *self._adopted]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for pid in sorted(self._adopted):  # not our children: poll, then SIGKILL by pid
            while self.alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            if self.alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self._adopted.clear()
        for pid, child in list(self._children.items()):
            try:
                child.wait(timeout=max(0.01, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait(timeout=2.0)
            self._children.pop(pid, None)

    def close(self) -> None:
        pass


def _zombie(pid: int) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] == "Z"


_TICKS = float(os.sysconf("SC_CLK_TCK")) if hasattr(os, "sysconf") else 100.0


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat after the command name: state, ppid, ... (None without /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


__all__ = ["Handle", "LaunchError", "Launcher", "LocalProcessLauncher", "WorkerSpec", "host_args"]
