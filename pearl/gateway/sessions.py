"""Gateway sessions measured as trajectories, so that the Runtime Tracker fits PEARL's model on
gateway-only traffic as it does on the rollout pipeline's.

A session (``X-Session-ID``) is one trajectory: each request is a turn. Per session the book
keeps its turns, the prompt tokens each turn added beyond the previous turn's context, the tokens
generated, the prompt tokens the engines really prefilled, and the environment time: the gap
between one response and the session's next request. A request without a session is a
one-turn trajectory of its own.

A session ends when no request of it ran for ``idle_s``, or at a trainer step boundary
(:meth:`SessionBook.boundary`, on ``training-begin``) when none of its requests is running.
Every ``per_step`` ended sessions, and at each boundary that ended any, make one rollout step:
:meth:`SessionBook.take_step` hands its :class:`RolloutStep`, the pipeline's message.

A session id is at most :data:`MAX_SESSION_BYTES` bytes of UTF-8 (the gateway refuses a longer
one before it reaches the book). An ended session leaves the open sessions at once; only the
last :data:`RECENT` ended ones are kept, for inspection.

Every call costs O(1) amortised, however many sessions are open: idle sessions are kept in the
order their last request ended (the clock never goes back), so expiry pops them from the front.
Only :meth:`SessionBook.boundary` walks the idle sessions, once per trainer step.

The clock is the caller's (``time.monotonic`` unless a test passes one); the book is not
thread-safe on its own: its owner holds one lock around it.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from actors.messages import RolloutStep
from pearl.core.profile import TrajectoryStats

RECENT = 256  # ended sessions kept for inspection (status, tests)
MAX_SESSION_BYTES = 256


def session_problem(session: str) -> str | None:
    """Why ``session`` cannot name a session (too long), or None."""
    size = len(session.encode("utf-8", "surrogatepass"))
    if size > MAX_SESSION_BYTES:
        return f"a session id is at most {MAX_SESSION_BYTES} bytes (UTF-8); this one has {size}"
    return None


@dataclass
class Session:
    """One session's measured turns so far."""

    key: str
    started: float
    turns: int = 0
    new_tokens: int = 0
    generated_tokens: int = 0
    prefilled_tokens: int = 0
    env_s: float = 0.0
    decode_steps: int = 0
    decode_batch_sum: int = 0
    context: int = 0  # prompt + generated tokens of its latest turn
    running: int = 0  # its requests in flight
    last_end: float | None = None  # when its latest response ended
    workers: list[int] = field(default_factory=list)  # the worker of each attempt, in order

    def stats(self) -> TrajectoryStats:
        end = self.last_end if self.last_end is not None else self.started
        seen = self.decode_batch_sum / self.decode_steps if self.decode_steps else None
        return TrajectoryStats(
            turns=self.turns,
            new_tokens=self.new_tokens,
            generated_tokens=self.generated_tokens,
            env_s=self.env_s,
            prefilled_tokens=self.prefilled_tokens,
            seen_batch=seen,
            latency_s=max(0.0, end - self.started),
        )


class SessionBook:
    """Open sessions, and those ended but not yet handed out as a rollout step (see the module)."""

    def __init__(
        self,
        per_step: int = 8,
        idle_s: float = 60.0,
        clock: Callable[[], float] | None = None,
    ) -> None:
        import time

        if per_step < 1:
            raise ValueError("per_step must be >= 1")
        self.per_step, self.idle_s = per_step, idle_s
        self.clock = clock or time.monotonic
        self.open: dict[str, Session] = {}
        self.ended: list[Session] = []
        self.steps = itertools.count(1)
        self.stepped = 0  # rollout steps handed out
        self._anonymous = itertools.count(1)
        self._due = False  # a boundary asked for a step
        self.recent: deque[Session] = deque(maxlen=RECENT)  # the latest ended sessions
        # Open sessions with no request running, in the order their last request ended.
        self._idle: OrderedDict[str, None] = OrderedDict()

    def begin(self, session: str, prompt_tokens: int) -> str:
        """A request of ``session`` starts with a prompt of ``prompt_tokens``: its key."""
        now = self.clock()
        self.expire(now)
        key = session or f"~{next(self._anonymous)}"
        s = self.open.get(key)
        if s is None:
            s = self.open[key] = Session(key, now)
        elif s.last_end is not None and not s.running:
            s.env_s += max(0.0, now - s.last_end)
            self._idle.pop(key, None)
        s.turns += 1
        # A prompt that extends the previous context adds the difference; any other starts anew.
        grew = s.context <= prompt_tokens
        s.new_tokens += prompt_tokens - s.context if grew else prompt_tokens
        s.running += 1
        return key

    def attempt(
        self,
        key: str,
        worker: int,
        generated: int,
        prompt_tokens: int,
        cached_tokens: int,
        decode_steps: int = 0,
        decode_batch_sum: int = 0,
    ) -> None:
        """One attempt of a request of ``key`` answered on ``worker``."""
        s = self.open.get(key)
        if s is None:
            return
        s.workers.append(worker)
        s.generated_tokens += generated
        s.prefilled_tokens += max(0, prompt_tokens - cached_tokens)
        s.decode_steps += decode_steps
        s.decode_batch_sum += decode_batch_sum

    def end(self, key: str, prompt_tokens: int, generated: int) -> None:
        """A request of ``key`` ended (answered or failed); anonymous sessions end with it."""
        s = self.open.get(key)
        if s is None:
            return
        s.running = max(0, s.running - 1)
        s.last_end = self.clock()
        s.context = prompt_tokens + generated
        if key.startswith("~"):
            self._close(key)
        elif not s.running:
            self._idle.pop(key, None)
            self._idle[key] = None  # the latest to end: the back of the line

    def boundary(self) -> None:
        """A trainer step boundary: idle sessions end, and a step is due if any ended."""
        while self._idle:
            self._close(next(iter(self._idle)))
        self._due = True

    def expire(self, now: float | None = None) -> None:
        """Sessions idle for ``idle_s`` end (the front of the idle line, oldest first)."""
        now = self.clock() if now is None else now
        while self._idle:
            key = next(iter(self._idle))
            last = self.open[key].last_end
            if last is not None and now - last < self.idle_s:
                return
            self._close(key)

    def take_step(self) -> RolloutStep | None:
        """The next rollout step, when ``per_step`` sessions ended or a boundary asked for one."""
        self.expire()
        if not self.ended:
            self._due = False
            return None
        if len(self.ended) < self.per_step and not self._due:
            return None
        done = self.ended if self._due else self.ended[: self.per_step]
        self.ended = self.ended[len(done) :]
        self._due = False
        first = min(s.started for s in done)
        last = max(s.last_end if s.last_end is not None else s.started for s in done)
        makespan = max(last - first, 1e-9)
        trajectories = tuple(s.stats() for s in done)
        busy = sum(t.latency_s or 0.0 for t in trajectories)
        self.stepped += 1
        return RolloutStep(
            step=next(self.steps),
            trajectories=trajectories,
            makespan_s=makespan,
            in_flight=busy / makespan,
        )

    def _close(self, key: str) -> None:
        s = self.open.pop(key)
        self._idle.pop(key, None)
        if s.turns and s.last_end is not None:
            self.ended.append(s)
            self.recent.append(s)


__all__ = ["MAX_SESSION_BYTES", "Session", "SessionBook", "session_problem"]
