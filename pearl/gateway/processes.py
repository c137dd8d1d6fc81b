"""pearld's gateway processes (``gateway.processes = N``): started, watched and stopped by pid.

Each is :mod:`pearl.gateway.process`, run with pearld's interpreter. pearld's start returns once
every process serves (it writes its ready file, ``<state>/gateway/<i>.ready``, holding its pid),
or fails in one line with the end of that process's log (``<state>/gateway/<i>.log``).

A process that exits while pearld runs is started again after a back-off that doubles from 1 s
to 30 s (reset once one has served for a minute); each exit is one warning line. Stopping sends
SIGTERM to each, then SIGKILL to whatever is left after ``STOP_S``.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from pearl.core.errors import PearlError

log = logging.getLogger("pearl.gateway")

START_S = 60.0  # a process imports the app, loads the tokenizer and binds
STOP_S = 10.0
FIRST_BACKOFF_S, MAX_BACKOFF_S, STEADY_S = 1.0, 30.0, 60.0
WATCH_S = 0.2


@dataclass
class Child:
    index: int
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    backoff_s: float = FIRST_BACKOFF_S
    restart_at: float | None = None
    restarts: int = 0


class GatewayProcesses:
    """N gateway processes sharing ``listen`` (see the module)."""

    def __init__(
        self,
        count: int,
        *,
        folder: Path,
        config_json: str,
        endpoint: str,
        routes: tuple[str, str],
        listen: str,
    ) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.config = folder / "config.json"
        self.config.write_text(config_json)
        self.endpoint, self.routes, self.listen = endpoint, routes, listen
        self.children = [Child(i) for i in range(count)]
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._watcher = threading.Thread(target=self._watch, name="gateway-processes", daemon=True)

    def ready_file(self, i: int) -> Path:
        return self.folder / f"{i}.ready"

    def log_file(self, i: int) -> Path:
        return self.folder / f"{i}.log"

    @property
    def pids(self) -> list[int]:
        """The running processes' pids, by index (0: not running)."""
        with self._lock:
            return [c.proc.pid if c.proc and c.proc.poll() is None else 0 for c in self.children]

    def start(self) -> GatewayProcesses:
        """Start every process and wait until each serves; PearlError (one line) if one
        cannot."""
        for c in self.children:
            self._launch(c)
        for c in self.children:
            self._await_ready(c)
        self._watcher.start()
        log.info("gateway at http://%s/v1 in %d processes", self.listen, len(self.children))
        return self

    def _launch(self, c: Child) -> None:
        self.ready_file(c.index).unlink(missing_ok=True)
        argv = [
            sys.executable, "-m", "pearl.gateway.process",
            "--config", str(self.config), "--endpoint", self.endpoint,
            "--routes", ",".join(self.routes), "--listen", self.listen,
            "--index", str(c.index), "--ready", str(self.ready_file(c.index)),
        ]  # fmt: skip
        with open(self.log_file(c.index), "ab") as out:
            c.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
        c.started = time.monotonic()

    def _await_ready(self, c: Child) -> None:
        assert c.proc is not None
        deadline, pause = time.monotonic() + START_S, threading.Event()
        while not self.ready_file(c.index).exists():
            if c.proc.poll() is not None or time.monotonic() > deadline:
                code = c.proc.returncode
                why = f"exit {code}" if code is not None else f"not serving after {START_S:g} s"
                raise PearlError(
                    f"gateway process {c.index} did not start on {self.listen} ({why}): "
                    f"{self._tail(c.index)}"
                )
            pause.wait(0.05)

    def _tail(self, i: int) -> str:
        try:
            lines = self.log_file(i).read_text(errors="replace").strip().splitlines()
        except OSError:
            return "(no log)"
        return lines[-1] if lines else "(its log is empty)"

    def _watch(self) -> None:
        while not self._stop.wait(WATCH_S):
            now = time.monotonic()
            with self._lock:
                for c in self.children:
                    self._tend(c, now)

    def _tend(self, c: Child, now: float) -> None:
        if c.restart_at is not None:
            if now >= c.restart_at:
                c.restart_at = None
                c.restarts += 1
                self._launch(c)
            return
        if c.proc is None or c.proc.poll() is None:
            if c.proc is not None and now - c.started > STEADY_S:
                c.backoff_s = FIRST_BACKOFF_S
            return
        log.warning(
            "gateway process %d (pid %d) exited %s: %s; starting it again in %.0f s",
            c.index, c.proc.pid, c.proc.returncode, self._tail(c.index), c.backoff_s,
        )  # fmt: skip
        c.restart_at = now + c.backoff_s
        c.backoff_s = min(MAX_BACKOFF_S, 2 * c.backoff_s)

    def stop(self) -> None:
        """SIGTERM each process, then SIGKILL what is left after STOP_S (by pid)."""
        self._stop.set()
        if self._watcher.is_alive():
            self._watcher.join()
        with self._lock:
            procs = [c.proc for c in self.children if c.proc is not None]
        for p in procs:
            if p.poll() is None:
                p.terminate()
        deadline = time.monotonic() + STOP_S
        for p in procs:
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("gateway process pid %d did not stop in %.0f s: killed", p.pid, STOP_S)
                p.kill()
                p.wait()
        for c in self.children:
            self.ready_file(c.index).unlink(missing_ok=True)


__all__ = ["GatewayProcesses"]
