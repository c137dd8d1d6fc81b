"""RolloutClient: one completion per request, whatever the Router answers on the way. A scripted
Router aborts turns part-way (a reclaim), fails one attempt, and changes the weights version."""

from __future__ import annotations

from typing import Any

import pytest

from actors import names
from actors.base import Directory
from actors.messages import AbortRequest, GenerateDone, Route
from actors.rollout_client import RolloutClient
from pearl.core.errors import NoWorker, RequestRefused
from pearl.engines.base import EngineError, FinishReason, GenerateRequest, GenerateResult
from pearl.engines.base import SamplingParams as S


class ScriptedRouter:
    """Answers each Route with the next of ``script``: ("abort", k, version) generates k tokens
    then aborts, ("done", version) generates the rest, ("error",) fails the attempt, ("hold",)
    leaves it running, ("refused",) refuses it as the request's fault (a server's 4xx),
    ("expired",) says no worker served it in its time."""

    name = names.ROUTER

    def __init__(self, d: Directory, script: list[tuple[Any, ...]]) -> None:
        self.d, self.script, self.seen = d, list(script), []
        self.aborted: list[str] = []
        self.routes: list[Route] = []

    def tell(self, msg: Route | AbortRequest) -> None:
        if isinstance(msg, AbortRequest):
            self.aborted.append(msg.rid)
            return
        req = msg.request
        self.seen.append(req)
        self.routes.append(msg)
        step = self.script.pop(0)
        if step[0] == "hold":  # still running
            return
        if step[0] == "error":
            self.d.tell(
                msg.reply_to,
                GenerateDone(worker=1, rid=req.rid, result=None, error="worker 1 is gone"),
            )
            return
        if step[0] == "refused":
            why = "the vLLM server refused the request (400): Token id 600 is out of vocabulary"
            self.d.tell(
                msg.reply_to,
                GenerateDone(worker=1, rid=req.rid, result=None, error=why, refused=True),
            )
            return
        if step[0] == "expired":
            why = "no worker served it within 9 s"
            self.d.tell(
                msg.reply_to,
                GenerateDone(worker=-1, rid=req.rid, result=None, error=why, retry_after_s=7.0),
            )
            return
        n = step[1] if step[0] == "abort" else req.sampling.max_new_tokens
        start = len(req.input_ids)
        ids = tuple(range(start, start + n))  # token i is its position: a resume must agree
        result = GenerateResult(
            rid=req.rid,
            output_ids=ids,
            logprobs=tuple(-0.5 for _ in ids),
            finish_reason=FinishReason.ABORT if step[0] == "abort" else FinishReason.LENGTH,
            weights_version=step[-1],
            prompt_tokens=len(req.input_ids),
            cached_tokens=2,
        )
        self.d.tell(msg.reply_to, GenerateDone(worker=1, rid=req.rid, result=result))

    def ask(self, msg: Any, timeout_s: float = 10.0) -> Any:
        self.tell(msg)


def client_with(
    script: list[tuple[Any, ...]], **kwargs: Any
) -> tuple[RolloutClient, ScriptedRouter]:
    d = Directory()
    router = ScriptedRouter(d, script)
    d.register(router)  # type: ignore[arg-type]
    return RolloutClient(d, retries=1, **kwargs), router


class Time:
    """A clock and a ``later`` that waits by moving the clock (no real waiting)."""

    def __init__(self) -> None:
        self.t = 0.0
        self.delays: list[float] = []

    def clock(self) -> float:
        return self.t

    def later(self, delay_s: float, fn: Any) -> None:
        self.delays.append(delay_s)
        self.t += delay_s
        fn()


def test_a_refused_request_is_tried_once_and_fails_as_refused() -> None:
    client, router = client_with([("refused",), ("done", 1)])
    fut = client.generate(GenerateRequest(rid="r", input_ids=(600,), sampling=S(max_new_tokens=4)))
    with pytest.raises(RequestRefused, match="out of vocabulary"):
        fut.result(5)
    assert len(router.seen) == 1 and client.failed == 1


def test_no_worker_in_time_fails_at_once_with_retry_after() -> None:
    client, router = client_with([("expired",), ("done", 1)])
    fut = client.generate(GenerateRequest(rid="r", input_ids=(1,), sampling=S(max_new_tokens=4)))
    with pytest.raises(NoWorker) as e:
        fut.result(5)
    assert e.value.retry_after_s == 7.0 and len(router.seen) == 1


def test_empty_endings_back_off_and_share_one_clock_then_fail_with_no_worker() -> None:
    """A server that aborts every attempt before its first token (it died, it fails): resumed
    after a back-off that doubles, each Route told the time left, never past ``wait_s``."""
    t = Time()
    client, router = client_with([("abort", 0, 1)] * 20, wait_s=3.0, clock=t.clock, later=t.later)
    fut = client.generate(GenerateRequest(rid="r", input_ids=(1,), sampling=S(max_new_tokens=4)))
    with pytest.raises(NoWorker, match="within 3 s"):
        fut.result(5)
    assert t.delays == [0.25, 0.5, 1.0, 2.0]  # the first resume at once
    assert [m.wait_s for m in router.routes] == [3.0, 3.0, 2.75, 2.25, 1.25]


def test_tokens_reset_the_back_off() -> None:
    t = Time()
    script = [("abort", 0, 1), ("abort", 0, 1), ("abort", 2, 1), ("abort", 0, 1), ("done", 1)]
    client, _ = client_with(script, clock=t.clock, later=t.later)
    out = client.generate(
        GenerateRequest(rid="r", input_ids=(1,), sampling=S(max_new_tokens=4))
    ).result(5)
    assert len(out.output_ids) == 4 and t.delays == [0.25]


def test_an_aborted_turn_resumes_with_its_prefix_and_the_caller_sees_one_completion() -> None:
    client, router = client_with([("abort", 3, 4), ("error",), ("abort", 2, 5), ("done", 5)])
    out = client.generate(
        GenerateRequest(rid="r", input_ids=(100, 101, 102, 103), sampling=S(max_new_tokens=10))
    ).result(5)
    assert out.output_ids == list(range(4, 14))  # positions 4..13: nothing lost or doubled
    assert len(out.logprobs) == 10 and out.finish_reason is FinishReason.LENGTH
    assert out.versions == [(0, 4), (3, 5), (5, 5)]  # where each attempt's tokens began
    assert out.resumed == 2 and client.migrated == 2 and out.errors == ["worker 1 is gone"]
    # resumptions asked for the rest only, with the prefix; the failed attempt was asked again
    assert [(len(r.input_ids), r.sampling.max_new_tokens) for r in router.seen] == [
        (4, 10), (7, 7), (7, 7), (9, 5)
    ]  # fmt: skip
    assert out.recomputed_tokens == (7 - 2) + (9 - 2)


def test_a_request_the_router_keeps_failing_fails_its_future() -> None:
    client, _ = client_with([("error",), ("error",)])
    fut = client.generate(GenerateRequest(rid="r", input_ids=(1, 2), sampling=S(max_new_tokens=4)))
    with pytest.raises(EngineError, match="worker 1 is gone"):
        fut.result(5)
    assert client.failed == 1


def test_one_rid_at_a_time() -> None:
    client, _ = client_with([("hold",)])
    client.generate(GenerateRequest(rid="r", input_ids=(1,), sampling=S(max_new_tokens=4)))
    with pytest.raises(EngineError, match="already in flight"):
        client.generate(GenerateRequest(rid="r", input_ids=(1,), sampling=S(max_new_tokens=4)))


def test_each_attempt_is_heard_as_it_ends_before_the_future_settles() -> None:
    client, _ = client_with([("abort", 3, 4), ("done", 5)])
    heard: list[Any] = []
    fut = client.generate(
        GenerateRequest(rid="r", input_ids=(100, 101), sampling=S(max_new_tokens=6)), heard.append
    )
    out = fut.result(5)
    assert [(a.output_ids, a.weights_version, a.resumed) for a in heard] == [
        ((2, 3, 4), 4, 0), ((5, 6, 7), 5, 1)
    ]  # fmt: skip
    assert [a.finish_reason for a in heard] == [None, FinishReason.LENGTH]
    assert heard[1].recomputed_tokens == 5 - 2 and out.recomputed_tokens == 3
    assert sum(len(a.output_ids) for a in heard) == len(out.output_ids) == 6


def test_a_cancelled_request_is_aborted_in_the_pool_and_not_resumed() -> None:
    client, router = client_with([("hold",)])
    fut = client.generate(GenerateRequest(rid="r", input_ids=(1, 2), sampling=S(max_new_tokens=8)))
    client.cancel("r")
    assert router.aborted == ["r"]
    part = GenerateResult(
        rid="r",
        output_ids=(7, 8),
        logprobs=(-1.0, -1.0),
        finish_reason=FinishReason.ABORT,
        weights_version=1,
        prompt_tokens=2,
    )
    client.tell(GenerateDone(worker=1, rid="r", result=part))
    out = fut.result(5)  # settled with what it had: no resumption was sent
    assert out.output_ids == [7, 8] and out.finish_reason is FinishReason.ABORT
    assert len(router.seen) == 1 and client.migrated == 0


def test_later_runs_what_is_due_in_order_on_one_thread() -> None:
    import threading

    from actors.rollout_client import Later

    later, ran, done = Later(), [], threading.Event()
    threads = set()

    def note(k: int) -> Any:
        def fn() -> None:
            ran.append(k)
            threads.add(threading.current_thread().name)
            if len(ran) == 3:
                done.set()

        return fn

    with later._cv:  # reentrant: nothing runs before all three are in
        later(0.2, note(3))
        later(0.0, note(1))
        later(0.1, note(2))
    assert done.wait(5)
    assert ran == [1, 2, 3] and threads == {"resend"}


def test_reroute_sends_what_is_in_flight_again_with_its_prefix() -> None:
    """After a Router restart: a request held by the old one is sent again from what it has."""
    client, router = client_with([("abort", 2, 1), ("hold",), ("done", 1)])
    fut = client.generate(GenerateRequest(rid="r", input_ids=(1,), sampling=S(max_new_tokens=5)))
    assert len(router.seen) == 2 and not fut.done()  # 2 tokens kept, the rest held and lost
    client.reroute()
    out = fut.result(5)
    assert out.output_ids == [1, 2, 3, 4, 5] and router.seen[-1].input_ids == (1, 1, 2)
    assert out.errors == ["the Router restarted; sent again"]
