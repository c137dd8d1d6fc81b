"""Generation through PEARL's Router for code outside the actors: one answer per request.

``RolloutClient(directory).generate(request)`` routes a request and returns a future of its
:class:`Completion`. A turn aborted off a leaving worker (reclaimed, under a notice, lent back
at Training Begin) comes back with the tokens it had generated: the client sends the rest again,
as prompt + prefix, to wherever the Router routes it now, and the caller sees one completion.

A request has one clock over all its attempts: ``wait_s`` from :meth:`generate`, the time it may
wait for a worker (each Route carries what is left of it, so the Router's own waiting for a worker
spends the same time). A turn that came back aborted with no tokens (its server died or failed
before the first one) resumes like any other, after a back-off that doubles per such turn in a
row, so a server that aborts everything at once is never retried in a tight loop. The future
fails with:

- :class:`~pearl.core.errors.RequestRefused` at once when the server refused the request itself
  (a 4xx): never retried;
- :class:`~pearl.core.errors.NoWorker` (with ``retry_after_s``) when no worker served it within
  ``wait_s``;
- EngineError when an error the Router gave up on came back more than ``retries`` times (each
  retry after a back-off).

``on_attempt`` hears each attempt that answered (its worker, tokens and version) as it ends, before
the next is sent: a streaming caller sees the completion grow across migrations. ``cancel(rid)``
aborts a request wherever it runs; its future then settles with what it had generated.
:meth:`reroute` sends every request in flight again after the Router restarted (pearld restarts
a failed actor; the Router's pending requests die with it).

The client is a :class:`actors.base.Ref` registered under its name, not an actor: the Router's
answers arrive on the Router's thread and only settle futures or resubmit.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import msgspec

from actors import names
from actors.base import DEFAULT_ASK_S, Directory
from actors.messages import AbortRequest, GenerateDone, Route
from actors.retries import RETRY_AFTER_S, WAIT_S, backoff_s
from pearl.core.errors import NoWorker, RequestRefused
from pearl.engines.base import EngineError, FinishReason, GenerateRequest, GenerateResult

log = logging.getLogger(__name__)


@dataclass
class Completion:
    """What one request generated, over all its attempts."""

    rid: str
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    # (index of the first token, weights version) for each attempt that generated tokens
    versions: list[tuple[int, int]] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    top_logprobs: list[tuple[tuple[int, float], ...]] = field(default_factory=list)  # per token
    resumed: int = 0  # times it was sent again with its prefix (migrations)
    recomputed_tokens: int = 0  # prompt tokens the resumed attempts prefilled (cache misses)
    errors: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Attempt:
    """One attempt that answered: what it generated on ``worker``. ``finish_reason`` is set on
    the request's last attempt only; ``recomputed_tokens`` counts this attempt's prompt tokens
    prefilled again because the request moved (0 on a first attempt)."""

    rid: str
    worker: int
    output_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    weights_version: int
    prompt_tokens: int
    cached_tokens: int
    recomputed_tokens: int
    resumed: int  # times the request was sent again before this attempt (migrations)
    finish_reason: FinishReason | None
    decode_steps: int = 0
    decode_batch_sum: int = 0
    top_logprobs: tuple[tuple[tuple[int, float], ...], ...] = ()  # per token, when asked


@dataclass
class _Call:
    request: GenerateRequest
    future: Future[Completion]
    out: Completion
    on_attempt: Callable[[Attempt], None] | None = None
    cancelled: bool = False
    deadline: float = float("inf")  # the client's clock: past it, no more waiting for a worker
    stalls: int = 0  # attempts in a row that ended with nothing (no tokens, or an error)


class Later:
    """Runs callables after a delay, in due order, on one daemon thread (not one per call: a
    pool of hundreds of requests backing off at once starts no thread each)."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._due: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None

    def __call__(self, delay_s: float, fn: Callable[[], None]) -> None:
        with self._cv:
            heapq.heappush(self._due, (time.monotonic() + delay_s, next(self._seq), fn))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="resend", daemon=True)
                self._thread.start()
            self._cv.notify()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._due or self._due[0][0] > time.monotonic():
                    self._cv.wait(self._due[0][0] - time.monotonic() if self._due else None)
                _, _, fn = heapq.heappop(self._due)
            try:
                fn()
            except Exception:  # one resend's failure is not the others'
                log.exception("a delayed resend failed")


_later = Later()


class RolloutClient:
    """A registered Ref that routes requests and resumes aborted ones (see the module).
    ``clock`` and ``later(delay_s, fn)`` (run ``fn`` after a delay) are injectable."""

    def __init__(
        self,
        directory: Directory,
        name: str = names.ROLLOUT_CLIENT,
        retries: int = 3,
        wait_s: float = WAIT_S,
        clock: Callable[[], float] = time.monotonic,
        later: Callable[[float, Callable[[], None]], None] = _later,
    ):
        self.name, self.directory, self.retries = name, directory, retries
        self.wait_s, self.clock, self.later = wait_s, clock, later
        self._lock = threading.Lock()
        self._calls: dict[str, _Call] = {}
        self.migrated = 0  # resumptions, all requests
        self.failed = 0  # requests whose future failed
        directory.register(self)

    def generate(
        self, request: GenerateRequest, on_attempt: Callable[[Attempt], None] | None = None
    ) -> Future[Completion]:
        """Route ``request``; ``on_attempt`` (called on the Router's thread) hears each attempt
        that answered, in order, before the future settles."""
        fut: Future[Completion] = Future()
        call = _Call(
            request=request, future=fut, out=Completion(request.rid), on_attempt=on_attempt
        )
        call.deadline = self.clock() + self.wait_s
        with self._lock:
            if request.rid in self._calls:
                raise EngineError(f"request {request.rid} is already in flight")
            self._calls[request.rid] = call
        self._send(call, request)
        return fut

    def cancel(self, rid: str) -> None:
        """Abort ``rid`` wherever it runs; it is not resumed, and its future settles with the
        tokens it had (or fails, when the abort came before it ran)."""
        with self._lock:
            call = self._calls.get(rid)
            if call is None:
                return
            call.cancelled = True
        self.directory.tell(names.ROUTER, AbortRequest(rid=rid))

    def close(self) -> None:
        self.directory.unregister(self.name, self)

    def reroute(self) -> None:
        """The Router was restarted and lost what it held: every request in flight is sent
        again from what it has (its prompt and the tokens of the attempts that answered), on
        its own clock. What the old Router had sent answers no one: workers answer the Router."""
        with self._lock:
            calls = [c for c in self._calls.values() if not c.cancelled]
        for call in calls:
            if not call.future.done():
                call.out.errors.append("the Router restarted; sent again")
                self._send(call, self._rest(call))

    # -- the Ref side: the Router's answers ------------------------------------------------------

    def tell(self, msg: Any) -> None:
        if isinstance(msg, GenerateDone):
            self._done(msg)

    def ask(self, msg: Any, timeout_s: float = DEFAULT_ASK_S) -> Any:
        self.tell(msg)
        return None

    def _send(self, call: _Call, request: GenerateRequest) -> None:
        left = call.deadline - self.clock()
        if left <= 0:
            why = call.out.errors[-1] if call.out.errors else "its attempts ended with nothing"
            self._settle(
                call,
                NoWorker(
                    f"{request.rid}: no worker served it within {self.wait_s:g} s ({why})",
                    RETRY_AFTER_S,
                ),
            )
            return
        self.directory.tell(names.ROUTER, Route(request=request, reply_to=self.name, wait_s=left))

    def _resend(self, call: _Call) -> None:
        """Send what is left of ``call`` again: at once after its first empty ending, else
        after a back-off that doubles per ending in a row (none once tokens come)."""
        delay = backoff_s(call.stalls)
        if delay <= 0:
            self._send(call, self._rest(call))
            return

        def again() -> None:
            if not call.future.done():
                self._send(call, self._rest(call))

        self.later(delay, again)

    def _done(self, msg: GenerateDone) -> None:
        with self._lock:
            call = self._calls.get(msg.rid)
        if call is None:
            return
        out, req = call.out, call.request
        if msg.result is None:
            out.errors.append(msg.error)
            if msg.refused:
                self._settle(call, RequestRefused(f"{msg.rid}: {msg.error}"))
            elif msg.retry_after_s > 0:
                self._settle(call, NoWorker(msg.error, msg.retry_after_s))  # names the rid
            elif call.cancelled or len(out.errors) > self.retries:
                self._settle(call, EngineError(f"{msg.rid}: {msg.error}"))
            else:
                call.stalls += 1
                self._resend(call)
            return
        r: GenerateResult = msg.result
        recomputed = 0
        if out.resumed and out.output_ids:
            recomputed = max(0, r.prompt_tokens - r.cached_tokens)
            out.recomputed_tokens += recomputed
        if r.output_ids:
            out.versions.append((len(out.output_ids), r.weights_version))
        out.output_ids += r.output_ids
        out.logprobs += r.logprobs
        out.top_logprobs += r.top_logprobs
        left = req.sampling.max_new_tokens - len(out.output_ids)
        resume = r.finish_reason is FinishReason.ABORT and left > 0 and not call.cancelled
        if not resume:
            out.finish_reason = r.finish_reason
        if call.on_attempt is not None:
            call.on_attempt(
                Attempt(
                    rid=msg.rid, worker=msg.worker, output_ids=r.output_ids, logprobs=r.logprobs,
                    weights_version=r.weights_version, prompt_tokens=r.prompt_tokens,
                    cached_tokens=r.cached_tokens, recomputed_tokens=recomputed,
                    resumed=out.resumed, finish_reason=out.finish_reason,
                    decode_steps=r.decode_steps, decode_batch_sum=r.decode_batch_sum,
                    top_logprobs=r.top_logprobs,
                )
            )  # fmt: skip
        if resume:
            out.resumed += 1
            with self._lock:
                self.migrated += 1
            call.stalls = 0 if r.output_ids else call.stalls + 1
            self._resend(call)
            return
        self._settle(call, None)

    def _rest(self, call: _Call) -> GenerateRequest:
        """The request for what is left: prompt + prefix, the tokens still to generate."""
        req, done = call.request, call.out.output_ids
        sampling = msgspec.structs.replace(
            req.sampling, max_new_tokens=req.sampling.max_new_tokens - len(done)
        )
        # ``generated``: the prefix is output, not prompt (a grammar resumes after it).
        return msgspec.structs.replace(
            req, input_ids=req.input_ids + tuple(done), sampling=sampling,
            generated=req.generated + len(done),
        )  # fmt: skip

    def _settle(self, call: _Call, error: Exception | None) -> None:
        with self._lock:
            self._calls.pop(call.request.rid, None)
            if error is not None:
                self.failed += 1
        if error is not None:
            call.future.set_exception(error)
        else:
            call.future.set_result(call.out)


__all__ = ["Attempt", "Completion", "RolloutClient"]
