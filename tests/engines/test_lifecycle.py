"""An engine's lifecycle: the transition table, and an engine walked through every state."""

from __future__ import annotations

import threading
import time

import pytest

from pearl.core.errors import EngineError, InvariantViolation
from pearl.engines.base import GenerateRequest, SamplingParams
from pearl.engines.lifecycle import SERVER_TRANSITIONS, TRANSITIONS, EngineState, Lifecycle, Server
from pearl.engines.sim import SimEngine
from pearl.testing.wait import wait_until
from tests.engines.helpers import SIM_COST, SIM_SCALE, prompt_of, run
from tests.graphs import reachable

S = EngineState


@pytest.mark.parametrize("src", list(S))
@pytest.mark.parametrize("dst", list(S))
def test_every_pair_of_states_is_allowed_or_refused_as_the_table_says(
    src: EngineState, dst: EngineState
) -> None:
    life = Lifecycle("sim")
    life.state = src
    if dst in TRANSITIONS[src]:
        life.to(dst)
        assert life.state is dst
    else:
        with pytest.raises(InvariantViolation, match=f"{src.value} -> {dst.value}"):
            life.to(dst)
        assert life.state is src


def test_every_state_is_reachable_and_only_stopped_is_final() -> None:
    assert reachable(TRANSITIONS, S.NEW) == set(S)
    assert [s for s in S if not TRANSITIONS[s]] == [S.STOPPED]
    assert all(S.STOPPING in TRANSITIONS[s] for s in S if s not in (S.STOPPING, S.STOPPED))


def test_the_server_relaunches_until_it_is_gone_and_the_lifecycle_says_why_it_refuses() -> None:
    assert reachable(SERVER_TRANSITIONS, Server.UP) == set(Server)
    life = Lifecycle("sglang")
    life.to(S.SERVING)
    assert life.refusal() == ""
    life.to(S.RELEASING)
    assert life.refusal() == "the sglang engine is releasing its memory"
    life.to(S.SERVING)
    life.server_to(Server.RELAUNCHING)
    assert life.refusal() == "the sglang server is being relaunched after a crash"
    life.server_to(Server.UP)
    life.server_to(Server.GONE, "it died 4 times; see its log")
    assert life.refusal() == "the sglang server is gone (it died 4 times; see its log)"
    with pytest.raises(InvariantViolation, match="server gone -> relaunching"):
        life.server_to(Server.RELAUNCHING)


def test_an_engine_walks_its_lifecycle() -> None:
    e = SimEngine(cost=SIM_COST, time_scale=SIM_SCALE)
    assert e.state is S.NEW
    with pytest.raises(EngineError, match="not running"):
        run(e, prompt_of(8))
    e.start()
    assert e.state is S.SERVING
    assert run(e, prompt_of(8), max_new_tokens=2).output_ids
    # Draining: in-flight requests finish, new ones are refused, then it serves again.
    slow = e.generate(
        GenerateRequest(
            rid="slow", input_ids=prompt_of(8), sampling=SamplingParams(max_new_tokens=400)
        )
    )
    states: list[EngineState] = []
    drainer = threading.Thread(target=lambda: states.append(S.SERVING) if e.drain(30) else None)
    drainer.start()
    wait_until(lambda: e.state is S.DRAINING, 5, "draining", every=0.001)
    with pytest.raises(EngineError, match="draining"):
        e.generate(
            GenerateRequest(
                rid="new", input_ids=prompt_of(8), sampling=SamplingParams(max_new_tokens=2)
            )
        )
    slow.result(30)
    drainer.join(30)
    assert states == [S.SERVING] and e.state is S.SERVING
    e.release_memory()
    assert e.state is S.RELEASED and e.released
    with pytest.raises(EngineError, match="released its memory"):
        run(e, prompt_of(8))
    e.release_memory()  # idempotent
    e.resume_memory()
    assert e.state is S.SERVING
    e.stop()
    assert e.state is S.STOPPED
    e.stop()  # idempotent
    with pytest.raises(EngineError, match="already started"):
        e.start()
    with pytest.raises(EngineError, match="release.*not running"):
        e.release_memory()


def test_a_call_the_engine_thread_never_runs_is_an_error_that_names_it() -> None:
    e = SimEngine(cost=SIM_COST, time_scale=SIM_SCALE, call_timeout_s=0.2)
    e.start()
    try:
        running, gate = threading.Event(), threading.Event()

        def stuck() -> None:  # the engine thread is held until the gate opens
            running.set()
            gate.wait(10)

        def busy() -> None:  # this call times out too
            with pytest.raises(EngineError, match="within"):
                e._call(stuck)

        hold = threading.Thread(target=busy)
        hold.start()
        assert running.wait(5)
        t0 = time.monotonic()
        with pytest.raises(EngineError, match=r"release: .*within 0\.2 s"):
            e.release_memory()
        assert time.monotonic() - t0 < 0.9
        hold.join()  # its call timed out too
        gate.set()
    finally:
        e.stop()
