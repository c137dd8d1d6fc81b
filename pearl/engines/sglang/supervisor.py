"""Keeps one SGLang server alive: a watchdog thread that relaunches it when it dies.

The engine decides how to relaunch (same role, weights re-applied, memory released again if it
was); the watchdog only notices the death and enforces a restart budget.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


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
    ) -> None:
        self.alive, self.relaunch, self.give_up = alive, relaunch, give_up
        self.budget, self.every_s = budget, every_s
        self.restarts = 0
        self._paused = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sglang-watchdog", daemon=True)
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
                log.error("SGLang server died; relaunching (%d/%d)", self.restarts, self.budget)
                try:
                    self.relaunch()
                except Exception as e:  # counted; the next poll tries again or gives up
                    log.error("relaunch failed: %s", e)


__all__ = ["Watchdog"]
