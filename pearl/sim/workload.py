"""A SWE-bench-like agentic workload: GRPO groups of multi-turn trajectories, seeded.

Each rollout batch holds ``batch / group_size`` tasks x ``group_size`` samples (GRPO). A task fixes
the prompt length (issue text, repository context) and a difficulty that scales how many turns its
samples take; each sample then draws, per turn, the observation tokens the environment returns
(file contents, test logs: SWE-bench turns are observation-heavy), the tokens the policy generates
(a tool call) and the seconds the environment takes. A trajectory stops at its turn count or when
its context reaches the maximum trajectory length (the last response is truncated there).

Every draw is lognormal with a given mean and coefficient of variation. Batch k is generated from
``(seed, k)`` alone, so every policy replays exactly the same trajectories (common random numbers).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class WorkloadParams:
    """Distributions of the generator; see docs/simulator.md for the calibrated values."""

    batch: int = 64  # trajectories per rollout batch (B)
    group_size: int = 16  # GRPO group size
    max_tokens: int = 32768  # maximum trajectory length
    prompt_tokens: float = 3000.0  # first prompt (system + issue + repository summary)
    prompt_cv: float = 0.3
    turns: float = 24.0  # mean turns of a task of median difficulty
    turns_cv: float = 0.5  # sample-to-sample spread within a task
    task_sigma: float = 0.4  # lognormal sigma of task difficulty (shared by a group)
    max_turns: int = 100
    obs_tokens: float = 1100.0  # new observation tokens per turn
    obs_cv: float = 1.0
    gen_tokens: float = 40.0  # generated tokens per turn (a tool call)
    gen_cv: float = 0.6
    env_s: float = 1.0  # environment seconds per turn
    env_cv: float = 1.5

    def __post_init__(self) -> None:
        if self.batch < 1 or self.group_size < 1:
            raise ValueError("batch and group_size must be >= 1")
        if self.max_tokens < 16:
            raise ValueError("max_tokens must be >= 16")


@dataclass(frozen=True, slots=True)
class TrajectorySpec:
    """One trajectory: per turn k, ``new[k]`` prompt tokens to append (k = 0: the first
    prompt, then observations), ``gen[k]`` tokens to generate, then ``env[k]`` environment
    seconds (none after the last turn)."""

    group: int
    new: tuple[int, ...]
    gen: tuple[int, ...]
    env: tuple[float, ...]

    @property
    def turns(self) -> int:
        return len(self.gen)

    @property
    def tokens(self) -> int:
        return sum(self.new) + sum(self.gen)


def _lognormal(
    rng: np.random.Generator, mean: float, cv: float, size: int | None = None
) -> np.ndarray:
    if cv <= 0:
        return np.full(size or 1, float(mean))
    s2 = math.log1p(cv * cv)
    return rng.lognormal(math.log(mean) - s2 / 2, math.sqrt(s2), size or 1)


def generate_batch(p: WorkloadParams, seed: int, index: int) -> list[TrajectorySpec]:
    """Rollout batch ``index`` of the workload seeded by ``seed``: B trajectories in groups."""
    rng = np.random.default_rng([seed, index])
    n_groups = math.ceil(p.batch / p.group_size)
    out: list[TrajectorySpec] = []
    for g in range(n_groups):
        prompt = max(16, int(_lognormal(rng, p.prompt_tokens, p.prompt_cv)[0]))
        difficulty = float(rng.lognormal(0.0, p.task_sigma)) if p.task_sigma > 0 else 1.0
        for _ in range(min(p.group_size, p.batch - len(out))):
            turns = int(
                np.clip(
                    np.rint(_lognormal(rng, p.turns * difficulty, p.turns_cv)[0]), 1, p.max_turns
                )
            )
            obs = np.maximum(
                1, np.rint(_lognormal(rng=rng, mean=p.obs_tokens, cv=p.obs_cv, size=turns))
            ).astype(int)
            gen = np.maximum(
                1, np.rint(_lognormal(rng=rng, mean=p.gen_tokens, cv=p.gen_cv, size=turns))
            ).astype(int)
            env = _lognormal(rng=rng, mean=p.env_s, cv=p.env_cv, size=turns)
            out.append(
                _truncate(group=g, prompt=prompt, obs=obs, gen=gen, env=env, limit=p.max_tokens)
            )
    return out


def _truncate(
    group: int, prompt: int, obs: np.ndarray, gen: np.ndarray, env: np.ndarray, limit: int
) -> TrajectorySpec:
    new_l, gen_l, env_l = [], [], []
    ctx = 0
    for k in range(len(gen)):
        add = min(prompt if k == 0 else int(obs[k]), max(0, limit - ctx - 1))
        if add <= 0 and k > 0:
            break
        ctx += add
        out_tokens = max(1, min(int(gen[k]), limit - ctx))
        ctx += out_tokens
        new_l.append(add)
        gen_l.append(out_tokens)
        env_l.append(float(env[k]))
        if ctx >= limit:
            break
    env_l[-1] = 0.0  # no environment step after the last response
    return TrajectorySpec(
        group=group, new=tuple(new_l), gen=tuple(gen_l), env=tuple(env_l[:-1]) + (0.0,)
    )


def batch_stats(batch: list[TrajectorySpec]) -> dict[str, float]:
    """Token and turn statistics of a batch (for docs and calibration reports)."""
    turns = [t.turns for t in batch]
    new = sum(sum(t.new) for t in batch)
    gen = sum(sum(t.gen) for t in batch)
    return {
        "trajectories": len(batch),
        "turns_mean": float(np.mean(turns)),
        "turns_max": float(max(turns)),
        "tokens_mean": float(np.mean([t.tokens for t in batch])),
        "tokens_max": float(max(t.tokens for t in batch)),
        "prefill_share": new / (new + gen),
        "env_s_mean": float(np.mean([sum(t.env) for t in batch])),
    }


__all__ = ["TrajectorySpec", "WorkloadParams", "batch_stats", "generate_batch"]
