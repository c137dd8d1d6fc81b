"""Asynchronous multi-turn environments, task sets and the environment registry (paper §2.1).

A trajectory alternates generation and environment steps: ``p_{k+1} = p_k ⊕ r_k ⊕ o_k``. The
environment runs while the trajectory is out of the decode queue, so its time is real (a sandboxed
tool runs, or a latency is awaited) — that time is where the bubble ratio θ comes from.

One :class:`Environment` instance serves one trajectory: ``reset(task)`` returns the first
observation, then ``step(action)`` is called once per generated turn until ``done``.
"""

from __future__ import annotations

import dataclasses
import importlib
import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from typing import Any, overload

import msgspec

from pearl.core.errors import PearlError
from pearl.core.schema import Value


class EnvError(PearlError):
    """An environment cannot be built or used as asked (unknown name, bad option, bad state)."""


class Task(Value, frozen=True, kw_only=True):
    """One task: the prompt an environment starts from and the answer it checks against."""

    id: str
    prompt: str
    answer: str = ""
    meta: dict[str, Any] = msgspec.field(default_factory=dict)  # str/int/float values


class StepOutcome(Value, frozen=True, kw_only=True):
    """What one environment step returns: the next observation, its reward, and whether it ends."""

    observation: str
    reward: float
    done: bool
    info: dict[str, Any] = msgspec.field(default_factory=dict)


class Environment(ABC):
    """An async multi-turn environment; one instance per trajectory."""

    @abstractmethod
    async def reset(self, task: Task) -> str:
        """Start an episode on ``task``; return the first observation text."""

    @abstractmethod
    async def step(self, action: str) -> StepOutcome:
        """Apply the agent's action (the decoded turn); return observation, reward and done."""

    async def close(self) -> None:  # noqa: B027 - optional hook, most environments hold nothing
        """Release what the episode holds (subprocesses, files). Idempotent."""


class TaskSet(Sequence[Task]):
    """An ordered, immutable collection of tasks with seeded sampling."""

    def __init__(self, tasks: Sequence[Task], name: str = "") -> None:
        self._tasks = tuple(tasks)
        self.name = name
        self._by_id = {t.id: t for t in self._tasks}
        if len(self._by_id) != len(self._tasks):
            raise EnvError(f"task set {name!r} has duplicate task ids")

    def __len__(self) -> int:
        return len(self._tasks)

    @overload
    def __getitem__(self, i: int) -> Task: ...

    @overload
    def __getitem__(self, i: slice) -> tuple[Task, ...]: ...

    def __getitem__(self, i: int | slice) -> Task | tuple[Task, ...]:
        return self._tasks[i]

    def get(self, task_id: str) -> Task:
        """The task with this id (EnvError when unknown)."""
        try:
            return self._by_id[task_id]
        except KeyError:
            raise EnvError(f"task set {self.name!r} has no task {task_id!r}") from None

    def sample(self, n: int, seed: int) -> list[Task]:
        """``n`` tasks drawn with ``seed``: without replacement while the set lasts, then again."""
        out: list[Task] = []
        stream = self.stream(seed)
        for _ in range(n):
            out.append(next(stream))
        return out

    def stream(self, seed: int) -> Iterator[Task]:
        """An endless sequence of tasks: each epoch is a fresh seeded shuffle of the whole set."""
        if not self._tasks:
            raise EnvError(f"task set {self.name!r} is empty")
        rng = random.Random(seed)
        while True:
            order = list(self._tasks)
            rng.shuffle(order)
            yield from order


EnvFactory = Callable[..., Environment]
TaskFactory = Callable[..., TaskSet]  # called as factory(n=..., seed=..., **kwargs)


@dataclasses.dataclass(frozen=True)
class EnvSpec:
    name: str
    factory: EnvFactory
    tasks: TaskFactory | None = None
    description: str = ""


_REGISTRY: dict[str, EnvSpec] = {}
_BUILTINS_LOADED = False


def register_env(
    name: str,
    factory: EnvFactory,
    *,
    tasks: TaskFactory | None = None,
    description: str = "",
    replace: bool = False,
) -> None:
    """Make ``make_env(name, **kw)`` call ``factory(**kw)``; ``tasks(n=, seed=)`` makes tasks."""
    if not name or ":" in name:
        raise EnvError(f"environment name {name!r} must be non-empty and contain no ':'")
    if name in _REGISTRY and not replace:
        raise EnvError(f"environment {name!r} is already registered; pass replace=True")
    _REGISTRY[name] = EnvSpec(name=name, factory=factory, tasks=tasks, description=description)


def env_spec(name: str) -> EnvSpec:
    """The registered spec, or one imported from ``"package.module:attribute"``."""
    _load_builtins()
    if name in _REGISTRY:
        return _REGISTRY[name]
    if ":" in name:
        module, _, attr = name.partition(":")
        try:
            factory = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as e:
            raise EnvError(f"cannot import environment {name!r}: {e}") from None
        return EnvSpec(name, factory, getattr(factory, "tasks", None))
    raise EnvError(
        f"unknown environment {name!r}; registered: {list_envs()} "
        "(or give 'package.module:Factory')"
    )


def make_env(name: str, **kwargs: Any) -> Environment:
    """A new environment instance (one per trajectory)."""
    spec = env_spec(name)
    try:
        env = spec.factory(**kwargs)
    except TypeError as e:
        raise EnvError(f"environment {name!r} does not accept {sorted(kwargs)}: {e}") from None
    if not isinstance(env, Environment):
        raise EnvError(f"factory of {name!r} returned {type(env).__name__}, not an Environment")
    return env


def make_tasks(name: str, n: int = 256, seed: int = 0, **kwargs: Any) -> TaskSet:
    """The task set registered with environment ``name``."""
    spec = env_spec(name)
    if spec.tasks is None:
        raise EnvError(f"environment {name!r} was registered without a task set")
    return spec.tasks(n=n, seed=seed, **kwargs)


def list_envs() -> list[str]:
    """Names of the registered environments."""
    _load_builtins()
    return sorted(_REGISTRY)


def _load_builtins() -> None:
    global _BUILTINS_LOADED
    if not _BUILTINS_LOADED:
        _BUILTINS_LOADED = True
        importlib.import_module("pearl.rl.envs")  # registers tool_use and swe_like


__all__ = [
    "EnvError",
    "EnvFactory",
    "EnvSpec",
    "Environment",
    "StepOutcome",
    "Task",
    "TaskFactory",
    "TaskSet",
    "env_spec",
    "list_envs",
    "make_env",
    "make_tasks",
    "register_env",
]
