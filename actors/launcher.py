"""Starting worker host processes: a local-subprocess launcher, and the interface that another
cluster engine implements too (:class:`actors.ray_launcher.RayLauncher`: Ray actors on the nodes
that hold the workers' GPUs).

A worker host is ``python -m actors.worker_host`` with its identity, GPUs and engine settings on
the command line; it finds pearld through ``--endpoint`` and registers itself. A launcher names
each host it starts by a handle (a pid here, an actor's name on Ray) and tracks and stops it by
that handle, never by a process name. The local launcher forks its hosts from a
:class:`ForkServer` (``actors.forkserver``) that imported the host's modules once, and falls back
to one ``python -m actors.worker_host`` subprocess per host when it cannot.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any, Protocol

from actors import worker_files
from actors.messages import WorkerHello
from pearl.config import EngineConfig, EngineKind
from pearl.core.errors import PearlError
from pearl.engines.process import LOG_DIR_ENV

log = logging.getLogger("pearl.launcher")


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


class ForkServerError(PearlError):
    """The fork server cannot start hosts (it failed to start, exited or did not answer)."""


class ForkServer:
    """pearld's end of an ``actors.forkserver`` process.

    Started at once, so that its imports overlap pearld's own start; :meth:`spawn` waits for them
    (up to ``ready_timeout_s``) the first time. Replies are read by a thread of their own, so a
    server that hangs is a timeout here, not a hang. Closing its input ends it; the hosts it
    forked live on."""

    def __init__(
        self,
        preload: tuple[str, ...],
        stderr: Path | None = None,
        state_dir: str = "",
        python: str = sys.executable,
        ready_timeout_s: float = 60.0,
        reply_timeout_s: float = 10.0,
    ) -> None:
        self.ready_timeout_s, self.reply_timeout_s = ready_timeout_s, reply_timeout_s
        self._lock = threading.Lock()
        self._replies: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._ready: dict[str, Any] | None = None
        err: int | IO[bytes] = subprocess.DEVNULL
        try:
            if stderr is not None:
                stderr.parent.mkdir(parents=True, exist_ok=True)
                err = open(stderr, "ab")  # noqa: SIM115 - the server owns it
            self.proc = subprocess.Popen(
                [python, "-m", "actors.forkserver", "--preload", ",".join(preload)]
                + (["--state-dir", state_dir] if state_dir else []),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                start_new_session=True,
            )
        except OSError as e:
            raise ForkServerError(f"the fork server could not be started: {e}") from None
        finally:
            if not isinstance(err, int):
                err.close()
        threading.Thread(target=self._read, name="forkserver-replies", daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                self._replies.put(json.loads(line))
            except ValueError:
                continue  # not a reply (a module that prints at import)
        self._replies.put(None)  # end of output: the server is gone

    def _next(self, timeout_s: float, what: str) -> dict[str, Any]:
        try:
            reply = self._replies.get(timeout=timeout_s)
        except queue.Empty:
            self.close()  # a late reply would answer the next request
            raise ForkServerError(
                f"the fork server did not answer {what} in {timeout_s:g} s"
            ) from None
        if reply is None:
            self._replies.put(None)  # it stays gone for every later call
            raise ForkServerError(f"the fork server exited (code {self.proc.poll()})")
        return reply

    def spawn(
        self,
        module: str,
        argv: list[str],
        env: dict[str, str],
        out: Path | None,
        name: str = "",
    ) -> int:
        """Fork a child that runs ``python -m module argv`` with ``env``, its output appended to
        ``out`` (None: discarded) and ``name`` its process name; returns its pid."""
        with self._lock:
            if self.proc.poll() is not None:
                raise ForkServerError(f"the fork server exited (code {self.proc.returncode})")
            if self._ready is None:
                self._ready = self._next(self.ready_timeout_s, "with its imports")
                if self._ready.get("failed"):
                    log.warning("the fork server could not preload %s", self._ready["failed"])
            log_path = None if out is None else str(out)
            req = {"module": module, "argv": argv, "env": env, "log": log_path, "name": name}
            assert self.proc.stdin is not None
            try:
                self.proc.stdin.write(json.dumps(req).encode() + b"\n")
                self.proc.stdin.flush()
            except (OSError, ValueError) as e:
                raise ForkServerError(f"the fork server takes no request: {e}") from None
            reply = self._next(self.reply_timeout_s, "a launch")
        if "pid" not in reply:
            raise ForkServerError(f"the fork server could not fork: {reply.get('error')}")
        return int(reply["pid"])

    def close(self) -> None:
        """End the server (at end of its input; killed if it lingers). Its children stay."""
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=2.0)


class LocalProcessLauncher:
    """Worker hosts on this machine (CUDA_VISIBLE_DEVICES set to its GPUs), forked from a
    :class:`ForkServer` that preloaded ``preload`` (its command line names ``state_dir``: a
    forked host shows the server's); without one (``preload`` empty), or once it fails, one
    subprocess per host."""

    def __init__(
        self, log_dir: Path | None = None, preload: tuple[str, ...] = (), state_dir: str = ""
    ) -> None:
        self.log_dir = log_dir
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        # Hosts the fork server started (not our children), with their start times (/proc).
        self._forked: dict[int, str | None] = {}
        self._adopted: set[int] = set()  # hosts of an earlier pearld that registered with us
        self._forks: ForkServer | None = None
        if log_dir is not None:  # what earlier runs left: old logs, pid files of dead hosts
            worker_files.prune(log_dir)
        if preload:
            try:
                server_log = log_dir / "forkserver.log" if log_dir is not None else None
                self._forks = ForkServer(preload, server_log, state_dir)
            except ForkServerError as e:
                log.warning("%s: worker hosts start as subprocesses", e)

    def launched(self) -> list[int]:
        """The pids of the hosts this launcher started that it still tracks."""
        return [*self._children, *self._forked]

    def subprocesses(self) -> dict[int, list[str]]:
        """Of :meth:`launched`, the hosts started as subprocesses of this process (not forked):
        pid -> the command line it was started with."""
        return {pid: _argv(p.args) for pid, p in self._children.items()}

    @property
    def fork_server(self) -> ForkServer | None:
        """The fork server hosts are forked from; None without one, or once it failed."""
        return self._forks

    def launch(self, spec: WorkerSpec) -> Handle:
        env = dict(os.environ)
        if spec.engine.kind is not EngineKind.SIM:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in spec.gpus)
        if self.log_dir is not None:  # the logs of the servers the host runs: beside its own
            env[LOG_DIR_ENV] = str((self.log_dir / "servers").absolute())
        args = host_args(spec)
        if spec.keys_dir:  # the host loads its CURVE keys (DIR/worker.key_secret, DIR/server.key)
            args += ["--keys-dir", str(Path(spec.keys_dir).absolute())]
        path = None
        try:
            if self.log_dir is not None:
                self.log_dir.mkdir(parents=True, exist_ok=True)
                # Room for this one among the slot's last few (a host that dies before it
                # prunes its slot itself still leaves a bounded folder).
                worker_files.prune(self.log_dir, spec.worker, worker_files.KEEP - 1)
                path = worker_files.log_path(self.log_dir, spec.worker, spec.incarnation)
            if self._forks is not None:
                try:
                    name = f"pearl-w{spec.worker}.{spec.incarnation}"
                    pid = self._forks.spawn(args[2], args[3:], env, path, name)
                except ForkServerError as e:
                    log.warning("%s: worker hosts start as subprocesses from now on", e)
                    self._forks.close()
                    self._forks = None
                else:
                    self._forked[pid] = _started(pid)
                    return pid
            return self._popen(args, env, path)
        except OSError as e:
            raise LaunchError(
                f"worker host {spec.worker} (incarnation {spec.incarnation}) could not be "
                f"started: {' '.join(args[:3])}: {e}"
            ) from None

    def _popen(self, args: list[str], env: dict[str, str], path: Path | None) -> int:
        out: int | IO[bytes] = open(path, "ab") if path is not None else subprocess.DEVNULL  # noqa: SIM115
        try:
            proc = subprocess.Popen(
                args,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            if not isinstance(out, int):
                out.close()  # the child owns it
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
        if pid in self._forked:  # reaped by the fork server's kernel: gone, or its pid reused
            if _started(pid) == self._forked[pid]:
                return not _zombie(pid)
            self._forked.pop(pid, None)
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

    def last_error(self, worker: int, incarnation: int) -> str:
        """The last error the host of ``worker``/``incarnation`` logged since it was last
        launched (why it could not start its engine, say); "" when none or no log is kept."""
        if self.log_dir is None:
            return ""
        return last_error(worker_files.log_path(self.log_dir, worker, incarnation))

    def adopt(self, pid: Handle) -> None:
        """A host that said hello after a pearld restart: not our child, but ours to stop."""
        if isinstance(pid, int) and pid and pid not in self._children and pid not in self._forked:
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
        if not self.alive(pid):  # gone already (alive forgot a child or forked host)
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL if force else signal.SIGTERM)
        child = self._children.pop(pid, None)
        if child is not None:
            try:
                child.wait(timeout=5.0 if not force else 1.0)
            except subprocess.TimeoutExpired:
                os.kill(pid, signal.SIGKILL)
                child.wait(timeout=2.0)
        elif not self._gone(pid, 5.0 if not force else 1.0):  # not our child: poll
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            self._gone(pid, 2.0)
        self._forked.pop(pid, None)

    def _gone(self, pid: int, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while self.alive(pid):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
        return True

    def reap_all(self, timeout_s: float = 3.0) -> None:
        """Stop every host we started or adopted (daemon shutdown); kill those that linger."""
        others = sorted({*self._forked, *self._adopted})  # not our children: poll, then SIGKILL
        for pid in [*self._children, *others]:
            if self.alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for pid in others:
            if not self._gone(pid, max(0.0, deadline - time.monotonic())):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                self._gone(pid, 2.0)
        self._forked.clear()
        self._adopted.clear()
        for pid, child in list(self._children.items()):
            try:
                child.wait(timeout=max(0.01, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait(timeout=2.0)
            self._children.pop(pid, None)

    def close(self) -> None:
        """Ends the fork server (its hosts stay: reap_all stops them)."""
        if self._forks is not None:
            self._forks.close()
            self._forks = None


_LEVEL = re.compile(r"^\S+ \S+ \S+ (ERROR|CRITICAL) (.*)$")
TAIL_BYTES = 64 << 10


def last_error(path: Path) -> str:
    """The last ERROR or CRITICAL line a host wrote to its log ``path`` since its last launch
    (the launch writes its command line first), its message only; else the last line of a
    traceback; "" when neither."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - TAIL_BYTES))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    lines = text.splitlines()
    for k in range(len(lines) - 1, -1, -1):
        if lines[k].startswith("python -m "):
            lines = lines[k + 1 :]
            break
    for line in reversed(lines):
        m = _LEVEL.match(line)
        if m is not None:
            return m.group(2)[:500]
    if any(x.startswith("Traceback") for x in lines):
        tail = [x for x in lines if x.strip()]
        return tail[-1][:500] if tail else ""
    return ""


def _argv(args: object) -> list[str]:
    """A Popen's command line as strings (it was given a list: :func:`host_args`)."""
    return [str(a) for a in args] if isinstance(args, (list, tuple)) else [str(args)]


def _started(pid: int) -> str | None:
    """When the process started (clock ticks since boot; with the pid, names one process)."""
    fields = _stat(pid)
    return fields[19] if fields is not None and len(fields) > 19 else None


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
