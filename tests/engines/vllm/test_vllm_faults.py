"""Faults of a real vLLM server under PEARL's Router, WorkerActor and RolloutClient (one server,
the tiny Qwen3 of the conftest): a request the server refuses reaches it exactly once and fails
as refused, never retried; a server SIGKILLed under 16 requests in flight is relaunched, and every
request completes, resumed with its prefix, equal to its uninterrupted run."""

from __future__ import annotations

import os
import re
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pykka
import pytest

from actors import names
from actors.base import Directory, LocalRef, start
from actors.messages import StateChanged
from actors.rollout_client import RolloutClient
from actors.router import Flush, Router
from actors.worker import WorkerActor
from pearl.core.errors import RequestRefused
from pearl.core.state import Activity, Role, Worker, Zone
from pearl.core.view import ClusterView, TableSnapshot
from pearl.engines.base import FinishReason, GenerateRequest, SamplingParams

from ...daemon.conftest import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.shared_actors, pytest.mark.timeout(900)]

WAIT_S = 600.0  # a relaunch on two busy cores takes a minute or more


def prompt(i: int) -> tuple[int, ...]:
    return tuple((7 * i + 13 * k) % 250 + 1 for k in range(6 + i))


@pytest.fixture(scope="module")
def pool(engine: Any) -> Iterator[RolloutClient]:
    """The engine as worker 0 of a one-worker pool, routed by a real Router."""
    d = Directory()
    start(d, Router, directory=d, link=None, wait_s=WAIT_S)
    ref = WorkerActor.start(d, 0, 1, lambda role: engine, lambda v: None, lambda: None)
    d.register(LocalRef(names.worker_name(0), ref))
    ref.proxy().engine = engine
    w = Worker(
        id=0,
        gpus=(0,),
        role=Role.COLOCATED,
        activity=Activity.ACTIVE,
        zone=Zone.DEDICATED,
        incarnation=1,
    )
    d.tell(names.ROUTER, StateChanged(view=ClusterView(table=TableSnapshot(seq=1, workers=(w,)))))
    client = RolloutClient(d, wait_s=WAIT_S)
    stop = threading.Event()

    def tick() -> None:  # pearld's ticker: the Router routes what waits at each tick
        while not stop.wait(0.2):
            d.tell(names.ROUTER, Flush())

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    try:
        yield client
    finally:
        stop.set()
        ticker.join()
        client.close()
        d.get(names.ROUTER).ref.stop()
        ref.proxy().engine = None  # the engine fixture stops it
        ref.stop()
        pykka.ActorRegistry.stop_all(timeout=10)


def completions_posted(engine: Any) -> int:
    """Requests the server has answered on /v1/completions, from its access log."""
    text = Path(engine.cfg.log_path).read_text(errors="replace")
    return len(re.findall(r'"POST /v1/completions HTTP/1\.1" \d+', text))


@pytest.mark.parametrize(
    "sampling",
    [
        SamplingParams(max_new_tokens=4, stop_ids=(999_999,)),  # refused inside a 200 stream
        SamplingParams(max_new_tokens=4000),  # refused with a 400 status: beyond max_model_len
    ],
    ids=["in-stream", "status"],
)
def test_a_refused_request_reaches_the_server_once_and_fails_as_refused(
    engine: Any, pool: RolloutClient, sampling: SamplingParams
) -> None:
    before = completions_posted(engine)
    fut = pool.generate(
        GenerateRequest(
            rid=f"poison-{sampling.max_new_tokens}", input_ids=(5, 6), sampling=sampling
        )
    )
    with pytest.raises(RequestRefused, match="refused the request \\(400\\)"):
        fut.result(120)
    rid = f"after-{sampling.max_new_tokens}"
    ok = pool.generate(
        GenerateRequest(rid=rid, input_ids=(5, 6), sampling=SamplingParams(max_new_tokens=4))
    )
    assert len(ok.result(120).output_ids) == 4  # the server serves on
    wait_until(lambda: completions_posted(engine) >= before + 2, 30, "the access log")
    assert completions_posted(engine) == before + 2  # the refused one once, and the good one


def test_a_killed_server_fails_none_of_16_requests_in_flight(
    engine: Any, pool: RolloutClient
) -> None:
    n = 48
    sp = SamplingParams(max_new_tokens=n)
    whole = {
        f"u{i}": engine.generate(GenerateRequest(rid=f"u{i}", input_ids=prompt(i), sampling=sp))
        for i in range(16)
    }
    reference = {rid[1:]: f.result(300).output_ids for rid, f in whole.items()}
    futs = {f"{i}": pool.generate(GenerateRequest(rid=f"k{i}", input_ids=prompt(i), sampling=sp))
            for i in range(16)}  # fmt: skip

    def streaming() -> bool:
        calls = list(engine._calls.values())
        return sum(1 for c in calls if c.completion and len(c.completion.out.token_ids) >= 2) >= 8

    wait_until(streaming, 120, "tokens of most of the 16 requests")
    old = engine.server.pid
    os.kill(old, signal.SIGKILL)
    failed, resumed = [], 0
    for i, f in futs.items():
        try:
            out = f.result(WAIT_S)
        except Exception as e:  # counted: the figure is how many failed
            failed.append(f"k{i}: {e}")
            continue
        assert out.finish_reason is FinishReason.LENGTH
        assert tuple(out.output_ids) == reference[i]  # resumed with its prefix, nothing lost
        resumed += out.resumed > 0
    assert failed == [] and engine.server.pid != old
    assert resumed >= 8  # they ran on the dead server and resumed on its relaunch
