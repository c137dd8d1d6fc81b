"""Decisions on gateway-only traffic come from measured profiles: agents that reach PEARL only
through the HTTP gateway, with a known shape (turns, prompt growth, environment time), and a
trainer that marks its batches with training-begin and training-finished. After three batches
the profile the controller decides with holds the agents' S, delta_L and T_env within 25%."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from pearl.core import events as ev
from pearl.runtime import wait_training_may_proceed
from pearl.testing.wait import wait_until
from tests.gateway.conftest import local_runtime

pytestmark = pytest.mark.slow

SETS = (
    "engine.kind=sim",
    "engine.sim.time_scale=0.02",
    "engine.sim.start_s=1",
    "rl.env=",  # no rollout pipeline: the gateway's sessions are the only measurements
    "daemon.pd=colocated",
    "daemon.tick_s=0.1",
    "daemon.heartbeat_s=0.5",
    "workload.max_trajectory_tokens=4096",
    "gateway.listen=127.0.0.1:0",
)
SESSIONS, TURNS, FIRST, OBS, NEW, ENV_S = 8, 3, 48, 12, 16, 0.2
BATCHES = 3
# The agents' true values, as PEARL's model defines them (pearl.core.profile.summarize):
S_TRUE = TURNS  # turns of the slowest trajectory
DELTA_L_TRUE = (FIRST + (TURNS - 1) * OBS) / TURNS  # new prompt tokens per turn
T_ENV_TRUE = (TURNS - 1) * ENV_S  # a trajectory's environment time


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[Any]:
    with local_runtime(tmp_path, SETS) as rt:
        yield rt


async def batch(url: str, model: str, k: int) -> list[str]:
    """One rollout batch of ``SESSIONS`` agents; the failures."""
    failures: list[str] = []

    async def agent(http: httpx.AsyncClient, sid: str) -> None:
        rng = random.Random(sid)
        prompt = [rng.randrange(256) for _ in range(FIRST)]
        for turn in range(TURNS):
            r = await http.post(
                "/completions",
                json={"model": model, "prompt": prompt, "max_tokens": NEW, "temperature": 0,
                      "return_token_ids": True},
                headers={"X-Session-ID": sid},
            )  # fmt: skip
            if r.status_code != 200:
                failures.append(f"{sid}: {r.status_code} {r.text[:200]}")
                return
            ids = r.json()["choices"][0]["token_ids"]
            if turn < TURNS - 1:
                await asyncio.sleep(ENV_S)  # the environment's turn
                prompt = [*prompt, *ids, *(rng.randrange(256) for _ in range(OBS))]

    async with httpx.AsyncClient(base_url=url, timeout=120) as http:
        await asyncio.gather(*(agent(http, f"b{k}-{i}") for i in range(SESSIONS)))
    return failures


def within(measured: float, true: float) -> bool:
    return abs(measured - true) <= 0.25 * true


def test_three_batches_of_gateway_traffic_set_the_profile_the_controller_decides_with(
    runtime: Any,
) -> None:
    rt = runtime
    wait_until(
        lambda: any(w.activity == "active" and w.role != "training" for w in rt.status().workers),
        60,
        "a worker serving",
        every=0.1,
    )
    prior = rt.status().profile
    # The priors (configs/local-cpu.toml's [workload]) are far from these agents: the check can
    # only pass on what was measured.
    assert not within(prior.delta_L, DELTA_L_TRUE) and not within(prior.S, S_TRUE)
    model = rt.daemon.gateway_backend.model
    steps = []
    for k in range(1, BATCHES + 1):
        assert asyncio.run(batch(rt.gateway_url, model, k)) == []
        rt.event(ev.TrainingBegin(step=k))  # the batch's sessions end at the boundary: one step
        wait_training_may_proceed(rt.status, k, timeout_s=60)
        rt.event(ev.TrainingFinished(step=k))
        steps.append(rt.daemon.gateway_backend.sessions.stepped)
    assert steps == [1, 2, 3]  # one rollout step per batch

    def measured() -> Any:
        p = rt.status().profile
        return p if p is not None and p != prior and within(p.S, S_TRUE) else None

    p = wait_until(measured, 30, "the tracker to fold the batches' telemetry")
    got = {"S": p.S, "delta_L": p.delta_L, "T_env": p.T_env}
    true = {"S": S_TRUE, "delta_L": DELTA_L_TRUE, "T_env": T_ENV_TRUE}
    print(f"measured {got}, true {true}")
    assert all(within(got[k], true[k]) for k in true), (got, true)
