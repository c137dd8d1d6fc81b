"""The tool-use environment: parsing, the sandbox (limits, kills, no leaks), rewards, tasks."""

from __future__ import annotations

import asyncio
import os
import random
import time

import pytest

from pearl.rl import EnvError, Task, make_env, make_tasks
from pearl.rl.envs.sandbox import SandboxLimits, run_tool
from pearl.rl.envs.tool_use import (
    Shaping,
    ToolUseEnv,
    charset_fraction,
    is_correct,
    parse_action,
)

from .conftest import sandbox_children

TASK = Task(id="t", prompt="What is 6 times 7?", answer="42")


def episode(env: ToolUseEnv, actions: list[str], task: Task = TASK) -> list:
    async def go() -> list:
        await env.reset(task)
        out = []
        for a in actions:
            out.append(await env.step(a))
            if out[-1].done:
                break
        return out

    return asyncio.run(go())


@pytest.mark.parametrize(
    "text, kind, body, closed",
    [
        ("<calc>2*(3+4)</calc>", "calc", "2*(3+4)", True),
        ("think first. <CALC> 1+1 </Calc> then <answer>2</answer>", "calc", "1+1", True),
        ("<answer>42</answer><calc>1</calc>", "answer", "42", True),
        ("I will run <py>sum(range(4))", "py", "sum(range(4))", False),
        ("<py>x</calc>", "py", "x</calc>", False),
        ("no tags here <calc", "none", "", False),
        ("", "none", "", False),
    ],
)
def test_actions_parse_to_the_first_tool_call_or_answer(
    text: str, kind: str, body: str, closed: bool
) -> None:
    a = parse_action(text)
    assert (a.kind, a.body, a.closed) == (kind, body, closed)


def test_answers_compare_as_numbers() -> None:
    assert is_correct("42", "42") and is_correct(" 42.0 ", "42") and is_correct("1,234", "1234")
    assert is_correct("$56", "56")
    assert not is_correct("41", "42") and not is_correct("forty-two", "42")
    assert not is_correct("", "")


def test_calculator_and_python_tools_run_in_the_sandbox(no_leaks: None) -> None:
    async def go() -> list:
        return list(
            await asyncio.gather(
                run_tool("calc", "2*(3+4) - 10/4"),
                run_tool("calc", "sqrt(16) + 2**10"),
                run_tool("py", "sorted([3, 1, 2])[::-1]"),
                run_tool("calc", "__import__('os')"),
                run_tool("calc", "1/0"),
                run_tool("py", "open('/etc/hostname').read()"),
                run_tool("py", "().__class__.__bases__"),
                run_tool("py", "[g.gi_frame for g in [(x for x in [1])]]"),
                run_tool("calc", "9**9**9"),
                run_tool("py", "'x' * 10_000"),
            )
        )

    r = asyncio.run(go())
    assert [x.ok for x in r] == [True, True, True, False, False, False, False, False, False, True]
    assert [r[0].output, r[1].output, r[2].output] == ["11.5", "1028", "[3, 2, 1]"]
    assert "not allowed in the calculator" in r[3].output
    assert "ZeroDivisionError" in r[4].output
    assert "NameError" in r[5].output  # no open() among the builtins
    assert "not allowed in the Python tool: __" in r[6].output
    assert "not allowed in the Python tool: gi_frame" in r[7].output
    assert "too large" in r[8].output
    assert r[9].output.endswith("more characters]") and len(r[9].output) < 600
    assert len({x.pid for x in r}) == len(r)  # one fresh process per call


def test_a_runaway_loop_is_killed_by_the_cpu_limit(no_leaks: None) -> None:
    t0 = time.monotonic()
    r = asyncio.run(run_tool("py", "sum(range(10**13))", SandboxLimits(cpu_s=1, timeout_s=10)))
    assert not r.ok and r.killed == "cpu" and "CPU time limit" in r.output
    assert time.monotonic() - t0 < 5
    assert not os.path.exists(f"/proc/{r.pid}")


def test_a_runaway_loop_is_killed_by_pid_on_the_wall_clock_timeout(no_leaks: None) -> None:
    r = asyncio.run(run_tool("py", "sum(range(10**13))", SandboxLimits(cpu_s=30, timeout_s=0.4)))
    assert not r.ok and r.killed == "timeout" and "time limit" in r.output
    assert r.seconds < 3
    assert not os.path.exists(f"/proc/{r.pid}")  # killed and reaped: not even a zombie


def test_a_huge_allocation_hits_the_memory_limit(no_leaks: None) -> None:
    async def go() -> list:
        return [
            await run_tool("py", "[0] * 10**9"),
            await run_tool("py", "'x' * 10**10"),
            await run_tool("py", "len('x' * 300 * 2**20)"),
        ]

    for r in asyncio.run(go()):
        assert not r.ok and "MemoryError" in r.output
    ok = asyncio.run(run_tool("py", "len('x' * 300 * 2**20)", SandboxLimits(memory_mb=1024)))
    assert ok.ok and ok.output == str(300 * 2**20)  # the limit, not the expression, refused it


def test_a_cancelled_tool_call_leaves_no_process(no_leaks: None) -> None:
    async def go() -> None:
        task = asyncio.ensure_future(
            run_tool("py", "sum(range(10**13))", SandboxLimits(cpu_s=30, timeout_s=30))
        )
        for _ in range(100):
            await asyncio.sleep(0.02)
            if sandbox_children():
                break
        assert sandbox_children(), "the sandbox never started"
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(go())


def test_oversized_tool_calls_are_refused_without_a_process() -> None:
    r = asyncio.run(run_tool("calc", "1+" * 2000 + "1"))
    assert not r.ok and r.pid == 0 and "limit" in r.output


def test_rewards_of_an_episode(no_leaks: None) -> None:
    s = Shaping()
    out = episode(ToolUseEnv(latency_s=0), ["<calc>6*7</calc>", "<answer>42</answer>"])
    assert out[0].observation == "<result>42</result>" and not out[0].done
    assert out[0].reward == pytest.approx(s.tool_format + s.charset)  # every char is syntax
    assert out[1].done and out[1].info["correct"] and out[1].reward >= s.correct
    wrong = episode(ToolUseEnv(latency_s=0), ["<answer>41</answer>"])
    assert wrong[0].done and not wrong[0].info["correct"]
    assert wrong[0].reward == pytest.approx(s.answer_format + s.charset)
    err = episode(ToolUseEnv(latency_s=0), ["<calc>1/0</calc>"])
    assert err[0].observation.startswith("<error>ZeroDivisionError")
    assert err[0].reward == pytest.approx(s.charset * charset_fraction("<calc>1/0</calc>"))


def test_shaping_is_capped_below_a_correct_answer(no_leaks: None) -> None:
    s = Shaping(cap=0.12)
    env = ToolUseEnv(max_turns=10, shaping=s, latency_s=0)
    out = episode(env, ["<calc>1+1</calc>"] * 4 + ["<answer>7</answer>"])
    assert sum(o.reward for o in out) == pytest.approx(0.12)
    assert all(o.reward >= 0 for o in out)


def test_random_text_gets_varied_small_rewards() -> None:
    rng = random.Random(0)
    rewards = []
    for _ in range(20):
        text = bytes(rng.randrange(256) for _ in range(40)).decode("utf-8", "replace")
        rewards.append(episode(ToolUseEnv(max_turns=1, latency_s=0), [text])[0].reward)
    assert len(set(rewards)) > 10 and 0 <= min(rewards) and max(rewards) < Shaping().correct


def test_the_turn_limit_ends_an_episode() -> None:
    out = episode(ToolUseEnv(max_turns=2, latency_s=0), ["hello", "hello", "hello"])
    assert [o.done for o in out] == [False, True] and out[1].info["truncated"]
    env = ToolUseEnv(max_turns=1, latency_s=0)
    episode(env, ["x"])
    with pytest.raises(EnvError, match="after the episode ended"):
        asyncio.run(env.step("x"))


def test_step_latency_is_real_time() -> None:
    t0 = time.monotonic()
    episode(ToolUseEnv(max_turns=3, latency_s=0.05), ["a", "b", "c"])
    assert time.monotonic() - t0 >= 0.15


def test_word_problems_are_seeded_and_their_answers_are_right() -> None:
    a, b = make_tasks("tool_use", n=200, seed=3), make_tasks("tool_use", n=200, seed=3)
    assert list(a) == list(b)
    assert list(a) != list(make_tasks("tool_use", n=200, seed=4))
    for t in a:
        assert eval(t.meta["expression"]) == int(t.answer)  # the expression is ours
        assert str(int(t.answer)) == t.answer
    kinds = {t.prompt.split()[0] for t in a}
    assert len(kinds) >= 5
    assert isinstance(make_env("tool_use", max_turns=2), ToolUseEnv)


def test_crashes_and_spawn_failures_become_observations(monkeypatch: pytest.MonkeyPatch) -> None:
    from pearl.rl.envs import sandbox

    crashed = sandbox.tool_result(
        rc=1, out=b"", err=b"Traceback...\nSystemError: boom\n", seconds=0.1, pid=7
    )
    assert not crashed.ok and "crashed (exit 1) SystemError: boom" in crashed.output
    killed = sandbox.tool_result(rc=-11, out=b"", err=b"", seconds=0.1, pid=7)
    assert not killed.ok and killed.killed == "signal 11"

    async def no_processes(*args: object, **kw: object) -> None:
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(asyncio, "create_subprocess_exec", no_processes)
    out = episode(ToolUseEnv(latency_s=0), ["<calc>1+1</calc>"])
    assert not out[0].done and "could not start" in out[0].observation
