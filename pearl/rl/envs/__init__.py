"""Built-in environments, registered on import: ``tool_use``, ``tool_use_counts``, ``swe_like``,
``swe_like_small``."""

from pearl.rl.env import register_env
from pearl.rl.envs.swe_like import Dist, SWEConfig, SWELikeEnv, small_env, swe_tasks
from pearl.rl.envs.tool_use import Shaping, ToolUseEnv, arithmetic_tasks, count_tasks, counts_env

register_env(
    "tool_use",
    ToolUseEnv,
    tasks=arithmetic_tasks,
    replace=True,
    description="arithmetic word problems with a sandboxed calculator and Python tool",
)
register_env(
    "tool_use_counts",
    counts_env,
    tasks=count_tasks,
    replace=True,
    description="one-digit counting problems, calculator only, reward 1 for the answer",
)
register_env(
    "swe_like",
    SWELikeEnv,
    tasks=swe_tasks,
    replace=True,
    description="synthetic repository repair with SWE-bench-shaped turns and latencies",
)
register_env(
    "swe_like_small",
    small_env,
    tasks=swe_tasks,
    replace=True,
    description="swe_like at the scale of a tiny model on CPU slots (the PD demo)",
)

__all__ = [
    "Dist",
    "SWEConfig",
    "SWELikeEnv",
    "Shaping",
    "ToolUseEnv",
    "arithmetic_tasks",
    "count_tasks",
    "counts_env",
    "small_env",
    "swe_tasks",
]
