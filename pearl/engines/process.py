"""A server process an engine launches and keeps alive (an SGLang or a vLLM server).

:class:`ServerProcess` starts an argv, keeps its output in a log file, and stops it by pid
(SIGTERM, then SIGKILL); on Linux the server also dies with its worker host (PDEATHSIG), so a
crashed host never leaves a server holding its GPUs and port. :class:`Watchdog` notices a death
and relaunches through the engine, within a restart budget.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import queue
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from pearl.engines.base import EngineError

log = logging.getLogger(__name__)


def first_gpu() -> int:
    """The worker's first GPU: the launcher pins a worker host with ``CUDA_VISIBLE_DEVICES``."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return int(visible) if visible.isdigit() else 0


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class _Spawner:
    """Starts children from one long-lived thread: Linux delivers PDEATHSIG when the *thread*
    that forked a child exits, so a server started from a short-lived thread would be killed."""

    def __init__(self) -> None:
        self._q: queue.Queue[tuple[Callable[[], Any], Future[Any]]] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def run(self, fn: Callable[[], Any]) -> Any:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="spawner", daemon=True)
                self._thread.start()
        fut: Future[Any] = Future()
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


class ServerProcess:
    """One running server: started from its argv, stopped by pid, output in ``log_path``."""

    def __init__(
        self,
        argv: list[str],
        log_path: str | None = None,
        env: dict[str, str] | None = None,
        prefix: str = "server",
        group: bool = False,
    ) -> None:
        self.argv = argv
        # group: the server runs in a process group of its own, and stopping it stops the group
        # (vLLM's engine core and workers are its children: killed alone, it would orphan them).
        self.group = group
        fd, default = tempfile.mkstemp(prefix=f"pearl-{prefix}-", suffix=".log")
        os.close(fd)
        self.log_path = Path(log_path or default)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
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
        if not self._log.closed:
            self._log.close()


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


__all__ = ["ServerProcess", "Watchdog", "first_gpu"]
