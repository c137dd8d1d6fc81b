"""A real tool-use environment: arithmetic word problems solved with sandboxed tools.

Action syntax (tags are case-insensitive; the first tag in the action counts, the rest is ignored):

- ``<calc>2*(3+4)</calc>`` — a shell-free calculator: numbers, ``+ - * / // % **``, parentheses,
  ``abs round min max sqrt floor ceil`` (an AST whitelist, no ``eval``);
- ``<py>sum(range(10))</py>`` — one short Python expression with restricted builtins;
- ``<answer>42</answer>`` — the final answer; it ends the episode.

A missing closing tag at the end of the action is accepted (the model stopped early) but earns no
format bonus. Tool calls run in a sandboxed subprocess (:mod:`pearl.rl.envs.sandbox`); the tool's
output, or a clear error, is the next observation. The episode also ends after ``max_turns``.

Rewards (per step; a trajectory's reward is their sum), see :class:`Shaping`:

- a correct answer: ``correct`` (1.0);
- shaping, all of an episode together capped at ``cap`` (0.3) so a correct answer always
  dominates: ``answer_format`` (0.1) for a well-formed but wrong numeric answer, ``tool_format``
  (0.05) per well-formed tool call that ran without error, and ``charset`` (0.02) per turn times
  the fraction of the action's characters that belong to the tool syntax (digits, operators,
  brackets, the tag letters). The last term varies continuously with the text, so GRPO groups
  have reward variance even for a tiny random model, and it points toward the syntax.
"""

from __future__ import annotations

import asyncio
import random
import re
from dataclasses import dataclass

from pearl.rl.env import EnvError, Environment, StepOutcome, Task, TaskSet
from pearl.rl.envs.sandbox import SandboxLimits, run_tool

_TAG = re.compile(r"<(calc|py|answer)>(.*?)(</\1>|$)", re.S | re.I)
_SYNTAX = frozenset("0123456789+-*/%().<> \ncalpyanswer")


@dataclass(frozen=True)
class Shaping:
    correct: float = 1.0
    answer_format: float = 0.1
    tool_format: float = 0.05
    charset: float = 0.02
    cap: float = 0.3


NO_SHAPING = Shaping(answer_format=0.0, tool_format=0.0, charset=0.0, cap=0.0)  # reward = correct


@dataclass(frozen=True)
class Action:
    """A parsed action: kind is 'calc', 'py', 'answer' or 'none'."""

    kind: str
    body: str = ""
    closed: bool = False


def parse_action(text: str) -> Action:
    """The first tool call or answer in ``text``."""
    m = _TAG.search(text)
    if m is None:
        return Action("none")
    return Action(m.group(1).lower(), m.group(2).strip(), bool(m.group(3)))


def parse_number(text: str) -> float | None:
    """A number written the way people write answers ('1,234', '$56', '7.0'), else None."""
    cleaned = text.strip().replace(",", "").replace("$", "").replace(" ", "")
    try:
        return float(cleaned)
    except ValueError:
        return None


def is_correct(given: str, answer: str) -> bool:
    a, b = parse_number(given), parse_number(answer)
    if a is None or b is None:
        return given.strip() == answer.strip() != ""
    return abs(a - b) <= 1e-6 * max(1.0, abs(b))


def charset_fraction(text: str) -> float:
    """The fraction of characters of ``text`` that belong to the tool syntax (0 when empty)."""
    return sum(c in _SYNTAX for c in text.lower()) / len(text) if text else 0.0


INSTRUCTIONS = (
    "Solve the problem. Tools: <calc>expression</calc> evaluates arithmetic, "
    "<py>expression</py> evaluates one Python expression. Use one tool per turn, "
    "then give the final answer as <answer>number</answer>."
)


class ToolUseEnv(Environment):
    """Word problems with a calculator and a Python tool; one instance per trajectory."""

    def __init__(
        self,
        max_turns: int = 4,
        limits: SandboxLimits | None = None,
        shaping: Shaping | None = None,
        latency_s: float = 0.01,
        python_tool: bool = True,
        instructions: str = INSTRUCTIONS,
    ) -> None:
        if max_turns < 1:
            raise EnvError(f"max_turns must be at least 1, got {max_turns}")
        self.max_turns = max_turns
        self.limits = limits or SandboxLimits()
        self.shaping = shaping or Shaping()
        self.latency_s = latency_s  # a tool-service round trip, awaited on every step
        self.python_tool = python_tool
        self.instructions = instructions
        self.task: Task | None = None
        self.turn = 0
        self.shaped = 0.0
        self.done = False

    async def reset(self, task: Task) -> str:
        self.task, self.turn, self.shaped, self.done = task, 0, 0.0, False
        return f"{self.instructions}\nProblem: {task.prompt}"

    async def step(self, action: str) -> StepOutcome:
        if self.task is None or self.done:
            raise EnvError("step() before reset() or after the episode ended")
        self.turn += 1
        if self.latency_s > 0:
            await asyncio.sleep(self.latency_s)
        s = self.shaping
        act = parse_action(action)
        info: dict[str, object] = {"tool": act.kind, "turn": self.turn}
        bonus = s.charset * charset_fraction(action)
        reward, obs, done = 0.0, "", False
        if act.kind == "answer":
            done = True
            if is_correct(act.body, self.task.answer):
                reward, obs, info["correct"] = s.correct, "Correct.", True
            else:
                info["correct"] = False
                obs = "Incorrect."
                if act.closed and parse_number(act.body) is not None:
                    bonus += s.answer_format
        elif act.kind in ("calc", "py"):
            if act.kind == "py" and not self.python_tool:
                obs = "<error>the Python tool is disabled; use <calc></error>"
            else:
                run = await run_tool(act.kind, act.body, self.limits)
                info.update(ok=run.ok, killed=run.killed, tool_s=run.seconds, pid=run.pid)
                obs = f"<result>{run.output}</result>" if run.ok else f"<error>{run.output}</error>"
                if run.ok and act.closed:
                    bonus += s.tool_format
        else:
            obs = (
                "No tool call or answer found. Use <calc>...</calc>, <py>...</py> or "
                "<answer>...</answer>."
            )
        bonus = max(0.0, min(bonus, s.cap - self.shaped))
        self.shaped += bonus
        if not done and self.turn >= self.max_turns:
            done, info["truncated"] = True, True
        self.done = done
        return StepOutcome(observation=obs, reward=reward + bonus, done=done, info=info)


_NAMES = ("Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Goro", "Hana", "Ivan", "Jamal")
_ITEMS = ("apples", "stamps", "marbles", "books", "coins", "stickers", "pencils", "shells")


def word_problem(rng: random.Random, difficulty: int = 1) -> tuple[str, int, str]:
    """One (problem text, integer answer, expression) drawn from ``rng``."""
    hi = 10 * 10 ** max(0, difficulty - 1)
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    kind = rng.randrange(5)
    a, b, c = rng.randint(2, hi * 5), rng.randint(2, 9), rng.randint(2, hi)
    if kind == 0:
        d = rng.randint(1, a + b * c - 1)
        return (
            f"{name} has {a} {item}, buys {b} packs of {c} {item} each, then gives away {d}. "
            f"How many {item} does {name} have now?",
            a + b * c - d,
            f"{a} + {b}*{c} - {d}",
        )
    if kind == 1:
        return (
            f"A train runs {c} km per hour for {b} hours, then {a} km more. How many km does "
            "it travel in total?",
            c * b + a,
            f"{c}*{b} + {a}",
        )
    if kind == 2:
        per = rng.randint(2, hi)
        return (
            f"{name} shares {b * per} {item} equally among {b} friends and keeps {a} more. "
            f"How many {item} does each friend get, plus {name}'s {a}?",
            per + a,
            f"{b * per} // {b} + {a}",
        )
    if kind == 3:
        paid = b * c + rng.randint(0, hi * 3)
        return (
            f"{item.capitalize()} cost {c} dollars each. {name} buys {b} and pays {paid} "
            f"dollars. How much change does {name} get?",
            paid - b * c,
            f"{paid} - {b}*{c}",
        )
    d = rng.randint(1, hi)
    return f"Compute ({a} + {b}) * {c} - {d}.", (a + b) * c - d, f"({a} + {b})*{c} - {d}"


def arithmetic_tasks(n: int = 256, seed: int = 0, difficulty: int = 1) -> TaskSet:
    """``n`` seeded word problems with integer answers."""
    rng = random.Random(f"arith:{seed}:{difficulty}")
    tasks = []
    for i in range(n):
        text, answer, expr = word_problem(rng, difficulty)
        tasks.append(
            Task(id=f"arith-{seed}-{i}", prompt=text, answer=str(answer), meta={"expression": expr})
        )
    return TaskSet(tasks, name=f"arithmetic(seed={seed})")


# -- the demo's learnable task: one-digit counting problems, reward 1 for the right answer ---------
#
# ``tool_use_counts`` (registered in pearl.rl.envs) is this environment with the Python tool off,
# no shaping (a trajectory earns 1 for a correct answer, else 0) and one short instruction line,
# on problems a tiny byte-level model can copy into a tool call after a short warm start. The warm
# start's demonstrations (pearl.rl.warmstart) are recorded with both tools on; see docs/learning.md.

COUNT_INSTRUCTIONS = "Use <calc>, then <answer>."
_GAIN = ("gets", "finds", "buys", "wins")
_LOSS = ("loses", "gives away", "sells", "eats")
_ITEMS_SHORT = ("apples", "coins", "books", "shells", "stamps", "cards")


def count_problem(rng: random.Random, hi: int = 9) -> tuple[str, int, str]:
    """One (problem text, answer, expression): a count that goes up or down by one-digit steps."""
    op = rng.choice("+-")
    a, b = rng.randint(1, hi), rng.randint(1, hi)
    if op == "-" and b > a:
        a, b = b, a  # counts stay >= 0
    verb = rng.choice(_GAIN if op == "+" else _LOSS)
    name, item = rng.choice(_NAMES[:8]), rng.choice(_ITEMS_SHORT)
    answer = a + b if op == "+" else a - b
    return f"{name} has {a} {item} and {verb} {b}. How many now?", answer, f"{a}{op}{b}"


def count_tasks(n: int = 256, seed: int = 0, hi: int = 9) -> TaskSet:
    """``n`` seeded counting problems (operands 1..``hi``)."""
    rng = random.Random(f"count:{seed}:{hi}")
    tasks = []
    for i in range(n):
        text, answer, expr = count_problem(rng, hi)
        tasks.append(
            Task(id=f"count-{seed}-{i}", prompt=text, answer=str(answer), meta={"expression": expr})
        )
    return TaskSet(tasks, name=f"counts(seed={seed})")


def counts_env(max_turns: int = 4, python_tool: bool = False, **kwargs: object) -> ToolUseEnv:
    """The ``tool_use_counts`` environment: binary reward, short instructions, Python tool off."""
    kwargs.setdefault("shaping", NO_SHAPING)
    kwargs.setdefault("instructions", COUNT_INSTRUCTIONS)
    return ToolUseEnv(max_turns=max_turns, python_tool=python_tool, **kwargs)  # type: ignore[arg-type]


def expert_actions(task: Task, tool: str = "calc") -> list[str]:
    """A correct tool-call transcript's actions for ``task``: the tool call, then the answer."""
    expr = task.meta.get("expression")
    if not expr:
        raise EnvError(f"task {task.id!r} has no expression to demonstrate")
    return [f"<{tool}>{expr}</{tool}>", f"<answer>{task.answer}</answer>"]


__all__ = [
    "COUNT_INSTRUCTIONS",
    "INSTRUCTIONS",
    "NO_SHAPING",
    "Action",
    "Shaping",
    "ToolUseEnv",
    "arithmetic_tasks",
    "charset_fraction",
    "count_problem",
    "count_tasks",
    "counts_env",
    "expert_actions",
    "is_correct",
    "parse_action",
    "parse_number",
    "word_problem",
]
