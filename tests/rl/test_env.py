"""The environment interface, task sets and the registry."""

from __future__ import annotations

import asyncio

import pytest

from pearl.core.schema import from_plain, to_plain
from pearl.rl import (
    EnvError,
    Environment,
    StepOutcome,
    Task,
    TaskSet,
    env_spec,
    list_envs,
    make_env,
    make_tasks,
    register_env,
)


class Echo(Environment):
    """A user environment: echoes the action, done after ``turns`` steps."""

    def __init__(self, turns: int = 2) -> None:
        self.turns, self.n = turns, 0

    async def reset(self, task: Task) -> str:
        self.n = 0
        return task.prompt

    async def step(self, action: str) -> StepOutcome:
        self.n += 1
        return StepOutcome(
            observation=action.upper(), reward=float(len(action)), done=self.n >= self.turns
        )


def echo_tasks(n: int, seed: int) -> TaskSet:
    return TaskSet([Task(id=f"e{seed}-{i}", prompt=f"say {i}") for i in range(n)], "echo")


def test_the_built_ins_are_registered() -> None:
    assert {"tool_use", "swe_like"} <= set(list_envs())
    assert env_spec("tool_use").description


def test_users_register_their_own_environment() -> None:
    register_env("echo-test", Echo, tasks=echo_tasks, replace=True)
    env = make_env("echo-test", turns=1)
    assert isinstance(env, Echo) and env.turns == 1
    out = asyncio.run(env.step("hi"))
    assert out == StepOutcome(observation="HI", reward=2.0, done=True)
    assert [t.id for t in make_tasks("echo-test", n=2, seed=7)] == ["e7-0", "e7-1"]
    with pytest.raises(EnvError, match="already registered"):
        register_env("echo-test", Echo)
    with pytest.raises(EnvError, match="does not accept"):
        make_env("echo-test", nope=1)
    register_env("not-an-env", lambda: object(), replace=True)  # type: ignore[arg-type, return-value]
    with pytest.raises(EnvError, match="not an Environment"):
        make_env("not-an-env")
    with pytest.raises(EnvError, match="without a task set"):
        make_tasks("not-an-env")


def test_an_environment_by_import_path() -> None:
    env = make_env("tests.rl.test_env:Echo", turns=3)
    assert isinstance(env, Echo) and env.turns == 3
    with pytest.raises(EnvError, match="cannot import"):
        make_env("tests.rl.test_env:Nope")
    with pytest.raises(EnvError, match="unknown environment 'nope'.*tool_use"):
        make_env("nope")


def test_task_sets_sample_reproducibly_without_replacement_per_epoch() -> None:
    ts = echo_tasks(10, 0)
    a, b = ts.sample(25, seed=1), ts.sample(25, seed=1)
    assert a == b and a != ts.sample(25, seed=2)
    assert sorted(t.id for t in a[:10]) == sorted(t.id for t in ts)  # one full epoch first
    assert sorted(t.id for t in a[10:20]) == sorted(t.id for t in ts)
    assert ts.get("e0-3").prompt == "say 3" and ts[3].id == "e0-3" and len(ts) == 10
    with pytest.raises(EnvError, match="no task"):
        ts.get("x")
    with pytest.raises(EnvError, match="duplicate"):
        TaskSet([Task(id="a", prompt="p"), Task(id="a", prompt="q")])
    with pytest.raises(EnvError, match="empty"):
        TaskSet([]).sample(1, seed=0)


def test_tasks_and_outcomes_are_plain_records() -> None:
    t = Task(id="a", prompt="p", answer="1", meta={"k": 1, "s": "x"})
    assert from_plain(Task, to_plain(t)) == t
    o = StepOutcome(observation="obs", reward=0.5, done=False, info={"tool": "calc"})
    assert from_plain(StepOutcome, to_plain(o)) == o


def test_the_package_api_is_lazy_and_complete() -> None:
    import subprocess
    import sys

    import pearl.rl

    assert sorted(pearl.rl.__all__) == sorted(pearl.rl._WHERE)
    for name in pearl.rl.__all__:
        assert getattr(pearl.rl, name) is not None
    code = (
        "import sys, pearl.rl; from pearl.rl import make_env, Trajectory, WeightStore; "
        "make_env('tool_use'); print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"  # environments and records do not load torch
