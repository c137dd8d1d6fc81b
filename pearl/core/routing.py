"""Which worker a turn goes to (§4.1.1, the Pipeline Scheduler's dispatch), as a pure function.

The Router (``actors/router.py``) keeps the state: each worker's requests in flight, each
trajectory's last worker (its *home*: it holds the trajectory's prefix resident, so only the
turn's new tokens are prefilled there) and the lent workers. It asks :func:`choose_worker` where a
turn goes and remembers the answer as the trajectory's new home.

A turn goes home unless leaving pays (:func:`leaves_home`). With a fitted profile
(:class:`MoveCost`, from eq. 1's terms) a move pays when the time it saves the turn exceeds the
re-prefill it costs: each request fewer in flight beside it saves the turn ``b`` per decode
iteration (``r`` of them) and a share of the prefill ahead of it, while the new worker must
prefill the turn's whole resident context again (``t_prefill`` a token). A difference of one
request never moves a turn (arrival order alone makes it). Before a profile is known the rule
is cache-aware, as SGLang's and vLLM's routers are: a turn leaves home only when home has more
than ``AFFINITY_SLACK`` requests more than the least-loaded worker and more than
``AFFINITY_RATIO`` times as many; a critical turn leaves for any less loaded worker. Lent workers
(on the trainer's GPUs) serve the critical path alone, unless nothing else is routable.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping, Sequence
from typing import NamedTuple

AFFINITY_SLACK = 2  # requests a trajectory's worker may have beyond the least-loaded one
AFFINITY_RATIO = 1.5  # ... and times as many (off the critical path) before a turn leaves it


class MoveCost(NamedTuple):
    """What moving one turn off its home trades, in seconds (:func:`move_cost`)."""

    per_request_s: float  # the turn's time each request in flight beside it adds
    reprefill_s: float  # prefilling the turn's resident context again on another worker


def move_cost(
    *, A: float, b: float, r: float, t_prefill: float, prefill_per_turn: float, context: int
) -> MoveCost:
    """Eq. 1's terms for one turn of ``context`` prompt tokens: a request beside it costs the
    turn ``b`` in each of its ``r`` decode iterations and its own turn's prefill
    (``prefill_per_turn * t_prefill``); off home, the ``context`` tokens home holds resident
    (all but the turn's new ones) are prefilled again. ``A``, the iteration's fixed cost, is
    paid wherever the turn runs."""
    del A  # the same on every worker: it never decides a move
    resident = max(0.0, context - prefill_per_turn)
    return MoveCost(
        per_request_s=r * b + prefill_per_turn * t_prefill, reprefill_s=resident * t_prefill
    )


def hashed_home(key: str, pool: Sequence[int]) -> int:
    """The worker of ``pool`` that rendezvous hashing gives ``key`` (a session): the one whose
    hash with the key is highest. Any process computes the same worker from the same pool, in
    any order, and a worker that leaves the pool moves only the keys it held. ``pool`` must not
    be empty."""
    if not pool:
        raise ValueError("hashed_home needs at least one worker in the pool")

    def score(worker: int) -> bytes:
        return hashlib.blake2b(f"{worker}\x00{key}".encode(), digest_size=8).digest()

    return max(pool, key=lambda w: (score(w), w))


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
    cost: MoveCost | None = None,
) -> Choice:
    """The least-loaded worker of ``pool`` (lowest id on ties), or ``home`` when it is in the
    pool and leaving it does not pay (:func:`leaves_home`, by ``cost`` where known). A turn off
    the critical path goes to a ``lent`` worker only if the pool has nothing else. ``load``:
    requests in flight by worker (absent: none). ``pool`` must not be empty."""
    if not pool:
        raise ValueError("choose_worker needs at least one worker in the pool")
    if not critical:
        pool = [w for w in pool if w not in lent] or pool
    least = min(pool, key=lambda w: (load.get(w, 0), w))
    if home is None or home == least or home not in pool:
        return Choice(least)
    if leaves_home(load.get(home, 0), load.get(least, 0), critical=critical, cost=cost):
        return Choice(least)
    return Choice(home, affine=True)


def leaves_home(
    home_load: int, least_load: int, *, critical: bool = False, cost: MoveCost | None = None
) -> bool:
    """Whether a turn leaves its trajectory's worker (``home_load`` requests in flight) for the
    least-loaded one. With ``cost``: when home has at least two requests more and the time
    they cost the turn exceeds the re-prefill (critical or not). Without: only when home has
    more than the slack beyond it (``AFFINITY_SLACK``; none on the critical path) and, off the
    critical path, more than ``AFFINITY_RATIO`` times as many (the rule of SGLang's and vLLM's
    cache-aware routers)."""
    if cost is not None:
        extra = home_load - least_load
        return extra >= 2 and extra * cost.per_request_s > cost.reprefill_s
    slack = 0 if critical else AFFINITY_SLACK
    if home_load <= least_load + slack:
        return False
    return critical or home_load > AFFINITY_RATIO * least_load


__all__ = [
    "AFFINITY_RATIO",
    "AFFINITY_SLACK",
    "Choice",
    "MoveCost",
    "choose_worker",
    "hashed_home",
    "leaves_home",
    "move_cost",
]
