"""Virtual devices: a CPU slot that stands for an accelerator of fixed compute throughput.

On the CPU demo every "GPU" is a process on the same few cores, so adding workers adds processes,
not compute. A :class:`VirtualDevice` gives a slot a fixed share of one core instead: it measures
the compute of each step with the thread's CPU time (``time.thread_time()``), then idles (sleeps)
in proportion, so that ``compute / (compute + idle) = share``: a step that took ``c`` seconds of
CPU lasts ``c / share`` seconds of wall time, the idle being whatever the compute left of it (when
other processes held the core, the compute took longer in wall time and the idle is shorter). With
one torch thread per slot and the shares of all slots adding up to less than the machine's cores,
k active slots give k times the throughput of one, as k accelerators would.

A step's CPU time is not only its work: after an idle the caches are cold, and a step that runs
at the same moment as another slot's on a shared core (a hyperthread sibling, the shared cache)
takes longer, so one slot's tokens/s moves from one second to the next where a device of fixed
throughput's does not (docs/results/demo.md has the figures). So a step that names its work
(``step(work=key)``; the torch engine passes its batch and context) feeds an estimate of the
host's current inflation: once a key has run ``WARM_RUNS`` times, each run's CPU time is divided
by the median of its last ``typical_window`` runs (the work's typical cost), and that ratio is
averaged (EMA, gain ``inflation_gain``) over all keys. Every keyed step is charged its CPU time
divided by the inflation: a slow second (or a fast one) of the host is not billed, and in
expectation the inflation is 1, so the device keeps the speed of the work's typical cost from
the first step to the last. (Not a per-key minimum: it falls with every run, so the device would
speed up over a run.) The inflation is held within ``INFLATION_RANGE``. The CPU really spent is
still counted (``compute_s``), next to what was charged (``charged_s``).

What this models: fixed per-device compute throughput (more devices, more throughput; a busy
device is slower than an idle one by exactly its queue). What it does not: memory bandwidth, KV
capacity (the engine's ``kv_budget_mb`` sets that), the interconnect (KV transfers and weight
loads run unthrottled), or a device's own parallelism beyond one thread.

No torch here: the torch engine and the demo trainer use this module; the config checks a
share with :func:`pearl.core.bounds.check_share` and :func:`~pearl.core.bounds.check_fits`.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections import deque
from collections.abc import Callable, Hashable, Iterator
from typing import TypeVar

from pearl.config import available_cores
from pearl.core.bounds import check_fits, check_share

T = TypeVar("T")

MIN_SLEEP_S = 0.001  # idle owed below this waits for the next step (sleep has ~50 us overhead)
MAX_CREDIT_S = 0.1  # steps slowed by other processes (or a late wake-up) are made up within this
TYPICAL_WINDOW = 64  # a work key's typical cost: the median CPU time of its last this many runs
WARM_RUNS = 8  # runs of a key before its typical cost is trusted
INFLATION_GAIN = 0.05  # EMA gain of CPU time / typical cost over keyed steps (~20 steps)
INFLATION_RANGE = (0.25, 4.0)  # beyond these the host is not noisy but another machine
MAX_WORK_KEYS = 4096  # work keys remembered (the oldest forgotten first)


def default_share(slots: int, cores: int, headroom: float = 0.9) -> float:
    """The largest share, in hundredths, that keeps all ``slots`` within ``headroom`` x cores."""
    if slots < 1:
        return 1.0
    return max(0.01, min(1.0, int(100 * headroom * cores / slots) / 100))


class VirtualDevice:
    """``share`` of one core, held by idling after each step in proportion to its compute.

    ``with device.step(): compute()`` (or ``device.run(fn)``) runs the compute at full speed on the
    calling thread, then sleeps until the step has lasted ``charged / share``, where ``charged``
    is the step's CPU time, or with ``step(work=key)`` its CPU time over the host's current
    inflation (see the module's doc). Idle owed below
    ``min_sleep_s`` is carried to the next step; a step that lasted longer (the core was busy
    with other processes, or the sleep woke late) is made up by the next steps' idle, up to
    ``max_credit_s``, so the device keeps its rate over a window. Time without work, outside
    any step, is never banked: a device does not get faster for having been idle.
    """

    def __init__(
        self,
        share: float,
        *,
        min_sleep_s: float = MIN_SLEEP_S,
        max_credit_s: float = MAX_CREDIT_S,
        typical_window: int = TYPICAL_WINDOW,
        inflation_gain: float = INFLATION_GAIN,
        cpu_clock: Callable[[], float] = time.thread_time,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.share = check_share(share)
        self.min_sleep_s, self.max_credit_s = min_sleep_s, max_credit_s
        self._cpu, self._clock, self._sleep = cpu_clock, clock, sleep
        self._owed = 0.0  # idle still to be taken (negative: overslept, credited)
        self._typical_window, self._gain = typical_window, inflation_gain
        self._runs: dict[Hashable, deque[float]] = {}  # work key -> CPU times of its last runs
        self.inflation = 1.0  # CPU time / typical cost, EMA over keyed steps
        self.compute_s = 0.0  # thread CPU time of the steps
        self.charged_s = 0.0  # the CPU time they were billed (compute over the inflation)
        self.idle_s = 0.0  # slept
        self.wall_s = 0.0  # the steps' wall time, idle included
        self.steps = 0

    @contextlib.contextmanager
    def step(self, work: Hashable | None = None) -> Iterator[None]:
        """Measure the thread CPU time of the block, then idle in proportion to what it is charged.

        ``work``: a key naming the step's work (equal keys, equal work); None charges the CPU
        time measured.
        """
        c0, t0 = self._cpu(), self._clock()
        try:
            yield
        finally:
            compute = max(0.0, self._cpu() - c0)
            charged = compute if work is None else self._charge(work, compute)
            self.compute_s += compute
            self.charged_s += charged
            self.steps += 1
            self._owed += charged / self.share - (self._clock() - t0)
            if self._owed >= self.min_sleep_s:
                t1 = self._clock()
                self._sleep(self._owed)
                slept = self._clock() - t1
                self.idle_s += slept
                self._owed -= slept
            self._owed = max(self._owed, -self.max_credit_s)
            self.wall_s += self._clock() - t0

    def _charge(self, work: Hashable, compute: float) -> float:
        """``compute`` over the inflation, which this run updates once ``work`` has a typical
        cost."""
        runs = self._runs.pop(work, None)  # re-inserted last: the dict runs least recent first
        if runs is None:
            runs = deque(maxlen=self._typical_window)
            if len(self._runs) >= MAX_WORK_KEYS:
                del self._runs[next(iter(self._runs))]
        runs.append(compute)
        self._runs[work] = runs
        if len(runs) >= min(WARM_RUNS, self._typical_window):
            typical = statistics.median(runs)
            if typical > 0.0:
                lo, hi = INFLATION_RANGE
                x = self.inflation + self._gain * (compute / typical - self.inflation)
                self.inflation = min(max(x, lo), hi)
        return compute / self.inflation

    def run(self, fn: Callable[[], T], work: Hashable | None = None) -> T:
        """``fn()`` as one step of this device."""
        with self.step(work):
            return fn()

    @property
    def utilization(self) -> float:
        """Charged device time / wall time of the steps so far: the share, unless other processes
        held the core for so long that a step's compute outlasted ``charged / share``."""
        return self.charged_s / self.wall_s if self.wall_s else 0.0


__all__ = [
    "VirtualDevice",
    "available_cores",
    "check_fits",
    "check_share",
    "default_share",
]
