"""Held-out evaluation: the current weights answer a fixed task set greedily, in the environment.

:class:`HeldOutEval` owns one in-process torch engine (not part of the elastic pool) and runs every
held-out task through :func:`pearl.rl.rollout.run_trajectory` at temperature 0 — the rollout path
of training, tool calls in the sandbox included — after loading the weights to evaluate. Accuracy
is the share of tasks whose trajectory earned the environment's full reward for a correct answer.
:class:`BackgroundEval` runs evaluations on a thread so that the training loop does not wait.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pearl.engines.base import SamplingParams
from pearl.rl.env import Task, make_env
from pearl.rl.rollout import engine_generate, run_trajectory

if TYPE_CHECKING:
    from pearl.engines.torch import TorchEngine
    from pearl.runtime import Weights


@dataclass
class HeldOutEval:
    env: str
    tasks: Sequence[Task]
    model_path: str = ""  # the model directory the run starts from ("" = preset + seed)
    preset: str = "tiny"
    seed: int = 0
    max_len: int = 1024
    max_new_tokens: int = 48
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    concurrency: int = 16  # trajectories at a time (each tool call is a sandbox process)
    correct: float = 1.0  # the reward of a correct answer
    _engine: TorchEngine | None = None

    def evaluate(self, weights: Weights | None, version: int) -> dict[str, Any]:
        """Accuracy of ``weights`` (a state dict; None: the starting weights) on the tasks."""
        from pearl.engines.torch import TorchEngine
        from pearl.rl.prompt import PromptBuilder
        from pearl.tokenizer import load_tokenizer

        t0 = time.monotonic()
        if self._engine is None:
            self._engine = TorchEngine(
                preset=self.preset,
                model_path=self.model_path,
                seed=self.seed,
                threads=1,
                kv_budget_bytes=16 << 20,
            )
            self._engine.start()
        if weights is not None and version > self._engine.weights_version:
            self._engine.load_weights(version, weights)
        builder = PromptBuilder(load_tokenizer(self.model_path or None), max_len=self.max_len)
        generate = engine_generate(self._engine, prefix=f"eval{version}")
        sampling = SamplingParams(max_new_tokens=self.max_new_tokens, temperature=0.0)

        async def all_tasks() -> list[float]:
            sem = asyncio.Semaphore(self.concurrency)

            async def one(i: int, task: Task) -> float:
                async with sem:
                    traj = await run_trajectory(
                        env=make_env(self.env, **self.env_kwargs),
                        task=task,
                        generate=generate,
                        builder=builder,
                        trajectory_id=f"eval{version}.{i}",
                        group_id=f"eval{version}",
                        sampling=sampling,
                    )
                    return traj.reward

            return list(await asyncio.gather(*(one(i, t) for i, t in enumerate(self.tasks))))

        rewards = asyncio.run(all_tasks())
        solved = sum(r >= self.correct for r in rewards)
        return {
            "accuracy": solved / len(rewards) if rewards else 0.0,
            "solved": solved,
            "tasks": len(rewards),
            "version": version,
            "seconds": time.monotonic() - t0,
        }

    def close(self) -> None:
        if self._engine is not None:
            self._engine.stop()
            self._engine = None


class BackgroundEval(threading.Thread):
    """Evaluations in submission order on one thread; :meth:`results` waits for all of them."""

    def __init__(self, evaluator: HeldOutEval) -> None:
        super().__init__(name="held-out-eval", daemon=True)
        self.evaluator = evaluator
        self.inbox: queue.Queue[tuple[int, Any, int] | None] = queue.Queue()
        self.done: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self.lock = threading.Lock()

    def submit(self, step: int, weights: Weights | None, version: int) -> None:
        """Evaluate ``weights`` (version ``version``) as the policy after training step ``step``."""
        self.inbox.put((step, weights, version))

    def run(self) -> None:
        while (item := self.inbox.get()) is not None:
            step, weights, version = item
            try:
                r = self.evaluator.evaluate(weights, version)
                with self.lock:
                    self.done.append({"step": step, **r})
            except Exception as e:  # an evaluation that fails is reported, not fatal to the run
                with self.lock:
                    self.errors.append(f"step {step}: {e}")
        self.evaluator.close()

    def latest(self) -> dict[str, Any] | None:
        with self.lock:
            return self.done[-1] if self.done else None

    def results(self, timeout_s: float = 300.0) -> list[dict[str, Any]]:
        """Every evaluation, once the pending ones are done (or ``timeout_s`` has passed)."""
        self.inbox.put(None)
        self.join(timeout_s)
        with self.lock:
            return sorted(self.done, key=lambda r: r["step"])


__all__ = ["BackgroundEval", "HeldOutEval"]
