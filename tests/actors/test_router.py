"""The Router actor with scripted workers: routes only to active workers, PD pairs share a
transfer id, a retryable failure (the KV never arrived) is routed again, aborts come back, and
what ran on a host that died is routed again elsewhere (late answers of abandoned attempts are
ignored)."""

from __future__ import annotations

import threading
from collections.abc import Collection, Iterator
from typing import Any

import msgspec
import pykka
import pytest

from actors import names
from actors.base import Directory, LocalRef, PearlActor, start
from actors.messages import AbortRequest, Generate, GenerateDone, Route, StateChanged
from actors.router import FIRST_BACKOFF_S, MAX_BACKOFF_S, Flush, KvAddress, Router, WorkerGone
from pearl.core.routing import (
    AFFINITY_SLACK,
    Choice,
    MoveCost,
    choose_worker,
    leaves_home,
    move_cost,
)
from pearl.core.state import Activity, Role, Worker, Zone
from pearl.core.view import ClusterView, TableSnapshot
from pearl.engines.base import FinishReason, GenerateRequest, GenerateResult, SamplingParams
from pearl.testing.actors import barrier
from pearl.testing.wait import wait_until


class FakeWorker(PearlActor):
    """Answers every request at once; can be told to fail the next ones retryably."""

    def __init__(self, directory: Directory, wid: int, log: list[Any], fail: list[int]) -> None:
        super().__init__()
        self.directory, self.wid, self.log, self.fail = directory, wid, log, fail
        self.name = names.worker_name(wid)  # type: ignore[misc]

    def on_generate(self, msg: Generate) -> None:
        self.log.append((self.wid, msg.request))
        r = msg.request
        if self.fail and self.fail[0] == self.wid:
            self.fail.pop(0)
            self.directory.tell(
                names.ROUTER,
                GenerateDone(
                    worker=self.wid, rid=r.rid, result=None, error="KV timeout", retryable=True
                ),
            )
            return
        out = GenerateResult(
            rid=r.rid,
            output_ids=(1, 2, 3),
            logprobs=(0.0,) * 3,
            finish_reason=FinishReason.LENGTH,
            weights_version=0,
            prompt_tokens=len(r.input_ids),
        )
        self.directory.tell(names.ROUTER, GenerateDone(worker=self.wid, rid=r.rid, result=out))

    def on_abort(self, msg: AbortRequest) -> None:
        self.log.append((self.wid, "abort", msg.rid))

    handles = {Generate: on_generate, AbortRequest: on_abort}


class Results:
    """Ask the sink what it has heard."""


class Sink(PearlActor):
    name = "sink"

    def __init__(self) -> None:
        super().__init__()
        self.done: list[GenerateDone] = []
        self.event = threading.Event()

    def on_done(self, msg: GenerateDone) -> None:
        self.done.append(msg)
        self.event.set()

    def results(self, _: Any = None) -> list[GenerateDone]:
        return list(self.done)

    handles = {GenerateDone: on_done, Results: results}


class Clock:
    """The Router's clock, moved by the test."""

    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def cluster(clock: Clock) -> Iterator[tuple[Directory, list[Any], list[int]]]:
    d = Directory()
    log: list[Any] = []
    fail: list[int] = []
    start(d, Router, directory=d, link=None, wait_s=30.0, clock=clock)
    start(d, Sink)
    for wid in (1, 2, 3):
        d.register(LocalRef(names.worker_name(wid), FakeWorker.start(d, wid, log, fail)))
        d.tell(names.ROUTER, KvAddress(wid, f"inproc://kv-{wid}"))
    yield d, log, fail
    pykka.ActorRegistry.stop_all()


def view(d: Directory, rows: list[tuple[int, str, str]], seq: int = 1) -> None:
    workers = tuple(
        Worker(
            id=w, gpus=(w,), role=Role(r), activity=Activity(a), zone=Zone.DEDICATED, incarnation=1
        )
        for w, r, a in rows
    )
    d.tell(
        names.ROUTER, StateChanged(view=ClusterView(table=TableSnapshot(seq=seq, workers=workers)))
    )


def results(d: Directory, n: int, timeout: float = 5.0) -> list[GenerateDone]:
    def enough() -> list[GenerateDone] | None:
        got: list[GenerateDone] = d.get("sink").ask(Results())
        return got if len(got) >= n else None

    return wait_until(enough, timeout, f"{n} results")  # type: ignore[no-any-return]


def settle(d: Directory, *names: str) -> None:
    """Every message told so far has been handled by these actors, in this order."""
    barrier(*(d.get(n) for n in names))


def test_only_active_workers_receive_requests(cluster: Any) -> None:
    d, log, _ = cluster
    view(d, [(1, "colocated", "transitioning"), (2, "colocated", "active")])
    for i in range(4):
        d.tell(
            names.ROUTER,
            Route(request=GenerateRequest(rid=f"r{i}", input_ids=(5, 6)), reply_to="sink"),
        )
    assert all(r.result is not None for r in results(d, 4))
    assert {w for w, _ in log} == {2}


def test_requests_wait_for_routable_workers(cluster: Any) -> None:
    d, log, _ = cluster
    view(d, [(1, "colocated", "transitioning")])
    d.tell(names.ROUTER, Route(request=GenerateRequest(rid="r", input_ids=(5,)), reply_to="sink"))
    settle(d, names.ROUTER, names.worker_name(1))
    assert log == []
    view(d, [(1, "colocated", "active")], seq=2)
    assert results(d, 1)[0].result is not None


def test_pd_requests_go_to_a_pair_with_one_transfer_id(cluster: Any) -> None:
    d, log, _ = cluster
    view(d, [(1, "prefill", "active"), (2, "decode", "active")])
    d.tell(
        names.ROUTER, Route(request=GenerateRequest(rid="r", input_ids=(5, 6, 7)), reply_to="sink")
    )
    done = results(d, 1)
    assert done[0].worker == 2  # the decode worker's answer is the result
    sent = {w: req for w, req in log}
    assert sent[1].transfer_id == sent[2].transfer_id != ""
    assert sent[1].kv_peer == "inproc://kv-2" and sent[2].kv_peer == ""


def test_a_retryable_failure_is_routed_again(cluster: Any) -> None:
    d, log, fail = cluster
    view(d, [(1, "prefill", "active"), (2, "decode", "active")])
    fail.append(2)  # the decode worker never gets the KV the first time
    d.tell(names.ROUTER, Route(request=GenerateRequest(rid="r", input_ids=(5,)), reply_to="sink"))
    settle(
        d, names.ROUTER, names.worker_name(1), names.worker_name(2), names.ROUTER
    )  # the failure is back at the router
    d.tell(names.ROUTER, Flush())  # retries are routed at the next tick
    done = results(d, 1)
    assert done[0].result is not None and not done[0].error
    ids = [req.transfer_id for w, req in log if w == 2]
    assert len(ids) == 2 and ids[0] != ids[1]  # a fresh transfer for the retry


def test_a_worker_that_turned_a_request_away_is_avoided_while_another_can_take_it(
    cluster: Any,
) -> None:
    """A worker whose server is relaunched refuses, retryably: the retry goes elsewhere."""
    d, log, fail = cluster
    view(d, [(1, "colocated", "active"), (2, "colocated", "active")])
    fail.append(1)
    d.tell(names.ROUTER, Route(request=GenerateRequest(rid="r", input_ids=(5,)), reply_to="sink"))
    settle(d, names.ROUTER, names.worker_name(1), names.ROUTER)
    d.tell(names.ROUTER, Flush())
    assert results(d, 1)[0].worker == 2
    assert [(w, q.rid) for w, q in log] == [(1, "r"), (2, "r~1")]


def test_abort_reaches_the_worker(cluster: Any) -> None:
    d, log, _ = cluster
    view(d, [(3, "colocated", "transitioning")])
    d.tell(names.ROUTER, Route(request=GenerateRequest(rid="r", input_ids=(5,)), reply_to="sink"))
    d.tell(names.ROUTER, AbortRequest(rid="r"))
    done = results(d, 1)
    assert done[0].result is None and "aborted" in done[0].error


class Release:
    """Tell a HoldingWorker to answer what it holds."""


class HoldingWorker(PearlActor):
    """Holds first attempts (rid without ``~``; every attempt when ``every``) until told to
    Release; answers retries at once."""

    def __init__(self, directory: Directory, wid: int, log: list[Any], every: bool) -> None:
        super().__init__()
        self.directory, self.wid, self.log, self.every = directory, wid, log, every
        self.name = names.worker_name(wid)  # type: ignore[misc]
        self.held: list[GenerateRequest] = []

    def on_generate(self, msg: Generate) -> None:
        self.log.append((self.wid, msg.request))
        if "~" in msg.request.rid and not self.every:
            self._answer(msg.request)
        else:
            self.held.append(msg.request)

    def _answer(self, r: GenerateRequest) -> None:
        out = GenerateResult(
            rid=r.rid,
            output_ids=(7,),
            logprobs=(0.0,),
            finish_reason=FinishReason.STOP,
            weights_version=0,
            prompt_tokens=len(r.input_ids),
        )
        self.directory.tell(names.ROUTER, GenerateDone(worker=self.wid, rid=r.rid, result=out))

    def release(self, _: Release) -> None:
        held, self.held = self.held, []
        for r in held:
            self._answer(r)

    def on_abort(self, msg: AbortRequest) -> None:
        self.log.append((self.wid, "abort", msg.rid))

    handles = {Generate: on_generate, AbortRequest: on_abort, Release: release}


def holding(d: Directory, wid: int, log: list[Any], every: bool = False) -> None:
    d.register(LocalRef(names.worker_name(wid), HoldingWorker.start(d, wid, log, every)))
    d.tell(names.ROUTER, KvAddress(wid, f"inproc://kv-{wid}"))


def sent_to(log: list[Any], wid: int) -> list[GenerateRequest]:
    return [e[1] for e in log if e[0] == wid and isinstance(e[1], GenerateRequest)]


def test_a_request_on_a_host_that_died_is_routed_again_from_the_turn_start(cluster: Any) -> None:
    d, log, _ = cluster
    holding(d, 0, log)
    view(d, [(0, "colocated", "active"), (2, "colocated", "active")])
    d.tell(
        names.ROUTER, Route(request=GenerateRequest(rid="r", input_ids=(5, 6, 7)), reply_to="sink")
    )
    settle(d, names.ROUTER, names.worker_name(0), names.worker_name(2))
    assert [q.rid for q in sent_to(log, 0)] == ["r"]  # worker 0 holds it, then its host dies
    d.tell(names.ROUTER, WorkerGone(0, 1, "exited"))
    done = results(d, 1)
    assert done[0].rid == "r" and done[0].result is not None and done[0].result.rid == "r"
    retry = sent_to(log, 2)
    assert [q.rid for q in retry] == ["r~1"] and retry[0].input_ids == (5, 6, 7)
    # The gone worker gets nothing until its (new) host says hello, even with the lowest load.
    d.tell(names.ROUTER, Route(request=GenerateRequest(rid="s", input_ids=(5,)), reply_to="sink"))
    results(d, 2)
    assert [q.rid for q in sent_to(log, 0)] == ["r"]
    d.tell(names.ROUTER, KvAddress(0, "inproc://kv-0"))
    d.tell(names.ROUTER, Route(request=GenerateRequest(rid="t", input_ids=(5,)), reply_to="sink"))
    settle(d, names.ROUTER, names.worker_name(0))
    assert [q.rid for q in sent_to(log, 0)] == ["r", "t"]
    # A late answer of the attempt given up on is not taken for anything.
    d.tell(names.worker_name(0), Release())
    settle(d, names.worker_name(0), names.ROUTER, "sink")
    assert [m.rid for m in d.get("sink").ask(Results())] == ["r", "s", "t"]


def test_a_dead_prefill_host_aborts_the_decode_half_and_retries(cluster: Any) -> None:
    d, log, _ = cluster
    holding(d, 0, log)  # prefill: never ships the KV
    holding(d, 4, log)  # decode: waits for it (first attempt), answers the retry
    view(d, [(0, "prefill", "active"), (2, "prefill", "active"), (4, "decode", "active")])
    d.tell(names.ROUTER, Route(request=GenerateRequest(rid="r", input_ids=(5, 6)), reply_to="sink"))
    settle(d, names.ROUTER, names.worker_name(0), names.worker_name(4))
    d.tell(names.ROUTER, WorkerGone(0, 1, "missed heartbeats"))
    done = results(d, 1)
    assert done[0].rid == "r" and done[0].worker == 4 and done[0].result is not None
    assert (4, "abort", "r") in log  # the surviving half of the first attempt
    assert [q.rid for q in sent_to(log, 2)] == ["r~1"]  # the live prefill worker, not 0


def test_a_prefill_host_that_dies_after_shipping_leaves_the_decode_alone(cluster: Any) -> None:
    d, log, _ = cluster
    holding(d, 4, log)
    view(d, [(1, "prefill", "active"), (4, "decode", "active")])
    d.tell(names.ROUTER, Route(request=GenerateRequest(rid="r", input_ids=(5, 6)), reply_to="sink"))
    settle(
        d, names.ROUTER, names.worker_name(1), names.worker_name(4), names.ROUTER
    )  # worker 1 answered: its KV left
    d.tell(names.ROUTER, WorkerGone(1, 1, "exited"))
    settle(d, names.ROUTER, names.worker_name(4))
    assert not any(e[1:] == ("abort", "r") for e in log) and len(sent_to(log, 4)) == 1
    d.tell(names.worker_name(4), Release())
    assert results(d, 1)[0].result is not None


def test_a_request_whose_hosts_keep_dying_backs_off_then_fails_in_its_time(
    cluster: Any, clock: Clock
) -> None:
    """Retries have a clock, not a count: each waits twice as long as the one before (the
    first none), and the request fails, transient, once its ``wait_s`` is spent."""
    d, log, _ = cluster
    holding(d, 0, log, every=True)
    view(d, [(0, "colocated", "active")])
    d.tell(
        names.ROUTER,
        Route(request=GenerateRequest(rid="r", input_ids=(5,)), reply_to="sink", wait_s=20.0),
    )
    settle(d, names.ROUTER, names.worker_name(0))

    def dies_and_comes_back() -> None:
        d.tell(names.ROUTER, WorkerGone(0, 1, "exited"))
        d.tell(names.ROUTER, KvAddress(0, "inproc://kv-0"))  # restarted: it says hello again
        d.tell(names.ROUTER, Flush())
        settle(d, names.ROUTER, names.worker_name(0))

    def sent() -> int:
        return len(sent_to(log, 0))

    dies_and_comes_back()
    assert sent() == 2  # the first retry goes at once
    gap = FIRST_BACKOFF_S
    while clock.t + gap < 100.0 + 20.0:
        dies_and_comes_back()
        n = sent()
        clock.t += gap * 0.9
        d.tell(names.ROUTER, Flush())
        settle(d, names.ROUTER, names.worker_name(0))
        assert sent() == n  # still backing off: no tight loop
        clock.t += gap * 0.1
        d.tell(names.ROUTER, Flush())
        settle(d, names.ROUTER, names.worker_name(0))
        assert sent() == n + 1
        gap = min(2 * gap, MAX_BACKOFF_S)
    assert [q.rid for q in sent_to(log, 0)][:3] == ["r", "r~1", "r~2"]
    assert not d.get("sink").ask(Results())  # not given up on while it has time
    d.tell(names.ROUTER, WorkerGone(0, 1, "exited"))
    clock.t = 100.0 + 20.0
    d.tell(names.ROUTER, Flush())
    done = results(d, 1)
    assert done[0].result is None and done[0].retry_after_s > 0
    assert "within 20 s" in done[0].error and "worker 0 is gone" in done[0].error


def test_a_request_with_no_worker_fails_in_its_time_not_before(cluster: Any, clock: Clock) -> None:
    d, log, _ = cluster
    view(d, [(1, "colocated", "transitioning")])
    d.tell(
        names.ROUTER, Route(request=GenerateRequest(rid="r", input_ids=(5,)), reply_to="sink")
    )  # the Router's 30 s
    settle(d, names.ROUTER)
    clock.t = 100.0 + 29.9
    d.tell(names.ROUTER, Flush())
    settle(d, names.ROUTER)
    assert not d.get("sink").ask(Results()) and log == []
    clock.t = 100.0 + 30.0
    d.tell(names.ROUTER, Flush())
    done = results(d, 1)
    assert done[0].retry_after_s > 0 and "no worker was routable" in done[0].error


class RefusingWorker(PearlActor):
    """Refuses every request as the request's own fault (a server's 4xx)."""

    def __init__(self, directory: Directory, wid: int, log: list[Any]) -> None:
        super().__init__()
        self.directory, self.wid, self.log = directory, wid, log
        self.name = names.worker_name(wid)  # type: ignore[misc]

    def on_generate(self, msg: Generate) -> None:
        self.log.append((self.wid, msg.request))
        why = "the vLLM server refused the request (400): Token id 600 is out of vocabulary"
        done = GenerateDone(
            worker=self.wid,
            rid=msg.request.rid,
            result=None,
            error=why,
            retryable=True,
            refused=True,
        )
        self.directory.tell(names.ROUTER, done)

    handles = {Generate: on_generate}


def test_a_refusal_is_final_at_once(cluster: Any, clock: Clock) -> None:
    d, log, _ = cluster
    d.register(LocalRef(names.worker_name(0), RefusingWorker.start(d, 0, log)))
    d.tell(names.ROUTER, KvAddress(0, "inproc://kv-0"))
    view(d, [(0, "colocated", "active")])
    d.tell(names.ROUTER, Route(request=GenerateRequest(rid="r", input_ids=(600,)), reply_to="sink"))
    done = results(d, 1)
    assert done[0].refused and "out of vocabulary" in done[0].error
    for _ in range(3):
        clock.t += MAX_BACKOFF_S
        d.tell(names.ROUTER, Flush())
    settle(d, names.ROUTER, names.worker_name(0))
    assert len(sent_to(log, 0)) == 1
    assert d.get(names.ROUTER).ref.proxy().stats().get()["pending"] == 0


def test_a_turn_goes_back_to_its_trajectorys_worker_unless_that_one_is_much_busier() -> None:
    """Cache-aware routing: the worker that ran a trajectory's last turn holds its prefix."""
    pool = [1, 2, 3]

    def pick(load: dict[int, int], home: int | None = None, critical: bool = False) -> Choice:
        return choose_worker(pool, load, home=home, critical=critical)

    assert pick({}) == Choice(1)  # first turn: the least loaded (lowest id on ties)
    assert pick({1: AFFINITY_SLACK}, home=1) == Choice(1, affine=True)  # within the slack: home
    assert pick({1: AFFINITY_SLACK}) == Choice(2)  # another trajectory: least loaded
    assert pick({1: AFFINITY_SLACK + 1, 2: 1}, home=1) == Choice(3)  # home too busy: it moves
    assert pick({3: 1}, home=3) == Choice(3, affine=True)
    assert choose_worker([1, 2], {3: 1}, home=3) == Choice(1)  # home not routable (removed, dead)
    # Beyond the slack but not AFFINITY_RATIO times as busy: it stays (SGLang's and vLLM's rule)
    assert pick({1: 9, 2: 6, 3: 6}, home=1) == Choice(1, affine=True)  # 9 > 6 + 2, not > 1.5 x 6
    assert pick({1: 9, 2: 6, 3: 5}, home=1) == Choice(3)  # 9 > 5 + slack and > 1.5 x 5: it moves
    assert pick({3: 1}, home=3, critical=True) == Choice(1)  # critical: no slack, no ratio
    assert not leaves_home(AFFINITY_SLACK, 0) and leaves_home(AFFINITY_SLACK + 1, 0)
    assert leaves_home(1, 0, critical=True) and not leaves_home(1, 1, critical=True)
    with pytest.raises(ValueError):
        choose_worker([], {})


def test_the_router_remembers_each_trajectorys_worker_and_counts_the_turns_sent_home() -> None:
    """The Router asks choose_worker and keeps what it answers as the trajectory's home: the
    worker a turn moved to is home for the next turn."""
    r = Router(Directory())
    r.state_changed(changed([1, 2, 3]))
    assert turn(r, "t") == 1  # first turn: the least loaded (lowest id on ties)
    r.load = {1: AFFINITY_SLACK, 2: 0, 3: 0}
    assert turn(r, "t") == 1  # within the slack: back home
    assert r.stats()["affine"] == 1
    assert turn(r, "u") == 2  # another trajectory: least loaded
    r.load = {1: AFFINITY_SLACK + 1, 2: 1, 3: 0}
    assert turn(r, "t") == 3  # home too busy: the least loaded takes it and is home now
    r.load = {1: 0, 2: 0, 3: 1}
    assert turn(r, "t") == 3
    r.state_changed(changed([1, 2]))  # its home is no longer routable (removed, lent back)
    assert turn(r, "t") == 1
    assert turn(r, "") == 2  # no trajectory: least loaded, nothing remembered
    assert r.stats()["affine"] == 2


def test_lent_workers_take_the_critical_path_and_only_it() -> None:
    """A borrowed (training) worker serves the turns of the batch the trainer waits for; the
    batch after it stays on the dedicated workers (it has a training step to finish in, and a
    lent worker is taken back when training begins). A critical turn leaves its trajectory's
    worker for any less loaded one (a lighter batch pays the re-prefill within the turn)."""
    pool, lent = [1, 2, 3], {3}

    def pick(load: dict[int, int], home: int | None = None, critical: bool = False) -> int:
        return choose_worker(pool, load, home=home, lent=lent, critical=critical).worker

    assert pick({1: 2, 2: 3, 3: 0}) == 1  # off the critical path: not the lent worker, though idle
    assert pick({1: 2, 2: 3, 3: 0}, critical=True) == 3  # on it: the least loaded, lent or not
    assert pick({1: 1, 2: 1, 3: 1}, home=1, critical=True) == 1  # home, no busier than the least
    assert pick({1: 2, 2: 1, 3: 1}, home=1, critical=True) == 2  # home one request busier: moves
    assert pick({1: 2, 2: 1, 3: 1}) == 2  # (ties: lowest id) and never 3
    assert choose_worker([3], {}, lent=lent).worker == 3  # only lent workers: they serve all
    # The Router takes the lent workers from the zones the Orchestrator publishes.
    r = Router(Directory())
    r.state_changed(changed([1, 2, 3], lent=lent))
    r.load = {1: 2, 2: 3, 3: 0}
    assert turn(r, "a") == 1 and turn(r, "b", critical=True) == 3


def changed(routable: list[int], lent: Collection[int] = ()) -> StateChanged:
    """The Orchestrator's news: ``routable`` colocated workers, ``lent`` of them on the trainer's
    GPUs."""
    workers = tuple(
        Worker(
            id=w,
            gpus=(w,),
            role=Role.COLOCATED,
            activity=Activity.ACTIVE,
            zone=Zone.OVERLAP if w in lent else Zone.DEDICATED,
            incarnation=1,
        )
        for w in routable
    )
    return StateChanged(view=ClusterView(table=TableSnapshot(seq=1, workers=workers)))


def turn(r: Router, trajectory: str, critical: bool = False, context: int = 1) -> int:
    """Route a turn of ``trajectory`` (``context`` prompt tokens) through the Router's handler:
    the worker it was sent to."""
    rid = f"turn-{len(r.pending)}"
    r.route(
        Route(
            request=GenerateRequest(
                rid=rid, input_ids=(5,) * context, trajectory=trajectory, critical=critical
            ),
            reply_to="sink",
        )
    )
    (worker,) = r.pending[rid].workers
    return worker


def test_a_request_no_worker_host_could_be_sent_is_refused_at_once(cluster: Any) -> None:
    """An id or a seed beyond 64 bits cannot be encoded for a worker host: the Router refuses it
    (final, never retried) and no worker hears of it; the next request is served."""
    d, log, _ = cluster
    view(d, [(1, "colocated", "active")])
    poisons = [
        GenerateRequest(rid="ids", input_ids=(5, 2**64)),
        GenerateRequest(rid="seed", input_ids=(5,), sampling=SamplingParams(seed=2**64)),
        GenerateRequest(rid="stop", input_ids=(5,), sampling=SamplingParams(stop_ids=(-1,))),
        GenerateRequest(rid="\ud800", input_ids=(5,)),
    ]
    for r in poisons:
        d.tell(names.ROUTER, Route(request=r, reply_to="sink"))
    done = results(d, len(poisons))
    assert [(m.rid, m.result, m.refused, m.retryable) for m in done] == [
        (r.rid, None, True, False) for r in poisons
    ]
    assert "token id 18446744073709551616" in done[0].error and "seed" in done[1].error
    d.tell(
        names.ROUTER, Route(request=GenerateRequest(rid="ok", input_ids=(5, 6)), reply_to="sink")
    )
    assert results(d, len(poisons) + 1)[-1].result is not None
    assert [req.rid for _, req in log] == ["ok"]


def test_a_move_pays_when_the_time_it_saves_exceeds_the_re_prefill_it_costs() -> None:
    """Eq. 1's terms: each request fewer beside the turn saves b per decode iteration and its
    own prefill; the move prefills the resident context again. One request more never moves."""
    c = move_cost(A=0.02, b=0.001, r=100, t_prefill=1e-4, prefill_per_turn=50, context=2050)
    assert c == pytest.approx(MoveCost(per_request_s=0.105, reprefill_s=0.2))
    assert not leaves_home(9, 8, cost=MoveCost(10.0, 0.0))  # one more: arrival order, stay
    assert leaves_home(3, 1, cost=c)  # 2 x 0.105 = 0.21 saved > 0.2 to re-prefill: it moves
    assert not leaves_home(3, 1, cost=c._replace(reprefill_s=0.25))  # 0.21 < 0.25: stay
    assert not leaves_home(40, 0, cost=MoveCost(0.001, 1.0))  # 0.04 s saved, 1 s to re-prefill
    assert leaves_home(40, 0, cost=MoveCost(0.001, 0.01), critical=True)
    # the cost replaces the slack rule: beyond it, a long context stays; a short one moves
    assert leaves_home(AFFINITY_SLACK + 1, 0) and not leaves_home(
        AFFINITY_SLACK + 1, 0, cost=MoveCost(0.01, 1.0)
    )
    assert choose_worker([1, 2], {1: 3}, home=1, cost=MoveCost(0.01, 1.0)) == Choice(1, True)
    assert choose_worker([1, 2], {1: 3}, home=1, cost=MoveCost(0.01, 0.02)) == Choice(2)


def test_the_router_weighs_a_move_by_the_fitted_profile_and_the_turns_context() -> None:
    """Once the view carries a profile, a turn with a long resident context stays home beside a
    load gap that moves a short one; a worker that leaves still takes every turn with it."""
    from pearl.config import load
    from pearl.core.profile import prior_profile

    prior = prior_profile(load(None, []))
    profile = msgspec.structs.replace(prior, observed=1)
    r = Router(Directory())
    r.state_changed(changed([1, 2]))
    r.profile = profile
    per_request = profile.r * profile.b + profile.prefill_per_turn * profile.t_prefill
    long = int(profile.prefill_per_turn + 10 * per_request / profile.t_prefill)
    assert turn(r, "long", context=long) == 1
    r.load = {1: 0, 2: 0}
    assert turn(r, "short", context=2) == 1
    r.load = {1: 6, 2: 1}  # 5 more at home: saves 5 x per_request; long re-prefills 10 x it
    assert turn(r, "long", context=long) == 1
    assert turn(r, "short", context=2) == 2
    r.state_changed(changed([2]))  # home left: the turn goes, whatever it costs
    r.profile = profile
    assert turn(r, "long", context=long) == 2


def test_an_unfitted_profile_leaves_moves_to_the_slack_rule() -> None:
    """The prior (no step observed) is a roofline guess for another machine: it decides no
    move. A gap within the slack keeps a long turn home and, beyond it, moves a long one too."""
    from pearl.config import load
    from pearl.core.profile import prior_profile

    prior = prior_profile(load(None, []))
    assert prior.observed == 0
    r = Router(Directory())
    r.state_changed(changed([1, 2]))
    r.profile = prior
    long = 4_000
    assert turn(r, "a", context=long) == 1
    r.load = {1: AFFINITY_SLACK + 1, 2: 1}  # within the slack: home
    assert turn(r, "a", context=long) == 1
    r.load = {1: 2 * AFFINITY_SLACK + 4, 2: 0}  # beyond the slack and the ratio: it moves
    assert turn(r, "a", context=long) == 2
