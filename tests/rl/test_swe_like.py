"""The synthetic SWE-like environment follows its distributions; its reward follows the actions."""

from __future__ import annotations

import asyncio
import math
import random
import statistics
import time

import pytest

from pearl.rl import EnvError, StepOutcome, Task, make_env, make_tasks
from pearl.rl.envs.swe_like import Dist, SWEConfig, SWELikeEnv, classify


def play(env: SWELikeEnv, task: Task, action: str = "look around") -> tuple[str, list[StepOutcome]]:
    async def go() -> tuple[str, list[StepOutcome]]:
        first = await env.reset(task)
        outs: list[StepOutcome] = []
        while not outs or not outs[-1].done:
            outs.append(await env.step(action))
        return first, outs

    return asyncio.run(go())


def test_turns_sizes_and_latencies_follow_the_configured_distributions() -> None:
    cfg = SWEConfig.build(
        turns={"kind": "randint", "low": 2, "high": 6},
        prompt_bytes={"kind": "uniform", "low": 1000, "high": 2000},
        file_bytes={"kind": "lognormal", "median": 500, "sigma": 0.5},
        log_bytes={"kind": "exponential", "mean": 300, "lo": 50},
        read_latency_s={"kind": "uniform", "low": 0.0, "high": 0.2},
        test_latency_s=0.1,
        edit_latency_s=0.0,
        mix=(0.5, 0.5, 0.0),
        time_scale=0.0,
    )
    tasks = make_tasks("swe_like", n=50, seed=1)
    turns: list[int] = []
    prompts: list[int] = []
    reads: list[int] = []
    logs: list[int] = []
    kinds: list[str] = []
    lat: list[float] = []
    for i in range(400):
        first, outs = play(SWELikeEnv(seed=i, config=cfg), tasks[i % len(tasks)])
        turns.append(len(outs))
        prompts.append(len(first.encode()))
        for o in outs[:-1]:
            kinds.append(o.info["kind"])
            (reads if o.info["kind"] == "read" else logs).append(o.info["obs_bytes"])
            if o.info["kind"] == "read":
                lat.append(o.info["latency_s"])
    assert set(turns) == {2, 3, 4, 5, 6}
    assert statistics.mean(turns) == pytest.approx(4.0, abs=0.2)
    assert statistics.mean(prompts) == pytest.approx(1500, rel=0.03)
    assert 1000 <= min(prompts) and max(prompts) <= 2000
    assert statistics.median(reads) == pytest.approx(500, rel=0.08)  # lognormal: median
    assert statistics.mean(reads) == pytest.approx(500 * math.exp(0.125), rel=0.06)
    # exponential clipped below at 50: E[max(X, 50)] = 50 + 300 exp(-50/300)
    assert min(logs) >= 50
    assert statistics.mean(logs) == pytest.approx(50 + 300 * math.exp(-50 / 300), rel=0.1)
    assert kinds.count("read") / len(kinds) == pytest.approx(0.5, abs=0.05)
    assert "edit" not in kinds
    assert all(x == 0.0 for x in lat)  # time_scale 0: drawn, not awaited


def test_latencies_are_awaited_for_real() -> None:
    env = SWELikeEnv(seed=0, turns=3, read_latency_s=0.05, test_latency_s=0.05, edit_latency_s=0.05)
    t0 = time.monotonic()
    _, outs = play(env, make_tasks("swe_like", n=1)[0])
    assert len(outs) == 3 and time.monotonic() - t0 >= 0.15
    assert sum(o.info["latency_s"] for o in outs) == pytest.approx(0.15)


def test_episodes_are_reproducible_by_seed() -> None:
    task = make_tasks("swe_like", n=1, seed=2)[0]
    a = play(SWELikeEnv(seed=5, time_scale=0), task)
    b = play(SWELikeEnv(seed=5, time_scale=0), task)
    c = play(SWELikeEnv(seed=6, time_scale=0), task)
    assert a == b and a != c


def test_the_reward_is_the_fraction_of_hidden_tests_the_actions_fix() -> None:
    task = Task(id="s", prompt="fix it", answer="ab", meta={"needles": "ab"})
    cfg = SWEConfig.build(turns=2, time_scale=0)
    scores = {}
    for action in ("nothing", "only a", "a and b"):
        _, outs = play(SWELikeEnv(seed=0, config=cfg), task, action)
        scores[action] = outs[-1].reward
        assert outs[-1].info["kind"] == "final" and outs[-1].done
    assert scores == {"nothing": 0.0, "only a": 0.5, "a and b": 1.0}
    _, outs = play(SWELikeEnv(seed=0, config=cfg), task, "a and b")
    assert outs[-1].info["resolved"] and "test_1 PASSED" in outs[-1].observation


def test_keywords_choose_the_action_kind_and_submit_ends_early() -> None:
    assert [classify(a) for a in ("run pytest", "edit foo", "please submit", "read x")] == [
        "test",
        "edit",
        "submit",
        None,
    ]
    _, outs = play(
        SWELikeEnv(seed=0, turns=10, time_scale=0),
        Task(id="s", prompt="p", answer="z", meta={"needles": "z"}),
        "submit z",
    )
    assert len(outs) == 1 and outs[0].reward == 1.0 and outs[0].info["final_action"] == "submit"


def test_distribution_specs() -> None:
    rng = random.Random(0)
    assert Dist.from_spec(3).sample(rng) == 3.0
    d = Dist.from_spec({"kind": "lognormal", "median": 10, "sigma": 1.0, "lo": 5, "hi": 20})
    xs = [d.sample(rng) for _ in range(1000)]
    assert min(xs) == 5 and max(xs) == 20
    assert Dist("uniform", 1, 3).mean() == 2 and Dist("exponential", 4).mean() == 4
    with pytest.raises(EnvError, match="takes"):
        Dist.from_spec({"kind": "lognormal", "mean": 3})
    with pytest.raises(EnvError, match="kind"):
        Dist.from_spec({"kind": "zipf"})
    with pytest.raises(EnvError, match="unknown swe_like option"):
        make_env("swe_like", turn=3)
    with pytest.raises(EnvError, match="mix"):
        SWEConfig.build(mix=(1, 2))
