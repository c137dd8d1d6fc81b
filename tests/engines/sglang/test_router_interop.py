"""Interop with the real ``sglang-router`` (a Rust binary; runs on CPU): PEARL's Router actor,
through an SGLangRouterLink, registers torch-engine facades with ``POST /workers`` as the table
changes, removes them with ``DELETE /workers/{id}``, and routes colocated and PD requests."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from actors import base
from actors.messages import AbortRequest, StateChanged
from actors.router import Router
from pearl.config import SGLangConfig
from pearl.core.state import Activity, Role, Worker, Zone
from pearl.core.view import ClusterView, TableSnapshot
from pearl.engines.base import FinishReason, GenerateRequest, SamplingParams
from pearl.engines.sglang import SGLangClient
from pearl.engines.sglang.router import SGLangRouterClient, SGLangRouterLink, launch_routers
from pearl.engines.web import call
from pearl.testing.wait import wait_until

from ..helpers import prompt_of
from ..trainer import Trainer
from .conftest import BOOT_OFFSET, Servers, free_base

pytest.importorskip(
    "sglang_router", reason="sglang-router is in the test extra; pip install -e '.[test]'"
)

N_TOKENS = 24


@pytest.fixture(scope="module")
def routers() -> Iterator[tuple[str, str]]:
    port = free_base(12)
    procs = launch_routers("127.0.0.1", port)
    try:
        yield f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port + 1}"
    finally:
        for p in procs:
            p.stop()


def table(s: Servers, *rows: tuple[Any, str]) -> tuple[Worker, ...]:
    """The given (server engine, role) rows as active workers; GPU id = port offset."""
    return tuple(
        Worker(
            id=i,
            gpus=(e.spec.port - s.base,),
            role=Role(role),
            activity=Activity.ACTIVE,
            zone=Zone.DEDICATED,
        )
        for i, (e, role) in enumerate(rows)
    )


def wait(cond: Any, timeout: float = 30.0, what: str = "") -> None:
    wait_until(cond, timeout, what or "the condition")


@pytest.fixture
def harness(servers: Servers, routers: tuple[str, str]) -> Iterator[SimpleNamespace]:
    cfg = SGLangConfig(
        host="127.0.0.1", port=servers.base, bootstrap_port=servers.base + BOOT_OFFSET
    )
    link = SGLangRouterLink(*routers, cfg, admit_timeout_s=20)
    d = base.Directory()
    router = base.start(d, Router, directory=d, link=link)
    trainer = base.start(d, Trainer, d)
    seq = [0]

    def publish(workers: tuple[Worker, ...]) -> None:
        seq[0] += 1
        router.tell(
            StateChanged(view=ClusterView(table=TableSnapshot(seq=seq[0], workers=workers)))
        )

    yield SimpleNamespace(
        link=link,
        router=router,
        trainer=trainer,
        publish=publish,
        rc=SGLangRouterClient(routers[0]),
        pd=SGLangRouterClient(routers[1]),
    )
    publish(())
    wait(lambda: not link.registered, what="deregistration")
    router.ref.stop()
    trainer.ref.stop()


def answers(h: SimpleNamespace, n: int, timeout: float = 60.0) -> dict[str, Any]:
    def status() -> dict[str, Any]:
        return dict(h.trainer.ref.proxy().status().get())

    wait(lambda: len(status()["finished"]) >= n, timeout, "answers")
    return status()


def test_colocated_then_pd_requests_through_the_real_router(
    servers: Servers, harness: SimpleNamespace
) -> None:
    h, s = harness, servers
    prompts = {f"c{i}": prompt_of(12 + i, i) for i in range(4)}
    want = {
        rid: s.coloc.generate(
            GenerateRequest(
                rid=f"ref-{rid}", input_ids=p, sampling=SamplingParams(max_new_tokens=N_TOKENS)
            )
        )
        .result(60)
        .output_ids
        for rid, p in prompts.items()
    }
    tr = h.trainer.ref.proxy()
    tr.submit("c0", prompts["c0"], N_TOKENS).get()  # waits: nothing is registered yet
    h.publish(table(s, (s.coloc, "colocated")))
    wait(lambda: h.link.mode() == "regular", what="colocated admission")
    assert [w["url"] for w in h.rc.workers()] == [s.coloc.spec.url]
    for rid in ("c1",):
        tr.submit(rid, prompts[rid], N_TOKENS).get()
    got = answers(h, 2)["finished"]
    assert got["c0"] == list(want["c0"]) and got["c1"] == list(want["c1"])
    # disaggregate: the colocated worker leaves, a prefill/decode pair joins (PD router)
    h.publish(table(s, (s.prefill, "prefill"), (s.decode, "decode")))
    wait(lambda: h.link.mode() == "pd", what="PD admission")
    assert h.rc.workers() == []
    types = sorted((w["worker_type"], w.get("bootstrap_port")) for w in h.pd.workers())
    assert types == [("decode", None), ("prefill", s.prefill.spec.bootstrap_port)]
    for rid in ("c2", "c3"):
        tr.submit(rid, prompts[rid], N_TOKENS).get()
    got = answers(h, 4)["finished"]
    assert got["c2"] == list(want["c2"]) and got["c3"] == list(want["c3"])
    assert s.decode.client.metrics()["sglang:kv_transfer_latency_ms_count"] > 0


def test_workers_join_and_leave_during_a_run_and_nothing_is_lost(
    servers: Servers, harness: SimpleNamespace
) -> None:
    h, s = harness, servers
    h.publish(table(s, (s.coloc, "colocated")))
    wait(lambda: h.link.mode() == "regular", what="admission")
    n, long = 10, 120
    prompts = {f"r{i}": prompt_of(8 + i, 20 + i) for i in range(n)}
    tr = h.trainer.ref.proxy()
    coloc = SGLangClient(s.coloc.spec.url)
    # The first worker holds every request in flight (no iteration runs) until it leaves: the
    # removal below always finds them running, however fast the machine.
    call(f"{s.coloc.spec.url}/pause_generation", "POST", {})
    try:
        for rid, p in prompts.items():
            tr.submit(rid, p, long).get()
        wait(lambda: coloc.metrics()["sglang:num_running_reqs"] == n, what="requests held")
        # a second worker joins mid-run ...
        h.publish(table(s, (s.coloc, "colocated"), (s.old, "colocated")))
        wait(lambda: len(h.rc.workers()) == 2, what="the second worker")
        # ... then the first leaves (a shrink): unrouted first, then its requests are aborted
        # and come back with their prefixes, which the trainer resubmits and the router sends
        # elsewhere
        h.publish(table(s, (s.old, "colocated")))
        wait(lambda: [w["url"] for w in h.rc.workers()] == [s.old.spec.url], what="removal")
        assert coloc.metrics()["sglang:num_running_reqs"] == n  # all still in flight
        coloc.abort_all()
    finally:
        call(f"{s.coloc.spec.url}/continue_generation", "POST", {})
    st = answers(h, n, timeout=120)
    for rid, p in prompts.items():
        ref = (
            s.old.generate(
                GenerateRequest(
                    rid=f"ref-{rid}", input_ids=p, sampling=SamplingParams(max_new_tokens=long)
                )
            )
            .result(60)
            .output_ids
        )
        assert st["finished"][rid] == list(ref), rid  # every token, none lost or doubled
    assert st["aborts"] >= n


def test_a_group_is_admitted_only_when_all_of_it_is_healthy(
    servers: Servers, harness: SimpleNamespace, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="pearl.engines.sglang.router")
    h, s = harness, servers
    dead = SimpleNamespace(spec=SimpleNamespace(port=s.base + 9))  # nothing listens there
    h.publish(table(s, (s.coloc, "colocated"), (dead, "colocated")))
    url = f"http://127.0.0.1:{s.base + 9}"
    wait(lambda: f"waiting for ['{url}']" in caplog.text, what="the group to be held back")
    assert h.rc.workers() == [] and not h.link.routable()
    h.publish(table(s, (s.coloc, "colocated")))  # the plan without the sick worker
    wait(lambda: h.link.mode() == "regular", what="admission")
    assert [w["url"] for w in h.rc.workers()] == [s.coloc.spec.url]


def test_abort_through_the_link_keeps_the_prefix(
    servers: Servers, harness: SimpleNamespace
) -> None:
    h, s = harness, servers
    h.publish(table(s, (s.coloc, "colocated")))
    wait(lambda: h.link.mode() == "regular", what="admission")
    seen: list[Any] = []
    ev = threading.Event()

    def done(result: Any, error: str, retryable: bool) -> None:
        seen.append((result, error))
        ev.set()

    h.link.submit(
        GenerateRequest(
            rid="long", input_ids=prompt_of(6), sampling=SamplingParams(max_new_tokens=3000)
        ),
        done,
    )
    wait(lambda: SGLangClient(s.coloc.spec.url).metrics()["sglang:num_running_reqs"] > 0)
    h.router.tell(AbortRequest(rid="nothing-pending"))  # unknown rids are ignored
    h.link.abort("long")
    assert ev.wait(30)
    result, _ = seen[0]
    assert result.finish_reason is FinishReason.ABORT and 0 < len(result.output_ids) < 3000
