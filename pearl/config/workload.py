"""``[model]`` and ``[workload]``: what is trained and served, and the rollout workload's priors."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelConfig:
    """``[model]``: the model being trained and served."""

    name: str = "qwen3-8b"
    """Model name in the catalog (sets the cost model's priors)."""


@dataclass(frozen=True)
class WorkloadConfig:
    """``[workload]``: the rollout workload, and priors for its profile until telemetry comes."""

    batch: int = 64
    """Trajectories per rollout batch (B)."""
    group_size: int = 16
    """Trajectories per task (a GRPO group)."""
    max_trajectory_tokens: int = 32768
    """Longest trajectory, in tokens (L_max)."""
    staleness: int = 1
    """Training steps a rollout may lag behind the weights."""
    turns: float = 30.0
    """Prior: turns per trajectory (S)."""
    new_tokens_per_turn: float = 600.0
    """Prior: tokens each turn adds to the context (delta_L)."""
    generated_tokens_per_turn: float = 250.0
    """Prior: tokens generated per turn (r)."""
    env_s: float = 60.0
    """Prior: environment time over a whole step (T_env), in seconds."""
    theta: float = 0.5
    """Prior: bubble ratio (1 - f) / f, f the share of trajectories decoding (theta)."""
    turn_overhead_s: float = 0.5
    """Prior: per-turn prefill/decode switching cost under colocation (T_over), in seconds."""


__all__ = ["ModelConfig", "WorkloadConfig"]
