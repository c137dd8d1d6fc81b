"""Which worker a turn goes to (§4.1.1, the Pipeline Scheduler's dispatch), as a pure function.

The Router (``actors/router.py``) keeps the state: each worker's requests in flight, each
trajectory's last worker (its *home*: it holds the trajectory's prefix resident, so only the
turn's new tokens are prefilled there) and the lent workers. It asks :func:`choose_worker` where a
turn goes and remembers the answer as the trajectory's new home.

The rule is cache-aware, as SGLang's and vLLM's routers are: a turn goes home unless home has
more than ``AFFINITY_SLACK`` requests more than the least-loaded worker and more than
``AFFINITY_RATIO`` times as many, in which case the least-loaded worker takes it (every hop
re-prefills the whole context; a worker a little busier still serves the turn sooner). Lent
workers (on the trainer's GPUs) serve the critical path alone, unless nothing else is routable; a
critical turn leaves home for any less loaded worker (a decode iteration's cost grows with its
batch; the move's re-prefill is paid within the turn).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import NamedTuple

AFFINITY_SLACK = 2  # requests a trajectory's worker may have beyond the least-loaded one
AFFINITY_RATIO = 1.5  # ... and times as many (off the critical path) before a turn leaves it


class Choice(NamedTuple):
    """Where a turn goes; ``affine``: it went home over a less loaded worker."""

    worker: int
    affine: bool = False


def choose_worker(
    pool: Sequence[int],
    load: Mapping[int, int],
    *,
    home: int | None = None,
    lent: Collection[int] = (),
    critical: bool = False,
) -> Choice:
    """The least-loaded worker of ``pool`` (lowest id on ties), or ``home`` when it is in the
    pool and not overloaded next to it (:func:`leaves_home`). A turn off the critical path goes
    to a ``lent`` worker only if the pool has nothing else. ``load``: requests in flight by
    worker (absent: none). ``pool`` must not be empty."""
    if not pool:
        raise ValueError("choose_worker needs at least one worker in the pool")
    if not critical:
        pool = [w for w in pool if w not in lent] or pool
    least = min(pool, key=lambda w: (load.get(w, 0), w))
    if home is None or home == least or home not in pool:
        return Choice(least)
    if leaves_home(load.get(home, 0), load.get(least, 0), critical=critical):
        return Choice(least)
    return Choice(home, affine=True)


def leaves_home(home_load: int, least_load: int, *, critical: bool = False) -> bool:
    """Whether a turn leaves its trajectory's worker (``home_load`` requests in flight) for the
    least-loaded one: only when home has more than the slack beyond it (``AFFINITY_SLACK``; none
    on the critical path) and, off the critical path, more than ``AFFINITY_RATIO`` times as many
    (the rule of SGLang's and vLLM's cache-aware routers)."""
    slack = 0 if critical else AFFINITY_SLACK
    if home_load <= least_load + slack:
        return False
    return critical or home_load > AFFINITY_RATIO * least_load


__all__ = ["AFFINITY_RATIO", "AFFINITY_SLACK", "Choice", "choose_worker", "leaves_home"]
