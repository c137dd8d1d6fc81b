"""A server engine whose watchdog gives up on its server ends its worker host, so that the
RoleSupervisor restarts it with a back-off, says why in ``pearl status``, or reports it lost;
before, the host stayed up with a dead engine that refused every request."""

from __future__ import annotations

import threading
from typing import Any

from actors.base import Directory
from actors.worker import WorkerActor
from pearl.core.state import Role
from pearl.engines.vllm import VLLMEngine, VLLMEngineConfig, VLLMSpec


class StubServerEngine:
    """What the worker sees of a server engine: it starts, and may say its server is gone."""

    role = Role.COLOCATED
    weights_version = 0

    def __init__(self) -> None:
        self.on_gone: Any = None

    def start(self) -> None:
        pass


def test_a_server_given_up_on_ends_the_worker_host() -> None:
    engine, exited = StubServerEngine(), threading.Event()
    worker = WorkerActor(
        directory=Directory(),
        worker=3,
        incarnation=1,
        make_engine=lambda role: engine,
        weights_source=lambda v: None,
        on_exit=exited.set,
    )
    worker.bring_up(Role.COLOCATED, 0)
    assert engine.on_gone is not None and not exited.is_set()
    engine.on_gone("the vLLM server is gone: the server died 4 times")
    assert exited.is_set()


def test_the_vllm_watchdog_giving_up_tells_why() -> None:
    engine = VLLMEngine(VLLMEngineConfig(VLLMSpec("/nowhere")))
    told: list[str] = []
    engine.on_gone = told.append
    engine._give_up("the server died 4 times")
    assert told == ["the vLLM server is gone: the server died 4 times"]
    assert "server is gone" in engine._life.refusal()
