"""Agentic RL on PEARL: environments, trajectories, prompts, the weight store and a GRPO trainer.

Names are imported lazily, so ``import pearl.rl.env`` (the pipeline, the daemon) does not pay
for torch; the trainer loads it when first used. The pipeline that runs trajectories through the
Router lives in ``pearl.rl.pipeline``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pearl.rl.env import (
        EnvError,
        Environment,
        EnvSpec,
        StepOutcome,
        Task,
        TaskSet,
        env_spec,
        list_envs,
        make_env,
        make_tasks,
        register_env,
    )
    from pearl.rl.grpo import GRPOConfig, GRPOTrainer, TrainerError, group_advantages
    from pearl.rl.prompt import ChatTemplate, PromptBuilder
    from pearl.rl.rollout import GenerateFn, engine_generate, run_trajectory
    from pearl.rl.trajectory import Batch, Trajectory, Turn
    from pearl.rl.weights import WeightStore, WeightStoreError

_HOME = {
    "pearl.rl.env": [
        "EnvError",
        "EnvSpec",
        "Environment",
        "StepOutcome",
        "Task",
        "TaskSet",
        "env_spec",
        "list_envs",
        "make_env",
        "make_tasks",
        "register_env",
    ],
    "pearl.rl.grpo": ["GRPOConfig", "GRPOTrainer", "TrainerError", "group_advantages"],
    "pearl.rl.prompt": ["ChatTemplate", "PromptBuilder"],
    "pearl.rl.rollout": ["GenerateFn", "engine_generate", "run_trajectory"],
    "pearl.rl.trajectory": ["Batch", "Trajectory", "Turn"],
    "pearl.rl.weights": ["WeightStore", "WeightStoreError"],
}
_WHERE = {name: module for module, names in _HOME.items() for name in names}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'pearl.rl' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "Batch",
    "ChatTemplate",
    "EnvError",
    "EnvSpec",
    "Environment",
    "GRPOConfig",
    "GRPOTrainer",
    "GenerateFn",
    "PromptBuilder",
    "StepOutcome",
    "Task",
    "TaskSet",
    "TrainerError",
    "Trajectory",
    "Turn",
    "WeightStore",
    "WeightStoreError",
    "engine_generate",
    "env_spec",
    "group_advantages",
    "list_envs",
    "make_env",
    "make_tasks",
    "register_env",
    "run_trajectory",
]
