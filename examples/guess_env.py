"""Your own environment: guess a digit in at most three turns.

pearld runs it when ``[rl] env = "guess_env:GuessDigit"`` and this directory is importable:

    PYTHONPATH=examples pearld --config configs/local-cpu.toml --set rl.env=guess_env:GuessDigit

The factory is called once per trajectory (with ``max_turns`` when ``[rl] max_turns`` is set);
its ``tasks(n=, seed=)`` attribute makes the task set the Pipeline Scheduler draws from.
"""

import random

from pearl.rl.env import Environment, StepOutcome, Task, TaskSet


class GuessDigit(Environment):
    def __init__(self, max_turns: int = 3) -> None:
        self.max_turns, self.turn, self.answer = max_turns, 0, ""

    async def reset(self, task: Task) -> str:
        self.turn, self.answer = 0, task.answer
        return task.prompt

    async def step(self, action: str) -> StepOutcome:
        self.turn += 1
        if self.answer in action:
            return StepOutcome(observation="correct", reward=1.0, done=True)
        hint = "higher" if any(c.isdigit() and c < self.answer for c in action) else "lower"
        return StepOutcome(
            observation=f"no, try {hint}", reward=0.0, done=self.turn >= self.max_turns
        )

    @staticmethod
    def tasks(n: int = 256, seed: int = 0) -> TaskSet:
        rng = random.Random(seed)
        digits = [str(rng.randrange(10)) for _ in range(n)]
        prompts = [
            Task(id=f"guess-{i}", prompt="Guess my digit (0-9).", answer=d)
            for i, d in enumerate(digits)
        ]
        return TaskSet(prompts, name="guess-digit")
