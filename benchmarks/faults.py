"""The chaos run's fault injector: SIGKILL and SIGSTOP (then SIGCONT) of worker hosts, SIGKILL of
pearld (then a restart on the same state dir), disk-full windows (pearld's log disk full or failing
its syncs for a few seconds, through the ``PEARL_DISK_FAULT`` flag file), and floods of idle
connections to the metrics port, each at random moments, bounded in count. With a gateway, also
the faults of an outside HTTP client (:mod:`gateway_faults`): poison requests, slow clients that
send half a request and stop, and requests abandoned by their clients.

Every fault is recorded with its start and end (SIGCONT, pearld answering again), so that the
run can tell the deaths and slow returns it caused from the ones it did not. After each pearld
kill the log is checked, before the restart and again once pearld answers: every event the
daemon acknowledged must be in it.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gateway_faults as gw
from live_pearld import Host, Pearld, lost_events

from pearl.core.state import validate
from pearl.log.failpoints import DISK_ENV


@dataclass
class Fault:
    # kill-host | stop-host | kill-pearld | pearld-exit (pearld stopped on its own) | disk-full |
    # metrics-flood | poison | slow-clients | abandon
    kind: str
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
    disk_full_s: float = 30.0
    max_disk_full: int = 10
    disk_full_for_s: tuple[float, float] = (1.0, 4.0)
    metrics_flood_s: float = 40.0
    max_metrics_flood: int = 6
    flood_connections: int = 1000
    poison_s: float = 15.0
    max_poison: int = 8
    slow_clients_s: float = 30.0
    max_slow_clients: int = 4
    slow_connections: int = 1500
    slow_hold_s: float = 3.0
    abandon_s: float = 20.0
    max_abandon: int = 6
    abandoned: int = 16  # requests hung up on per fault
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
        gateway_url: str = "",
    ) -> None:
        super().__init__(name="chaos-faults", daemon=True)
        self.gateway_url = gateway_url
        self.poison_answers: list[str] = []  # poison requests not answered with a 4xx
        self.poison_sent = 0
        self.slow: list[dict[str, Any]] = []  # each slow-clients fault's figures
        self.abandoned = 0
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
        flag = d.env.get(DISK_ENV)  # pearld started with a disk-fault flag file: windows
        self.disk_flag = Path(flag) if flag else None
        self.flood_threads: list[int] = []  # pearld threads added while a flood held
        self.flood_served: list[int | None] = []  # connections served, said by a scrape
        # The first of the rarer faults come early enough for a one-minute run to have one.
        self.due = {
            "kill-host": now + rng.expovariate(1 / lim.kill_host_s),
            "stop-host": now + rng.expovariate(1 / lim.stop_host_s),
            "kill-pearld": now + rng.uniform(0.25, 0.6) * min(span, lim.kill_pearld_s),
            "disk-full": now + rng.uniform(0.1, 0.2) * min(span, lim.disk_full_s),
            "metrics-flood": now + rng.uniform(0.6, 0.7) * min(span, lim.metrics_flood_s),
            "poison": now + rng.uniform(0.05, 0.15) * min(span, lim.poison_s),
            "slow-clients": now + rng.uniform(0.3, 0.45) * min(span, lim.slow_clients_s),
            "abandon": now + rng.uniform(0.15, 0.3) * min(span, lim.abandon_s),
        }

    def count(self, kind: str) -> int:
        return sum(f.kind == kind for f in self.faults)

    def run(self) -> None:
        lim = self.limits
        caps = {
            "kill-host": lim.max_kill_host,
            "stop-host": lim.max_stop_host,
            "kill-pearld": lim.max_kill_pearld,
            "disk-full": lim.max_disk_full if self.disk_flag else 0,
            "metrics-flood": lim.max_metrics_flood if self.d.metrics_port else 0,
            "poison": lim.max_poison if self.gateway_url else 0,
            "slow-clients": lim.max_slow_clients if self.gateway_url else 0,
            "abandon": lim.max_abandon if self.gateway_url else 0,
        }
        means = {
            "kill-host": lim.kill_host_s,
            "stop-host": lim.stop_host_s,
            "kill-pearld": lim.kill_pearld_s,
            "disk-full": lim.disk_full_s,
            "metrics-flood": lim.metrics_flood_s,
            "poison": lim.poison_s,
            "slow-clients": lim.slow_clients_s,
            "abandon": lim.abandon_s,
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
        if self.disk_flag is not None:
            self.disk_flag.unlink(missing_ok=True)

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

    # -- the disk and the metrics port -------------------------------------------------------

    def disk_full(self) -> None:
        """pearld's log disk is full (or fails its syncs) for a few seconds, then heals; pearld
        must stay up, refuse events with the reason meanwhile, and take them again after."""
        assert self.disk_flag is not None
        how = self.rng.choice(("full", "full", "full", "eio"))
        f = Fault("disk-full", time.monotonic(), time.time(), detail=how)
        self.faults.append(f)
        self.disk_flag.write_text(how)
        self.halt.wait(self.rng.uniform(*self.limits.disk_full_for_s))
        self.disk_flag.unlink(missing_ok=True)
        f.end = time.monotonic()

    def metrics_flood(self) -> None:
        """Hold many idle TCP connections to the metrics port, as an unauthenticated client
        can: pearld's threads must stay bounded and a scrape must still be answered."""
        port = self.d.metrics_port
        if not port or self.d.proc is None or not self.d.running():
            return
        f = Fault("metrics-flood", time.monotonic(), time.time())
        self.faults.append(f)
        pid = self.d.proc.pid
        before = self._threads(pid)
        held: list[socket.socket] = []
        try:
            for _ in range(self.limits.flood_connections):
                c = socket.socket()
                c.settimeout(2.0)
                try:
                    c.connect(("127.0.0.1", port))
                except OSError:
                    c.close()
                    break  # refused or the backlog is full: the cap at work
                held.append(c)
            self.halt.wait(1.0)
            self.flood_threads.append(max(0, self._threads(pid) - before))
            self.flood_served.append(scrape(port))
        finally:
            for c in held:
                c.close()
        f.end = time.monotonic()
        f.detail = (
            f"{len(held)} connections held, {self.flood_served[-1]} served, "
            f"+{self.flood_threads[-1]} threads"
        )

    # -- the gateway (an outside client's faults) ---------------------------------------------

    def _gateway_up(self) -> bool:
        return bool(self.gateway_url) and self.d.running() and not self.down.is_set()

    def poison(self) -> None:
        """Requests that once crashed pearld or a host, or failed their neighbours: each must
        get a 4xx while everything else goes on."""
        if not self._gateway_up():
            return
        f = Fault("poison", time.monotonic(), time.time())
        self.faults.append(f)
        sent, bad = gw.poison(self.gateway_url, self.rng)
        self.poison_sent += sent
        if self._gateway_up():  # a pearld killed meanwhile answers nothing: not poison's doing
            self.poison_answers += bad
        f.end = time.monotonic()
        f.detail = f"{sent} sent, {len(bad)} not a 4xx"

    def slow_clients(self) -> None:
        """Half-sent requests held open: pearld's API and the gateway's agents go on."""
        if not self._gateway_up():
            return
        f = Fault("slow-clients", time.monotonic(), time.time())
        self.faults.append(f)
        port = int(self.gateway_url.rsplit(":", 1)[1].split("/", 1)[0])

        def probe() -> bool:
            try:
                return bool(self.d.status())
            except Exception:
                return False

        lim = self.limits
        out = gw.slow_clients(port, lim.slow_connections, lim.slow_hold_s, self.halt, probe)
        out["fds"] = fds(self.d.proc.pid) if self.d.proc is not None else 0
        self.slow.append(out)
        f.end = time.monotonic()
        f.detail = json.dumps(out)

    def abandon(self) -> None:
        """Long requests whose clients hang up at once."""
        if not self._gateway_up():
            return
        f = Fault("abandon", time.monotonic(), time.time())
        self.faults.append(f)
        n = gw.abandon(self.gateway_url, self.limits.abandoned)
        self.abandoned += n
        f.end = time.monotonic()
        f.detail = f"{n} requests hung up on"

    def _threads(self, pid: int) -> int:
        """pearld's thread count, the median of five looks 0.1 s apart: its other threads
        (a courier per worker host) come and go meanwhile."""
        looks = []
        for _ in range(5):
            looks.append(threads(pid))
            self.halt.wait(0.1)
        return sorted(looks)[2]

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


def threads(pid: int) -> int:
    """The thread count of ``pid`` (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Threads:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def fds(pid: int) -> int:
    """The open file descriptors of ``pid`` (0 when it is gone)."""
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def scrape(port: int) -> int | None:
    """One Prometheus scrape of the metrics port: the connections pearld says it serves (its
    ``pearl_metrics_connections``, one thread each), None when it did not answer."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            text = r.read().decode()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("pearl_metrics_connections "):
            return int(float(line.split()[1]))
    return None


__all__ = ["Fault", "Injector", "Limits", "fds", "scrape", "threads"]
