"""run_trajectory with a real engine and environment, aborts resumed, and one whole RL step."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from pearl.engines.base import FinishReason, GenerateResult, SamplingParams
from pearl.engines.torch import TorchEngine
from pearl.rl import (
    Batch,
    Environment,
    GRPOTrainer,
    PromptBuilder,
    StepOutcome,
    Task,
    Trajectory,
    WeightStore,
    engine_generate,
    make_env,
    make_tasks,
    run_trajectory,
)


class Recorder(Environment):
    """Records the actions it receives; done after ``turns`` steps; rewards 1 per step."""

    def __init__(self, turns: int = 2) -> None:
        self.turns = turns
        self.actions: list[str] = []

    async def reset(self, task: Task) -> str:
        return task.prompt

    async def step(self, action: str) -> StepOutcome:
        self.actions.append(action)
        return StepOutcome(
            observation=f"obs {len(self.actions)}", reward=1.0, done=len(self.actions) >= self.turns
        )


def rollouts(
    engine: TorchEngine, n: int, builder: PromptBuilder, seed: int = 0
) -> list[Trajectory]:
    tasks = make_tasks("tool_use", n=2, seed=0)
    gen = engine_generate(engine)
    sp = SamplingParams(max_new_tokens=16, temperature=1.0, seed=seed)

    async def go() -> list[Trajectory]:
        return list(
            await asyncio.gather(
                *[
                    run_trajectory(
                        env=make_env("tool_use", max_turns=3, latency_s=0.01),
                        task=tasks[i % 2],
                        generate=gen,
                        builder=builder,
                        trajectory_id=f"t{i}",
                        group_id=f"g{i % 2}",
                        sampling=sp,
                    )
                    for i in range(n)
                ]
            )
        )

    return asyncio.run(go())


def test_trajectories_from_a_real_engine_are_consistent(engine: TorchEngine) -> None:
    seen: list[tuple[int, ...]] = []
    inner = engine_generate(engine)

    async def spy(ids: tuple[int, ...], sp: SamplingParams, tid: str) -> GenerateResult:
        seen.append(ids)
        return await inner(ids, sp, tid)

    env = Recorder(turns=3)
    b = PromptBuilder(engine.tokenizer, max_len=1024)
    traj = asyncio.run(
        run_trajectory(
            env=env,
            task=Task(id="k", prompt="hello"),
            generate=spy,
            builder=b,
            trajectory_id="t",
            group_id="g",
            sampling=SamplingParams(max_new_tokens=8),
        )
    )
    assert traj.done and not traj.truncated and len(traj.turns) == 3 and traj.reward == 3.0
    for k, turn in enumerate(traj.turns):  # each turn's prompt is the whole history so far
        prefix = (
            Trajectory(id="t", group_id="g", task_id="k", turns=traj.turns[:k]).tokens()
            + turn.prompt_ids
        )
        assert seen[k] == prefix
        assert env.actions[k] == b.decode(turn.output_ids)
        assert turn.weights_version == 0 and len(turn.logprobs) == len(turn.output_ids)
    assert traj.tokens()[: len(b.first("hello"))] == b.first("hello")
    assert traj.env_s > 0


def test_an_aborted_generation_resumes_from_its_prefix() -> None:
    calls: list[tuple[tuple[int, ...], int]] = []

    async def flaky(ids: tuple[int, ...], sp: SamplingParams, tid: str) -> GenerateResult:
        calls.append((ids, sp.max_new_tokens))
        if len(calls) == 1:  # the worker was removed after 3 tokens
            return GenerateResult(
                rid="a",
                output_ids=(65, 66, 67),
                logprobs=(-1.0,) * 3,
                finish_reason=FinishReason.ABORT,
                weights_version=4,
                prompt_tokens=len(ids),
            )
        return GenerateResult(
            rid="b",
            output_ids=(68, 69),
            logprobs=(-2.0,) * 2,
            finish_reason=FinishReason.LENGTH,
            weights_version=5,
            prompt_tokens=len(ids),
        )

    from pearl.tokenizer import ByteTokenizer

    env = Recorder(turns=1)
    b = PromptBuilder(ByteTokenizer(), max_len=512)
    traj = asyncio.run(
        run_trajectory(
            env=env,
            task=Task(id="k", prompt="hi"),
            generate=flaky,
            builder=b,
            trajectory_id="t",
            group_id="g",
            sampling=SamplingParams(max_new_tokens=10),
        )
    )
    assert env.actions == ["ABCDE"]  # the environment saw one whole action
    assert calls[1] == (calls[0][0] + (65, 66, 67), 7)  # resumed: prefix in, 7 tokens left
    assert [t.finish_reason for t in traj.turns] == ["abort", "length"]
    assert traj.turns[1].prompt_ids == () and traj.n_turns == 1
    assert traj.token_versions()[-5:] == (4, 4, 4, 5, 5) and traj.min_version == 4


def test_the_length_limit_truncates(engine: TorchEngine) -> None:
    b = PromptBuilder(engine.tokenizer, max_len=300, min_new_tokens=4)
    env = Recorder(turns=100)
    traj = asyncio.run(
        run_trajectory(
            env=env,
            task=Task(id="k", prompt="x" * 10),
            generate=engine_generate(engine),
            builder=b,
            trajectory_id="t",
            group_id="g",
            sampling=SamplingParams(max_new_tokens=30),
        )
    )
    assert traj.done and traj.truncated and traj.n_tokens <= 300 and len(env.actions) >= 2


def test_one_asynchronous_rl_step_end_to_end(engine: TorchEngine, tmp_path: Path) -> None:
    """Roll out with version 0, train, publish, load: the next rollout runs version 1."""
    builder = PromptBuilder(engine.tokenizer, max_len=512)
    store = WeightStore(tmp_path)
    trainer = GRPOTrainer(device="cpu", lr=1e-3)
    batch = Batch(step=0, trajectories=tuple(rollouts(engine, 8, builder)))
    assert {t.min_version for t in batch} == {0} and len(batch.groups()) == 2
    assert all(t.done and t.n_generated > 0 for t in batch)
    assert len({t.reward for t in batch}) > 1  # shaping gives the groups reward variance
    before = trainer.logprobs(list(batch))
    m = trainer.step(batch)
    engine.load_weights(trainer.version, trainer.publish(store))
    assert m["staleness"] == 0 and store.latest() == 1
    after = rollouts(engine, 2, builder, seed=1)
    assert {t.min_version for t in after} == {1}
    rollout_lps = [x for u in after[0].turns for x in u.logprobs]
    assert trainer.logprobs([after[0]])[0] == pytest.approx(rollout_lps, abs=1e-4)
    assert trainer.logprobs(list(batch)) != before
