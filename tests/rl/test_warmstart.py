"""The warm start: environment-made demonstrations, a cached model that solves some tasks and not
most at step 0, and GRPO from it raising held-out accuracy (issue 14).

The warm-started model is trained once into a per-machine cache directory (keyed like ``pearl
demo``'s cache: preset, environment, task seeds, demonstrations, optimiser), about a minute and a
half on two cores the first time; later runs, from any clone, load it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import tempfile
from pathlib import Path

import pytest

from pearl.engines.base import SamplingParams
from pearl.engines.torch import TorchEngine
from pearl.rl import Batch, GRPOTrainer, make_env, make_tasks, run_trajectory
from pearl.rl.heldout import HeldOutEval
from pearl.rl.prompt import PromptBuilder
from pearl.rl.rollout import engine_generate
from pearl.rl.warmstart import (
    DEMO_SEED,
    WarmStart,
    WarmStartConfig,
    demonstrations,
    distinct,
    ensure,
    held_out_tasks,
)
from pearl.tokenizer import ByteTokenizer

ENV = "tool_use_counts"
# A smaller task set than the demo's (64 RL tasks, 32 held out, 200 demonstrations).
CFG = WarmStartConfig(env=ENV, seed=0, train_tasks=64, held_out=32, demos=200, validation=32)


@pytest.fixture(scope="module")
def warm(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> WarmStart:
    """Cached per machine, not per clone: a fresh clone's ``make test`` reuses the model another
    clone trained (the directory's name is ``CFG.key()``, a digest of every input and the cache
    format). ``PEARL_WARM_START_CACHE`` moves it; ``-p no:cacheprovider`` trains afresh."""
    if getattr(request.config, "cache", None) is None:  # -p no:cacheprovider
        return ensure(CFG, tmp_path_factory.mktemp("warm"), show=False)
    default = Path(tempfile.gettempdir()) / f"pearl-warm-start-{os.getuid()}"
    cache = Path(os.environ.get("PEARL_WARM_START_CACHE") or default)
    cache.mkdir(parents=True, exist_ok=True)
    return ensure(CFG, cache, show=False)


def rollout(
    engine: TorchEngine,
    tasks: list,
    group: int,
    seed: int,
    temperature: float = 1.0,
    version: int = 0,
) -> list:
    """``group`` trajectories per task in the RL environment (Python tool off), seeded."""
    builder = PromptBuilder(ByteTokenizer(), max_len=CFG.max_len)
    generate = engine_generate(engine, prefix=f"r{version}-{seed}")
    sp = SamplingParams(max_new_tokens=48, temperature=temperature, seed=seed)

    async def go() -> list:
        sem = asyncio.Semaphore(8)

        async def one(i: int, k: int):
            async with sem:
                return await run_trajectory(
                    env=make_env(ENV),
                    task=tasks[i],
                    generate=generate,
                    builder=builder,
                    trajectory_id=f"v{version}s{seed}g{i}.{k}",
                    group_id=f"g{i}",
                    sampling=sp,
                )

        return list(
            await asyncio.gather(*(one(i, k) for i in range(len(tasks)) for k in range(group)))
        )

    return asyncio.run(go())


def test_demonstrations_are_correct_tool_call_transcripts_outside_the_held_out_set() -> None:
    builder = PromptBuilder(ByteTokenizer(), max_len=CFG.max_len)
    held = held_out_tasks(env=ENV, n=CFG.held_out, seed=CFG.seed, train_tasks=CFG.train_tasks)
    train = {t.prompt for t in make_tasks(ENV, n=CFG.train_tasks, seed=CFG.seed)}
    assert len(held) == CFG.held_out and not {t.prompt for t in held} & train
    tasks = distinct(
        candidates=make_tasks(ENV, n=64, seed=DEMO_SEED),
        n=12,
        exclude={t.prompt for t in held},
        what="demo",
    )
    demos = demonstrations(
        env=ENV, tasks=tasks, builder=builder, max_turns=4, python_share=0.5, seed=0
    )
    tools = set()
    for task, d in zip(tasks, demos, strict=True):
        text = builder.decode(d.tokens())
        assert d.reward == 1.0 and d.n_turns == 2  # a tool call, then the right answer
        assert f"<result>{task.answer}</result>" in text  # the sandbox really ran the tool
        assert text.endswith(f"<answer>{task.answer}</answer>")
        tools.add(builder.decode(d.turns[0].output_ids)[:3])
    assert tools == {"<ca", "<py"}


def test_the_cache_key_follows_preset_task_set_and_seed() -> None:
    keys = {
        CFG.key(),
        dataclasses.replace(CFG, seed=1).key(),
        dataclasses.replace(CFG, preset="small").key(),
        dataclasses.replace(CFG, train_tasks=128).key(),
    }
    assert len(keys) == 4 and CFG.key() == WarmStartConfig(**dataclasses.asdict(CFG)).key()


def test_warm_start_solves_some_tasks_but_not_most_at_step_0(warm: WarmStart) -> None:
    assert warm.meta["reached_target"], warm.meta
    again = ensure(CFG, warm.path.parent, show=False)
    assert again.cached and again.path == warm.path and again.seconds < 5
    engine = TorchEngine(model_path=str(warm.path), threads=1)
    engine.start()
    try:
        tasks = list(make_tasks(ENV, n=CFG.train_tasks, seed=CFG.seed))[:12]
        trajs = rollout(engine, tasks, group=4, seed=7)
        again_trajs = rollout(engine, tasks, group=4, seed=7)
    finally:
        engine.stop()
    rewards = [t.reward for t in trajs]
    mean = sum(rewards) / len(rewards)
    assert 0.05 <= mean <= 0.8, rewards  # some, not most: GRPO has a signal
    spread = [len({t.reward for t in trajs[i : i + 4]}) > 1 for i in range(0, len(trajs), 4)]
    assert sum(spread) >= 3, rewards  # groups whose members disagree
    # The same seed and weights give the same trajectories (the in-process path).
    assert [t.tokens() for t in again_trajs] == [t.tokens() for t in trajs]


@pytest.mark.slow
def test_grpo_on_the_warm_started_policy_raises_held_out_accuracy(warm: WarmStart) -> None:
    held = held_out_tasks(env=ENV, n=CFG.held_out, seed=CFG.seed, train_tasks=CFG.train_tasks)
    evaluator = HeldOutEval(ENV, held, model_path=str(warm.path))
    engine = TorchEngine(model_path=str(warm.path), threads=1)
    engine.start()
    try:
        before = evaluator.evaluate(None, 0)["accuracy"]
        trainer = GRPOTrainer(model_path=str(warm.path), lr=1e-3, device="cpu")
        stream = make_tasks(ENV, n=CFG.train_tasks, seed=CFG.seed).stream(CFG.seed)
        rewards = []
        for step in range(1, 9):
            trajs = rollout(
                engine, [next(stream) for _ in range(4)], group=4, seed=step, version=step - 1
            )
            metrics = trainer.step(Batch(step=step, trajectories=tuple(trajs)))
            rewards.append(metrics["reward_mean"])
            engine.load_weights(step, trainer.state_dict())
        after = evaluator.evaluate(trainer.state_dict(), 8)["accuracy"]
    finally:
        engine.stop()
        evaluator.close()
    assert after >= before + 0.15, (before, after, rewards)
    assert sum(rewards[-2:]) / 2 > sum(rewards[:2]) / 2, rewards
