"""Agentic RL on PEARL: environments, trajectories, prompts, the weight store and a GRPO trainer.

The pipeline that runs trajectories through the Router lives in ``pearl.rl.pipeline``.
"""

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
