"""A routed request's bookkeeping in the Router: where it runs, its attempts, and its clock.

Retries have a clock, not a count. A request may wait for a worker up to its ``wait_s`` (the
Route's, else the Router's: ``gateway.request_timeout_s``) from the moment it was routed, retries
included; a request with nowhere to go waits until workers are routable again, and a retryable
failure (the KV never arrived, the worker was leaving, its server is being relaunched, its host
died) is routed again after a back-off that doubles per attempt (none for the first: a gone worker
is replaced at once) up to ``MAX_BACKOFF_S``, so nothing retries in a tight loop. Past its time a
request fails with ``retry_after_s`` set (the gateway's 503 with ``Retry-After``). A refusal of the
request itself (``refused``: the server's 4xx) is final at once, and so is a request that no
engine takes or that cannot be encoded for a worker host (``check_request``: an id or a seed
beyond 64 bits, text that is not UTF-8), refused before it reaches any.

Each attempt travels under its own engine rid (``rid~k``, :meth:`Pending.wire`) so that a late
answer of an attempt given up on can never be taken for the current one. Plain records and
functions, no I/O: :class:`actors.router.Router` sends, logs and replies.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from actors.messages import Route
from pearl.engines.base import GenerateRequest

WAIT_S = 120.0  # how long a request may wait for a worker when neither it nor the daemon says
FIRST_BACKOFF_S = 0.25  # the wait before a request's second retry; doubled per attempt ...
MAX_BACKOFF_S = 4.0  # ... up to this
RETRY_AFTER_S = 5.0  # what a request that found no worker in its time is told to wait


def backoff_s(attempt: int) -> float:
    """How long retry ``attempt`` (1 = the first) waits before it is routed: 0, then
    ``FIRST_BACKOFF_S`` doubled per attempt up to ``MAX_BACKOFF_S``."""
    if attempt <= 1:
        return 0.0
    return min(MAX_BACKOFF_S, FIRST_BACKOFF_S * 2.0 ** min(attempt - 2, 16))


@dataclass
class Pending:
    """One routed request until it is answered."""

    route: Route
    attempt: int = 0
    workers: tuple[int, ...] = ()  # where it runs now; the last one answers
    original: GenerateRequest | None = None
    prefilled: bool = False  # the prefill half of this attempt answered: its KV has left
    sent_at: float = 0.0  # wall clock when this attempt was dispatched
    migrating: bool = False  # this attempt was aborted off a leaving worker
    deadline: float = float("inf")  # Router clock: past it, the request fails (no worker came)
    not_before: float = 0.0  # Router clock: a retry waits for its back-off until then
    why: str = ""  # why it was last routed again (said when it runs out of time)
    avoid: set[int] = field(default_factory=set)  # workers that turned it away (relaunching)

    def wire(self, rid: str) -> str:
        """The engine rid of the current attempt."""
        return rid if self.attempt == 0 else f"{rid}~{self.attempt}"

    def wires(self, rid: str) -> list[str]:
        """The engine rids of every retried attempt so far (not the first: it is ``rid``)."""
        return [f"{rid}~{k}" for k in range(1, self.attempt + 1)]

    def again(self, why: str, now: float) -> None:
        """A new attempt, on no worker yet, routable after its back-off from ``now``."""
        self.attempt += 1
        self.workers = ()
        self.not_before, self.why = now + backoff_s(self.attempt), why


__all__ = [
    "FIRST_BACKOFF_S",
    "MAX_BACKOFF_S",
    "RETRY_AFTER_S",
    "WAIT_S",
    "Pending",
    "backoff_s",
]
