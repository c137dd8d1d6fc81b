"""The chaos run's fault injector: SIGKILL and SIGSTOP (then SIGCONT) of worker hosts, SIGKILL of
pearld (then a restart on the same state dir), each at random moments, bounded in count.

Every fault is recorded with its start and end (SIGCONT, pearld answering again), so that the
run can tell the deaths and slow returns it caused from the ones it did not. After each pearld
kill the log is checked, before the restart and again once pearld answers: every event the
daemon acknowledged must be in it.
"""

from __future__ import annotations

import contextlib
import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from live_pearld import Host, Pearld, lost_events

from pearl.core.state import validate


@dataclass
class Fault:
    kind: str  # kill-host | stop-host | kill-pearld | pearld-exit (pearld stopped on its own)
    t: float  # time.monotonic() at the fault
    wall: float  # time.time() at the fault (pearld's log has wall-clock stamps)
    end: float = 0.0  # SIGCONT sent, or pearld answering again
    worker: int | None = None
    pid: int | None = None
    detail: str = ""

    def as_json(self, t0: float) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "at_s": round(self.t - t0, 2),
            "for_s": round(self.end - self.t, 2),
            "worker": self.worker,
            "pid": self.pid,
            "detail": self.detail,
        }


@dataclass
class Limits:
    """Mean seconds between faults of each kind, and how many of each at most."""

    kill_host_s: float = 20.0
    stop_host_s: float = 25.0
    kill_pearld_s: float = 75.0
    max_kill_host: int = 30
    max_stop_host: int = 25
    max_kill_pearld: int = 8
    stop_for_s: tuple[float, float] = (0.5, 6.0)  # SIGSTOP lengths: some under 3 heartbeats
    down_for_s: tuple[float, float] = (0.0, 1.5)  # pearld stays dead this long
    per_worker: int = 2  # faults per worker per pearld lifetime (under the restart budget)


class Injector(threading.Thread):
    """Runs beside the client until ``until`` (time.monotonic()), then only sends SIGCONTs."""

    def __init__(
        self,
        d: Pearld,
        rng: random.Random,
        acked: Callable[[], dict[int, Any]],  # what the client has had acknowledged so far
        published: Callable[[], set[int]],  # weight versions uploaded and acknowledged
        until: float,
        limits: Limits | None = None,
    ) -> None:
        super().__init__(name="chaos-faults", daemon=True)
        self.d, self.rng, self.acked, self.published = d, rng, acked, published
        self.until, self.limits = until, limits or Limits()
        self.faults: list[Fault] = []
        self.lost: set[str] = set()  # acknowledged events missing from the log
        self.invalid: list[str] = []  # tables that fail validate() after a kill
        self.errors: list[str] = []  # the injector's own trouble
        self.restart_s: list[float] = []  # pearld start to status answered
        self.halt = threading.Event()
        self.down = threading.Event()  # set while pearld is dead on purpose
        self.lock = threading.Lock()  # held while pearld is killed and restarted
        self.stopped: list[tuple[Host, float, Fault]] = []  # (host, SIGCONT due, fault)
        self.hits: dict[int, int] = {}  # worker -> faults in this pearld lifetime
        now, lim = time.monotonic(), self.limits
        # The first pearld kill comes early enough for a one-minute run to have one.
        span = max(1.0, until - now)
        self.due = {
            "kill-host": now + rng.expovariate(1 / lim.kill_host_s),
            "stop-host": now + rng.expovariate(1 / lim.stop_host_s),
            "kill-pearld": now + rng.uniform(0.25, 0.6) * min(span, lim.kill_pearld_s),
        }

    def count(self, kind: str) -> int:
        return sum(f.kind == kind for f in self.faults)

    def run(self) -> None:
        lim = self.limits
        caps = {
            "kill-host": lim.max_kill_host,
            "stop-host": lim.max_stop_host,
            "kill-pearld": lim.max_kill_pearld,
        }
        means = {
            "kill-host": lim.kill_host_s,
            "stop-host": lim.stop_host_s,
            "kill-pearld": lim.kill_pearld_s,
        }
        while not self.halt.is_set():
            try:
                now = time.monotonic()
                self._continue_due(now)
                self._watch_pearld()
                for kind, at in sorted(self.due.items(), key=lambda kv: kv[1]):
                    if now >= at and now < self.until and self.count(kind) < caps[kind]:
                        getattr(self, kind.replace("-", "_"))()
                        self.due[kind] = time.monotonic() + self.rng.expovariate(1 / means[kind])
                        break
            except Exception as e:  # keep injecting; the run reports it
                self.errors.append(f"{type(e).__name__}: {e}")
            self.halt.wait(0.05)
        self._continue_due(float("inf"))

    def stop(self) -> None:
        self.halt.set()
        if self.is_alive():
            self.join(90)

    # -- worker hosts -----------------------------------------------------------------------

    def _victim(self) -> Host | None:
        held = {h.pid for h, _, _ in self.stopped}
        hosts = [
            h
            for h in self.d.hosts()
            if h.pid not in held and self.hits.get(h.worker, 0) < self.limits.per_worker
        ]
        return self.rng.choice(hosts) if hosts else None

    def _hit(self, kind: str, sig: int) -> Fault | None:
        h = self._victim()
        if h is None or not h.signal(sig):
            return None
        self.hits[h.worker] = self.hits.get(h.worker, 0) + 1
        f = Fault(
            kind,
            time.monotonic(),
            time.time(),
            worker=h.worker,
            pid=h.pid,
            detail=f"incarnation {h.incarnation}",
        )
        f.end = f.t
        self.faults.append(f)
        if kind == "stop-host":
            self.stopped.append((h, f.t + self.rng.uniform(*self.limits.stop_for_s), f))
        return f

    def kill_host(self) -> None:
        self._hit("kill-host", signal.SIGKILL)

    def stop_host(self) -> None:
        self._hit("stop-host", signal.SIGSTOP)

    def _continue_due(self, now: float) -> None:
        for item in [x for x in self.stopped if x[1] <= now]:
            h, _, f = item
            h.signal(signal.SIGCONT)  # a no-op if pearld killed it meanwhile
            f.end = time.monotonic()
            self.stopped.remove(item)

    # -- pearld -------------------------------------------------------------------------------

    def _check_log(self, when: str) -> None:
        for attempt in range(5):
            try:
                lost = lost_events(self.d.state, dict(self.acked()), set(self.published()))
                self.lost.update(f"{x} ({when})" for x in lost)
                return
            except Exception as e:  # a live log's tail may be mid-write: read again
                if attempt == 4:
                    self.errors.append(f"log check {when}: {type(e).__name__}: {e}")
                time.sleep(0.2)

    def kill_pearld(self) -> None:
        with self.lock:
            self.down.set()
            f = Fault("kill-pearld", time.monotonic(), time.time(), detail=f"start {self.d.starts}")
            self.faults.append(f)
            self.d.kill9()
            self._check_log("after SIGKILL")
            try:
                with self._log() as log:
                    validate(log.load().state)
            except Exception as e:
                self.invalid.append(f"after kill {self.count('kill-pearld')}: {e}")
            time.sleep(self.rng.uniform(*self.limits.down_for_s))
            self._restart(f)

    @contextlib.contextmanager
    def _log(self) -> Any:
        from pearl.log import FileLog

        with FileLog(self.d.state / "log", readonly=True) as log:
            yield log

    def _restart(self, f: Fault) -> None:
        took = self.d.start()
        self.restart_s.append(took)
        f.end = time.monotonic()
        self.hits = {}
        self.down.clear()
        self._check_log("after restart")

    def _watch_pearld(self) -> None:
        """pearld stopped without being killed (e.g. an actor kept failing): note and restart."""
        with self.lock:
            if self.d.running() or self.d.proc is None:
                return
            rc = self.d.proc.returncode
            f = Fault(
                "pearld-exit", time.monotonic(), time.time(), detail=f"exit {rc}: {self.d.tail(5)}"
            )
            self.faults.append(f)
            self.down.set()
            self._restart(f)


__all__ = ["Fault", "Injector", "Limits"]
