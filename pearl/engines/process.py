"""A server process an engine launches and keeps alive (an SGLang or a vLLM server).

:class:`ServerProcess` starts an argv, keeps its output in a log file, and stops it by pid
(SIGTERM, then SIGKILL); on Linux the server also dies with its worker host (PDEATHSIG), so a
crashed host never leaves a server holding its GPUs and port.

A server's log is bounded: past ``max_log_bytes`` it is copied to ``LOG.1`` and cut back to
empty (the server appends, so it writes on at the new end). A log the caller did not name lives
in ``$PEARL_SERVER_LOGS`` (the launcher points it into the state directory) or the temporary
directory, is named after the worker host's pid, and is removed when the server is stopped; logs
of hosts that are gone are removed when the next server of that kind starts there.

:class:`Watchdog` notices a death and relaunches through the engine, within a restart budget.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import queue
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

from pearl.engines.base import EngineError

log = logging.getLogger(__name__)


def first_gpu() -> int:
    """The worker's first GPU: the launcher pins a worker host with ``CUDA_VISIBLE_DEVICES``."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return int(visible) if visible.isdigit() else 0


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


T = TypeVar("T")


class _Spawner:
    """Starts children from one long-lived thread: Linux delivers PDEATHSIG when the *thread*
    that forked a child exits, so a server started from a short-lived thread would be killed."""

    def __init__(self) -> None:
        self._q: queue.Queue[tuple[Callable[[], Any], Future[Any]]] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def run(self, fn: Callable[[], T]) -> T:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="spawner", daemon=True)
                self._thread.start()
        fut: Future[T] = Future()
        self._q.put((fn, fut))
        return fut.result()

    def _loop(self) -> None:
        while True:
            fn, fut = self._q.get()
            try:
                fut.set_result(fn())
            except BaseException as e:
                fut.set_exception(e)


_SPAWNER = _Spawner()
LOG_DIR_ENV = "PEARL_SERVER_LOGS"  # where servers' own logs go (the launcher sets it)
MAX_LOG_BYTES = 64 << 20
BOUND_EVERY_S = 2.0


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def prune_logs(folder: Path, prefix: str) -> int:
    """Remove the logs (and their ``.1``) of ``prefix`` servers whose worker host is gone."""
    removed = 0
    pattern = re.compile(rf"pearl-{re.escape(prefix)}-(\d+)-.*\.log(\.1)?$")
    for f in folder.glob(f"pearl-{prefix}-*.log*"):
        m = pattern.match(f.name)
        if m is not None and not _pid_alive(int(m.group(1))):
            with contextlib.suppress(OSError):
                f.unlink()
                removed += 1
    return removed


class ServerProcess:
    """One running server: started from its argv, stopped by pid, output in ``log_path``."""

    def __init__(
        self,
        argv: list[str],
        log_path: str | None = None,
        env: dict[str, str] | None = None,
        prefix: str = "server",
        group: bool = False,
        max_log_bytes: int = MAX_LOG_BYTES,
    ) -> None:
        self.argv = argv
        # group: the server runs in a process group of its own, and stopping it stops the group
        # (vLLM's engine core and workers are its children: killed alone, it would orphan them).
        self.group = group
        self.own_log = not log_path  # named here: removed at stop()
        if log_path:
            self.log_path = Path(log_path)
        else:
            folder = Path(os.environ.get(LOG_DIR_ENV) or tempfile.gettempdir())
            folder.mkdir(parents=True, exist_ok=True)
            prune_logs(folder, prefix)
            fd, name = tempfile.mkstemp(
                prefix=f"pearl-{prefix}-{os.getpid()}-", suffix=".log", dir=folder
            )
            os.close(fd)
            self.log_path = Path(name)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.max_log_bytes = max_log_bytes
        self._stopped = threading.Event()
        preexec = _die_with_parent if sys.platform.startswith("linux") else None
        try:
            self.proc = _SPAWNER.run(
                lambda: subprocess.Popen(
                    argv,
                    stdout=self._log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    preexec_fn=preexec,
                    process_group=0 if group else None,
                )
            )
        except OSError as e:
            self._log.close()
            raise EngineError(f"cannot start {shlex.join(argv)}: {e}") from None
        self.pid = self.proc.pid
        threading.Thread(target=self._bound, name=f"{prefix}-log", daemon=True).start()

    def _bound(self) -> None:
        while not self._stopped.wait(BOUND_EVERY_S):
            self.bound_log()

    def bound_log(self) -> bool:
        """Past ``max_log_bytes``, copy the log to ``LOG.1`` and cut it back to empty; whether
        it did."""
        try:
            if self.log_path.stat().st_size <= self.max_log_bytes:
                return False
            shutil.copyfile(self.log_path, self.log_path.with_name(self.log_path.name + ".1"))
            os.truncate(self.log_path, 0)
        except OSError as e:  # tried again at the next look
            log.debug("cannot bound %s: %s", self.log_path, e)
            return False
        return True

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self, n: int = 20) -> str:
        """The last lines of the server's output (for error messages)."""
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def _signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            if self.group:
                os.killpg(self.pid, sig)
            else:
                os.kill(self.pid, sig)

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM, wait, then SIGKILL (the group's stragglers too); idempotent."""
        if self.proc.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                self.proc.wait(10)
        if self.group:
            self._signal(signal.SIGKILL)  # children the server left behind
        self._stopped.set()
        if not self._log.closed:
            self._log.close()
        if self.own_log:
            for path in (self.log_path, self.log_path.with_name(self.log_path.name + ".1")):
                with contextlib.suppress(OSError):
                    path.unlink()


class Watchdog:
    """Polls ``alive()`` every ``every_s``; on a death calls ``relaunch()`` (at most ``budget``
    times, then ``give_up(reason)``). ``pause()``/``resume()`` bracket deliberate restarts."""

    def __init__(
        self,
        alive: Callable[[], bool],
        relaunch: Callable[[], None],
        give_up: Callable[[str], None],
        budget: int = 3,
        every_s: float = 1.0,
        what: str = "server",
    ) -> None:
        self.alive, self.relaunch, self.give_up, self.what = alive, relaunch, give_up, what
        self.budget, self.every_s = budget, every_s
        self.restarts = 0
        self._paused = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"{what}-watchdog", daemon=True)
        self._thread.start()

    def pause(self) -> None:
        with self._lock:
            self._paused += 1

    def resume(self) -> None:
        with self._lock:
            self._paused -= 1

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            with self._lock:
                if self._paused or self.alive():
                    continue
                if self.restarts >= self.budget:
                    self.give_up(f"the server died {self.restarts + 1} times")
                    return
                self.restarts += 1
                log.error("%s died; relaunching (%d/%d)", self.what, self.restarts, self.budget)
                try:
                    self.relaunch()
                except Exception as e:  # counted; the next poll tries again or gives up
                    log.error("relaunch failed: %s", e)


_CAUSE = re.compile(r"\b[A-Za-z_.]*(Error|Exception)\b: .+")


def cause_of(tail: str) -> str:
    """The last ``SomethingError: message`` line of a server's output (why it exited: a port
    taken, no model at the path, an architecture the server does not know), or ""."""
    for line in reversed(tail.splitlines()):
        m = _CAUSE.search(line)
        if m is not None:
            return m.group(0)[:300]
    return ""


__all__ = ["LOG_DIR_ENV", "ServerProcess", "Watchdog", "cause_of", "first_gpu", "prune_logs"]
