"""The simulator's event queue: (time, sequence) ordered, with lazy invalidation by version."""

from __future__ import annotations

import heapq
from typing import Any

# Event kinds, dispatched by the runner.
WORKER = 0  # a worker's next internal completion (prefill or decode)
ENV = 1  # a trajectory's environment step finished
XFER = 2  # the next KV transfer completion
UNPAUSE = 3  # router admission pause (expansion finalization) ends
STEP = 4  # an executor finished a plan step
AVAIL = 5  # preemptible GPU availability changes
TRAIN = 6  # a training step finished
TICK = 7  # periodic controller tick
END = 8  # end of the simulated window
PAUSE = 9  # an expansion's finalization starts: admission pauses
UNSTALL = 10  # a worker finished loading a published weight version


class Clock:
    """A min-heap of ``(t, seq, kind, obj, version)``; ``seq`` breaks ties in insertion order."""

    __slots__ = ("now", "_heap", "_seq")

    def __init__(self, start: float = 0.0) -> None:
        self.now = start
        self._heap: list[tuple[float, int, int, Any, int]] = []
        self._seq = 0

    def at(self, t: float, kind: int, obj: Any = None, version: int = 0) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t if t > self.now else self.now, self._seq, kind, obj, version))

    def pop(self) -> tuple[float, int, Any, int] | None:
        if not self._heap:
            return None
        t, _, kind, obj, version = heapq.heappop(self._heap)
        self.now = t
        return t, kind, obj, version

    def __len__(self) -> int:
        return len(self._heap)


__all__ = [
    "AVAIL",
    "END",
    "ENV",
    "PAUSE",
    "STEP",
    "TICK",
    "TRAIN",
    "UNPAUSE",
    "UNSTALL",
    "WORKER",
    "XFER",
    "Clock",
]
