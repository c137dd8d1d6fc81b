"""The Router actor with scripted workers: routes only to active workers, PD pairs share a
transfer id, a retryable failure (the KV never arrived) is routed again, aborts come back."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pykka
import pytest

from actors.base import Directory, LocalRef, PearlActor, start
from actors.messages import AbortRequest, Generate, GenerateDone, Route, StateChanged
from actors.router import Flush, KvAddress, Router
from pearl.engines.base import FinishReason, GenerateRequest, GenerateResult


class FakeWorker(PearlActor):
    """Answers every request at once; can be told to fail the next ones retryably."""

    handles = {Generate: "on_generate", AbortRequest: "on_abort"}

    def __init__(self, directory: Directory, wid: int, log: list[Any], fail: list[int]) -> None:
        super().__init__()
        self.directory, self.wid, self.log, self.fail = directory, wid, log, fail
        self.name = f"worker/{wid}"  # type: ignore[misc]

    def on_generate(self, msg: Generate) -> None:
        self.log.append((self.wid, msg.request))
        r = msg.request
        if self.fail and self.fail[0] == self.wid:
            self.fail.pop(0)
            self.directory.tell("router", GenerateDone(self.wid, r.rid, None, "KV timeout", True))
            return
        out = GenerateResult(r.rid, (1, 2, 3), (0.0,) * 3, FinishReason.LENGTH, 0, len(r.input_ids))
        self.directory.tell("router", GenerateDone(self.wid, r.rid, out))

    def on_abort(self, msg: AbortRequest) -> None:
        self.log.append((self.wid, "abort", msg.rid))


class Results:
    """Ask the sink what it has heard."""


class Sink(PearlActor):
    name = "sink"
    handles = {GenerateDone: "on_done", Results: "results"}

    def __init__(self) -> None:
        super().__init__()
        self.done: list[GenerateDone] = []
        self.event = threading.Event()

    def on_done(self, msg: GenerateDone) -> None:
        self.done.append(msg)
        self.event.set()

    def results(self, _: Any = None) -> list[GenerateDone]:
        return list(self.done)


@pytest.fixture
def cluster() -> Iterator[tuple[Directory, list[Any], list[int]]]:
    d = Directory()
    log: list[Any] = []
    fail: list[int] = []
    start(d, Router, d)
    start(d, Sink)
    for wid in (1, 2, 3):
        d.register(LocalRef(f"worker/{wid}", FakeWorker.start(d, wid, log, fail)))
        d.tell("router", KvAddress(wid, f"inproc://kv-{wid}"))
    yield d, log, fail
    pykka.ActorRegistry.stop_all()


def view(d: Directory, rows: list[tuple[int, str, str]], seq: int = 1) -> None:
    workers = [{"id": w, "role": r, "activity": a, "zone": "dedicated", "gpus": [w],
                "incarnation": 1} for w, r, a in rows]
    d.tell("router", StateChanged(seq, {"workers": workers}))


def results(d: Directory, n: int, timeout: float = 5.0) -> list[GenerateDone]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = d.get("sink").ask(Results())
        if len(got) >= n:
            return got  # type: ignore[no-any-return]
        time.sleep(0.01)
    raise AssertionError(f"only {len(got)} of {n} results")


def test_only_active_workers_receive_requests(cluster: Any) -> None:
    d, log, _ = cluster
    view(d, [(1, "colocated", "transitioning"), (2, "colocated", "active")])
    for i in range(4):
        d.tell("router", Route(GenerateRequest(f"r{i}", (5, 6)), "sink"))
    assert all(r.result is not None for r in results(d, 4))
    assert {w for w, _ in log} == {2}


def test_requests_wait_for_routable_workers(cluster: Any) -> None:
    d, log, _ = cluster
    view(d, [(1, "colocated", "transitioning")])
    d.tell("router", Route(GenerateRequest("r", (5,)), "sink"))
    time.sleep(0.1)
    assert log == []
    view(d, [(1, "colocated", "active")], seq=2)
    assert results(d, 1)[0].result is not None


def test_pd_requests_go_to_a_pair_with_one_transfer_id(cluster: Any) -> None:
    d, log, _ = cluster
    view(d, [(1, "prefill", "active"), (2, "decode", "active")])
    d.tell("router", Route(GenerateRequest("r", (5, 6, 7)), "sink"))
    done = results(d, 1)
    assert done[0].worker == 2  # the decode worker's answer is the result
    sent = {w: req for w, req in log}
    assert sent[1].transfer_id == sent[2].transfer_id != ""
    assert sent[1].kv_peer == "inproc://kv-2" and sent[2].kv_peer == ""


def test_a_retryable_failure_is_routed_again(cluster: Any) -> None:
    d, log, fail = cluster
    view(d, [(1, "prefill", "active"), (2, "decode", "active")])
    fail.append(2)  # the decode worker never gets the KV the first time
    d.tell("router", Route(GenerateRequest("r", (5,)), "sink"))
    time.sleep(0.1)
    d.tell("router", Flush())  # retries are routed at the next tick
    done = results(d, 1)
    assert done[0].result is not None and not done[0].error
    ids = [req.transfer_id for w, req in log if w == 2]
    assert len(ids) == 2 and ids[0] != ids[1]  # a fresh transfer for the retry


def test_abort_reaches_the_worker(cluster: Any) -> None:
    d, log, _ = cluster
    view(d, [(3, "colocated", "transitioning")])
    d.tell("router", Route(GenerateRequest("r", (5,)), "sink"))
    d.tell("router", AbortRequest("r"))
    done = results(d, 1)
    assert done[0].result is None and "aborted" in done[0].error
