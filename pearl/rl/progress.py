"""What the Pipeline Scheduler works out from its own records, as pure functions: when the next
batch is due (the borrowing gate's view of a training-idle window) and what a batch ran with
(B_flight and the active workers by role, for the Runtime Tracker).

:class:`pearl.rl.pipeline.Pipeline` keeps the records (running groups, latencies seen, occupancy
samples) and calls these; tests give them the records directly.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Iterable, Sequence
from typing import NamedTuple

Workers = tuple[int, int, int]  # rollout workers by role: colocated, prefill, decode
ROLES = ("colocated", "prefill", "decode")


class Sample(NamedTuple):
    """One look at the pipeline (ten a second): when, trajectories in flight, active rollout
    workers by role, and of them the lent ones (on the trainer's GPUs) by role."""

    at: float
    in_flight: int
    workers: Workers
    lent: Workers


def expected_left(latencies: Sequence[float], elapsed: float) -> float:
    """The median time left of a group that has run ``elapsed`` s, over the (sorted) latencies
    of groups seen finish that took longer; inf (no bound) if none did."""
    longer = latencies[bisect.bisect_right(latencies, elapsed) :]
    return statistics.median(longer) - elapsed if longer else math.inf


def next_batch_eta(missing: int, ran: Iterable[float], latencies: Iterable[float]) -> float | None:
    """Seconds until a batch that misses ``missing`` groups is complete: 0 when it misses none;
    None when it cannot be foreseen.

    ``ran``: how long each running group has run; ``latencies``: start-to-finish seconds of the
    latest groups seen finish. A running group that has run e seconds is expected to need the
    median of L - e over the latencies L > e; the batch is complete when the ``missing``-th
    running group finishes. A group that has run longer than every group seen (a straggler, or
    one slowed by a worker leaving) has no such bound, and neither does the batch if it needs
    that group; nor does a batch that needs groups not started yet, or before any group finished.
    """
    if missing <= 0:
        return 0.0
    seen = sorted(latencies)
    ran = list(ran)
    if not seen or len(ran) < missing:
        return None
    eta = sorted(expected_left(seen, e) for e in ran)[missing - 1]
    return None if eta == math.inf else eta


def batch_occupancy(
    samples: Iterable[Sample], t0: float, t1: float, critical_from: float, last: Sample
) -> tuple[float, dict[str, float]]:
    """The mean trajectories in flight (B_flight) and active workers by role over a batch's span
    ``[t0, t1]``, from the samples taken in it (``last``, the pipeline now, if the span is
    shorter than one sample period).

    Lent workers serve only the critical path (the Router): they count for the batch only from
    ``critical_from``, when the batch before it was handed out and it became the one waited for.
    """
    span = [s for s in samples if t0 <= s.at <= t1] or [last]
    in_flight = sum(s.in_flight for s in span) / len(span)
    workers = {
        role: sum(s.workers[i] - (s.lent[i] if s.at < critical_from else 0) for s in span)
        / len(span)
        for i, role in enumerate(ROLES)
    }
    return in_flight, workers


__all__ = ["ROLES", "Sample", "Workers", "batch_occupancy", "expected_left", "next_batch_eta"]
