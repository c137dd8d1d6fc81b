"""One multi-turn trajectory, end to end: the reference loop a pipeline runs per trajectory.

``run_trajectory`` alternates generation (through any ``generate`` callable: a router, one
engine) and environment steps, building the trajectory record turn by turn. A generation that
comes back aborted (its worker was removed) is resubmitted with its generated prefix as part of
the prompt; the prefix stays a turn of its own, with the version that produced it.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import zlib
from collections.abc import Awaitable, Callable

import msgspec

from pearl.engines.base import Engine, FinishReason, GenerateRequest, GenerateResult, SamplingParams
from pearl.rl.env import Environment, Task
from pearl.rl.prompt import PromptBuilder
from pearl.rl.trajectory import Trajectory, Turn

# (input ids, sampling, trajectory id) -> the engine's result for that turn
GenerateFn = Callable[[tuple[int, ...], SamplingParams, str], Awaitable[GenerateResult]]


def engine_generate(engine: Engine, prefix: str = "r") -> GenerateFn:
    """A GenerateFn over one engine (its futures awaited from asyncio)."""
    counter = itertools.count()

    async def generate(
        ids: tuple[int, ...], sampling: SamplingParams, trajectory_id: str
    ) -> GenerateResult:
        req = GenerateRequest(
            rid=f"{prefix}-{next(counter)}",
            input_ids=ids,
            sampling=sampling,
            trajectory=trajectory_id,
        )
        return await asyncio.wrap_future(engine.generate(req))

    return generate


async def run_trajectory(
    env: Environment,
    task: Task,
    generate: GenerateFn,
    builder: PromptBuilder,
    *,
    trajectory_id: str,
    group_id: str,
    sampling: SamplingParams | None = None,
    max_resumes: int = 8,
    clock: Callable[[], float] = time.monotonic,
) -> Trajectory:
    """Roll out ``task`` in ``env`` until done, the turn limit, or ``builder.max_len``.

    ``sampling.max_new_tokens`` bounds each turn; its stop ids default to the tokenizer's eos;
    with a seed, each turn samples with a seed derived from (seed, trajectory id, turn).
    """
    sp = sampling or SamplingParams(max_new_tokens=64, temperature=1.0)
    if not sp.stop_ids:
        sp = msgspec.structs.replace(sp, stop_ids=builder.stop_ids)
    traj = Trajectory(id=trajectory_id, group_id=group_id, task_id=task.id)
    t0 = clock()
    try:
        observation = await env.reset(task)
        traj = traj.add_env_time(clock() - t0)
        new: tuple[int, ...] | None = builder.first(observation)
        for k in itertools.count():
            assert new is not None
            action_ids: list[int] = []
            budget = builder.max_new_tokens(traj, new, sp.max_new_tokens)
            for _ in range(max_resumes + 1):  # an aborted generation resumes from its prefix
                if budget <= 0:
                    return traj.finish(truncated=True)
                turn_sp = msgspec.structs.replace(
                    sp, max_new_tokens=budget, seed=_turn_seed(sp.seed, trajectory_id, k)
                )
                result = await generate(traj.tokens() + new, turn_sp, trajectory_id)
                traj = traj.add_turn(Turn.of(new, result))
                action_ids += result.output_ids
                budget -= len(result.output_ids)
                new = ()
                if result.finish_reason != FinishReason.ABORT:
                    break
            else:
                return traj.finish(truncated=True)  # aborted more than max_resumes times
            t1 = clock()
            out = await env.step(builder.decode(action_ids))
            traj = traj.add_step(out.reward, clock() - t1)
            if out.done:
                return traj.finish(truncated=bool(out.info.get("truncated", False)))
            new = builder.next(traj, out.observation)
            if new is None:
                return traj.finish(truncated=True)
        raise AssertionError("unreachable")
    finally:
        await env.close()


def _turn_seed(seed: int | None, trajectory_id: str, turn: int) -> int | None:
    if seed is None:
        return None
    return zlib.crc32(f"{seed}:{trajectory_id}:{turn}".encode()) & 0x7FFFFFFF


__all__ = ["GenerateFn", "engine_generate", "run_trajectory"]
