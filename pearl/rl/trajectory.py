"""Trajectories as frozen, msgpack-friendly records: turns, the token view training needs, batches.

A trajectory's token sequence is the concatenation, turn after turn, of the prompt tokens the
turn appended (the whole first prompt, then each observation with its chat markers) and the
tokens generated for it: ``p_{k+1} = p_k ⊕ r_k ⊕ o_k`` (§2.1). Training needs three aligned
views of it: the tokens, a loss mask that is 1 exactly on generated tokens, and the rollout
logprob of every generated token (0 elsewhere).

A turn interrupted by an abort (a worker removed) is recorded as the prefix it generated
(finish reason ``abort``) followed by a turn with no new prompt tokens that continues it, so
every token keeps the weights version that really produced it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgspec

from pearl.core.errors import SchemaError
from pearl.core.schema import Value
from pearl.engines.base import GenerateResult


class Turn(Value, frozen=True, kw_only=True):
    """One generation: the prompt tokens it appended, what it generated, and by which weights."""

    prompt_ids: tuple[int, ...]  # appended before generating (observation + chat markers)
    output_ids: tuple[int, ...]
    logprobs: tuple[float, ...]  # one per output token, under the rollout weights
    weights_version: int
    finish_reason: str  # a pearl.engines.base.FinishReason value
    reward: float = 0.0  # what the environment step after this turn returned
    env_s: float = 0.0  # seconds that environment step took

    def __post_init__(self) -> None:
        if len(self.logprobs) != len(self.output_ids):
            raise SchemaError(
                f"Turn: {len(self.output_ids)} output tokens but "
                f"{len(self.logprobs)} logprobs; request return_logprobs=True"
            )

    @classmethod
    def of(cls, prompt_ids: tuple[int, ...] | list[int], result: GenerateResult) -> Turn:
        """The turn an engine result describes."""
        return cls(
            prompt_ids=tuple(prompt_ids),
            output_ids=tuple(result.output_ids),
            logprobs=tuple(result.logprobs),
            weights_version=int(result.weights_version),
            finish_reason=str(result.finish_reason.value),
        )


class Trajectory(Value, frozen=True, kw_only=True):
    """One multi-turn rollout of one task; ``group_id`` ties the GRPO group together."""

    id: str
    group_id: str
    task_id: str
    turns: tuple[Turn, ...] = ()
    reward: float = 0.0  # the sum of the turns' rewards (plus any reward of the reset)
    done: bool = False  # the episode ended (the environment said so, or it was truncated)
    truncated: bool = False  # ended by the length or turn limit rather than the environment
    env_s: float = 0.0  # seconds spent in the environment (reset and steps), outside decoding

    # -- building (each returns a new trajectory) ----------------------------------------------

    def add_turn(self, turn: Turn) -> Trajectory:
        if self.done:
            raise SchemaError(f"trajectory {self.id} is done; no turn can be added")
        return msgspec.structs.replace(self, turns=(*self.turns, turn))

    def add_step(self, reward: float, env_s: float) -> Trajectory:
        """Record the environment step that followed the last turn."""
        if not self.turns:
            raise SchemaError(f"trajectory {self.id} has no turn to attach a step to")
        last = msgspec.structs.replace(
            self.turns[-1],
            reward=self.turns[-1].reward + reward,
            env_s=self.turns[-1].env_s + env_s,
        )
        return msgspec.structs.replace(
            self,
            turns=(*self.turns[:-1], last),
            reward=self.reward + reward,
            env_s=self.env_s + env_s,
        )

    def add_env_time(self, env_s: float) -> Trajectory:
        """Time spent in the environment outside a step (reset)."""
        return msgspec.structs.replace(self, env_s=self.env_s + env_s)

    def finish(self, truncated: bool = False) -> Trajectory:
        return msgspec.structs.replace(self, done=True, truncated=truncated)

    # -- views for training ----------------------------------------------------------------------

    def tokens(self) -> tuple[int, ...]:
        """The whole sequence: prompt and generated tokens of every turn, in order."""
        out: list[int] = []
        for t in self.turns:
            out += t.prompt_ids
            out += t.output_ids
        return tuple(out)

    def loss_mask(self) -> tuple[int, ...]:
        """1 on generated tokens, 0 on prompt and observation tokens; aligned with ``tokens()``."""
        out: list[int] = []
        for t in self.turns:
            out += [0] * len(t.prompt_ids)
            out += [1] * len(t.output_ids)
        return tuple(out)

    def rollout_logprobs(self) -> tuple[float, ...]:
        """The rollout logprob of each generated token, 0.0 elsewhere; aligned with ``tokens()``."""
        out: list[float] = []
        for t in self.turns:
            out += [0.0] * len(t.prompt_ids)
            out += t.logprobs
        return tuple(out)

    def token_versions(self) -> tuple[int, ...]:
        """The weights version of each generated token, -1 elsewhere; aligned with ``tokens()``."""
        out: list[int] = []
        for t in self.turns:
            out += [-1] * len(t.prompt_ids)
            out += [t.weights_version] * len(t.output_ids)
        return tuple(out)

    @property
    def n_tokens(self) -> int:
        """``len(self.tokens())`` without building it."""
        return sum(len(t.prompt_ids) + len(t.output_ids) for t in self.turns)

    @property
    def n_generated(self) -> int:
        return sum(len(t.output_ids) for t in self.turns)

    @property
    def min_version(self) -> int:
        """The oldest weights version that generated any token (-1 when none was generated)."""
        versions = [t.weights_version for t in self.turns if t.output_ids]
        return min(versions) if versions else -1

    @property
    def max_version(self) -> int:
        versions = [t.weights_version for t in self.turns if t.output_ids]
        return max(versions) if versions else -1

    @property
    def n_turns(self) -> int:
        """Agent turns, not counting the continuations of aborted generations."""
        return sum(
            1
            for i, t in enumerate(self.turns)
            if i == 0 or self.turns[i - 1].finish_reason != "abort"
        )


class Batch(Value, frozen=True, kw_only=True):
    """The rollout batch of one training step: B trajectories in groups of G."""

    step: int
    trajectories: tuple[Trajectory, ...]

    def groups(self) -> dict[str, tuple[Trajectory, ...]]:
        """Trajectories by group id, groups in first-seen order."""
        out: dict[str, list[Trajectory]] = {}
        for t in self.trajectories:
            out.setdefault(t.group_id, []).append(t)
        return {k: tuple(v) for k, v in out.items()}

    def __iter__(self) -> Iterator[Trajectory]:
        return iter(self.trajectories)

    def __len__(self) -> int:
        return len(self.trajectories)

    @property
    def min_version(self) -> int:
        versions = [t.min_version for t in self.trajectories if t.n_generated]
        return min(versions) if versions else -1

    def staleness(self, trainer_version: int) -> int:
        """How many versions behind ``trainer_version`` the oldest token of the batch is."""
        return trainer_version - self.min_version if self.min_version >= 0 else 0

    def stats(self) -> dict[str, Any]:
        """Sizes and rewards, for logs."""
        n = max(1, len(self.trajectories))
        return {
            "trajectories": len(self.trajectories),
            "groups": len(self.groups()),
            "tokens": sum(t.n_tokens for t in self.trajectories),
            "generated": sum(t.n_generated for t in self.trajectories),
            "reward_mean": sum(t.reward for t in self.trajectories) / n,
            "env_s": sum(t.env_s for t in self.trajectories),
            "min_version": self.min_version,
        }


__all__ = ["Batch", "Trajectory", "Turn"]
