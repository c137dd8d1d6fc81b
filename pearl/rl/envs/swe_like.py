"""A synthetic SWE-like environment: the workload shape of the paper's SWE-bench runs, small.

An episode is a repository with a hidden test suite. Each agent action is classified as a *read*
(the observation is "file contents"), a *test* run ("test logs") or an *edit* (a short patch
acknowledgement): by keywords when the action names one (``test``/``pytest``, ``edit``/``patch``/
``diff``, ``submit`` ends the episode early), otherwise drawn from ``mix``. The number of turns,
the byte size of every observation and every latency (awaited for real, times ``time_scale``)
follow the configured distributions, drawn from a seeded generator.

Reward, at the end: the fraction of hidden tests that pass. Hidden test ``i`` passes when its
needle character (``task.meta["needles"][i]``) appears in any of the agent's actions, so the
reward is a deterministic function of the actions; ``info["resolved"]`` says whether all pass.
"""

from __future__ import annotations

import asyncio
import math
import random
import re
import string
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from pearl.rl.env import EnvError, Environment, StepOutcome, Task, TaskSet


@dataclass(frozen=True)
class Dist:
    """A 1-D distribution, clipped to [lo, hi]: const, uniform, randint, lognormal, exponential.

    ``a``/``b`` are: const (value, -), uniform and randint (low, high), lognormal (median, sigma),
    exponential (mean, -). ``from_spec`` builds one from a number or a TOML-style mapping.
    """

    kind: str
    a: float
    b: float = 0.0
    lo: float = -math.inf
    hi: float = math.inf

    KINDS = ("const", "uniform", "randint", "lognormal", "exponential")
    _PARAMS = {
        "const": ("value",),
        "uniform": ("low", "high"),
        "randint": ("low", "high"),
        "lognormal": ("median", "sigma"),
        "exponential": ("mean",),
    }

    def __post_init__(self) -> None:
        if self.kind not in self.KINDS:
            raise EnvError(f"distribution kind {self.kind!r} is not one of {self.KINDS}")

    def sample(self, rng: random.Random) -> float:
        k = self.kind
        if k == "const":
            x = self.a
        elif k == "uniform":
            x = rng.uniform(self.a, self.b)
        elif k == "randint":
            x = float(rng.randint(int(self.a), int(self.b)))
        elif k == "lognormal":
            x = rng.lognormvariate(math.log(self.a), self.b)
        else:
            x = rng.expovariate(1.0 / self.a)
        return min(max(x, self.lo), self.hi)

    def mean(self) -> float:
        """The mean before clipping."""
        k = self.kind
        if k == "const":
            return self.a
        if k in ("uniform", "randint"):
            return (self.a + self.b) / 2
        if k == "lognormal":
            return self.a * math.exp(self.b**2 / 2)
        return self.a

    @classmethod
    def from_spec(cls, spec: Dist | float | int | Mapping[str, Any]) -> Dist:
        """A Dist, a number (constant) or ``{"kind": "lognormal", "median": 4, "sigma": .5}``."""
        if isinstance(spec, Dist):
            return spec
        if isinstance(spec, int | float):
            return cls("const", float(spec))
        if not isinstance(spec, Mapping) or spec.get("kind") not in cls._PARAMS:
            raise EnvError(
                f"a distribution is a number or a mapping with kind in {cls.KINDS}, got {spec!r}"
            )
        kind = spec["kind"]
        names = cls._PARAMS[kind]
        extra = set(spec) - {"kind", "lo", "hi", *names}
        if extra or any(n not in spec for n in names):
            raise EnvError(f"{kind} takes {list(names)} (and lo, hi), got {sorted(spec)}")
        vals = [float(spec[n]) for n in names] + [0.0]
        return cls(
            kind,
            vals[0],
            vals[1],
            float(spec.get("lo", -math.inf)),
            float(spec.get("hi", math.inf)),
        )


def _ln(median: float, sigma: float, lo: float = -math.inf, hi: float = math.inf) -> Dist:
    return Dist(kind="lognormal", a=median, b=sigma, lo=lo, hi=hi)


@dataclass(frozen=True)
class SWEConfig:
    turns: Dist = Dist("randint", 3, 8)  # agent actions per episode
    prompt_bytes: Dist = _ln(median=1500, sigma=0.5, lo=200, hi=8000)  # issue text + repository map
    file_bytes: Dist = _ln(median=800, sigma=0.8, lo=64, hi=6000)  # a read's "file contents"
    log_bytes: Dist = _ln(median=400, sigma=1.0, lo=64, hi=6000)  # a test run's "test logs"
    edit_bytes: Dist = Dist("const", 80)  # a patch acknowledgement
    read_latency_s: Dist = _ln(median=0.02, sigma=0.5, lo=0.0, hi=0.5)
    test_latency_s: Dist = _ln(median=0.2, sigma=0.6, lo=0.0, hi=2.0)
    edit_latency_s: Dist = Dist("const", 0.01)
    mix: tuple[float, float, float] = (0.6, 0.3, 0.1)  # read, test, edit when no keyword says
    time_scale: float = 1.0  # multiplies every latency (0 = no waiting)

    @classmethod
    def build(cls, base: SWEConfig | None = None, **overrides: Any) -> SWEConfig:
        """``base`` (default: the defaults) with overrides in ``Dist.from_spec`` forms."""
        known = {f.name for f in fields(cls)}
        if bad := sorted(set(overrides) - known):
            raise EnvError(f"unknown swe_like option(s) {bad}; known: {sorted(known)}")
        conv: dict[str, Any] = {
            k: (Dist.from_spec(v) if k not in ("mix", "time_scale") else v)
            for k, v in overrides.items()
        }
        if "mix" in conv:
            mix = tuple(float(x) for x in conv["mix"])
            if len(mix) != 3 or min(mix) < 0 or sum(mix) <= 0:
                raise EnvError(
                    f"mix is three non-negative weights (read, test, edit), got "
                    f"{overrides['mix']!r}"
                )
            conv["mix"] = mix
        if "time_scale" in conv:
            conv["time_scale"] = float(conv["time_scale"])
        return replace(base or cls(), **conv)


# The same shape at the scale of a tiny model on CPU slots (the PD demo, configs/local-cpu-pd.toml):
# observations several times the tokens generated per turn, as in the paper's SWE-bench runs, but
# hundreds of bytes rather than thousands, and tool latencies of tens of milliseconds.
SMALL = SWEConfig(
    turns=Dist("randint", 3, 5),
    prompt_bytes=_ln(median=300, sigma=0.3, lo=120, hi=600),
    file_bytes=_ln(median=320, sigma=0.4, lo=96, hi=640),
    log_bytes=_ln(median=240, sigma=0.5, lo=64, hi=640),
    read_latency_s=_ln(median=0.03, sigma=0.5, lo=0.0, hi=0.2),
    test_latency_s=_ln(median=0.08, sigma=0.5, lo=0.0, hi=0.4),
)


def small_env(seed: int | None = None, **overrides: Any) -> SWELikeEnv:
    """``swe_like_small``: :class:`SWELikeEnv` on :data:`SMALL` (overrides still apply)."""
    return SWELikeEnv(seed, SMALL, **overrides)


_KEYWORDS = (
    ("submit", re.compile(r"submit", re.I)),
    ("test", re.compile(r"pytest|\btest", re.I)),
    ("edit", re.compile(r"edit|patch|diff", re.I)),
)


def classify(action: str) -> str | None:
    """'submit', 'test' or 'edit' when the action names one, else None."""
    for kind, pattern in _KEYWORDS:
        if pattern.search(action):
            return kind
    return None


@dataclass
class _Episode:
    task: Task
    rng: random.Random
    turns: int
    turn: int = 0
    actions: list[str] = field(default_factory=list)


class SWELikeEnv(Environment):
    """Synthetic repository repair; one instance per trajectory, seeded."""

    def __init__(
        self, seed: int | None = None, config: SWEConfig | None = None, **overrides: Any
    ) -> None:
        self.cfg = SWEConfig.build(config, **overrides)
        self.seed = seed
        self.ep: _Episode | None = None

    async def reset(self, task: Task) -> str:
        rng = random.Random(f"{self.seed}:{task.id}") if self.seed is not None else random.Random()
        c = self.cfg
        turns = max(1, int(round(c.turns.sample(rng))))
        self.ep = _Episode(task, rng, turns)
        n = int(c.prompt_bytes.sample(rng))
        head = f"Issue: {task.prompt}\nRepository files:\n"
        return _fill(head=head, n=n, rng=rng, line=_repo_line)

    async def step(self, action: str) -> StepOutcome:
        ep = self.ep
        if ep is None or ep.turn >= ep.turns:
            raise EnvError("step() before reset() or after the episode ended")
        c, rng = self.cfg, ep.rng
        ep.turn += 1
        ep.actions.append(action)
        kind = classify(action)
        if kind is None:
            kind = rng.choices(("read", "test", "edit"), weights=c.mix)[0]
        if kind == "submit" or ep.turn >= ep.turns:
            ep.turn = ep.turns
            return await self._finish(kind)
        size_d, lat_d, line = {
            "read": (c.file_bytes, c.read_latency_s, _code_line),
            "test": (c.log_bytes, c.test_latency_s, _log_line),
            "edit": (c.edit_bytes, c.edit_latency_s, _code_line),
        }[kind]
        latency = lat_d.sample(rng) * c.time_scale
        await asyncio.sleep(latency)
        n = int(size_d.sample(rng))
        head = {
            "read": f"$ cat src/mod_{rng.randrange(20)}.py\n",
            "test": "$ pytest -x\n",
            "edit": "Applied the patch.\n",
        }[kind]
        obs = _fill(head=head, n=n, rng=rng, line=line)
        return StepOutcome(
            observation=obs,
            reward=0.0,
            done=False,
            info={
                "kind": kind,
                "obs_bytes": len(obs.encode()),
                "latency_s": latency,
                "turn": ep.turn,
            },
        )

    async def _finish(self, kind: str) -> StepOutcome:
        """Run the hidden tests: reward = fraction passing."""
        ep = self.ep
        assert ep is not None
        c, rng = self.cfg, ep.rng
        latency = c.test_latency_s.sample(rng) * c.time_scale
        await asyncio.sleep(latency)
        needles = str(ep.task.meta.get("needles", ep.task.answer))
        text = "\n".join(ep.actions)
        passed = [ch in text for ch in needles]
        summary = "".join(
            f"tests/test_hidden.py::test_{i} {'PASSED' if ok else 'FAILED'}\n"
            for i, ok in enumerate(passed)
        )
        obs = _fill(
            head=f"$ pytest tests/test_hidden.py\n{summary}",
            n=int(c.log_bytes.sample(rng)),
            rng=rng,
            line=_log_line,
        )
        reward = sum(passed) / len(passed) if passed else 0.0
        return StepOutcome(
            observation=obs,
            reward=reward,
            done=True,
            info={
                "kind": "final",
                "final_action": kind,
                "passed": sum(passed),
                "tests": len(passed),
                "resolved": bool(passed) and all(passed),
                "obs_bytes": len(obs.encode()),
                "latency_s": latency,
                "turn": ep.turn,
            },
        )


def _fill(head: str, n: int, rng: random.Random, line: Callable[[random.Random], str]) -> str:
    """``head`` then generated lines, cut to exactly ``n`` bytes (never shorter than ``head``)."""
    parts, size = [head], len(head)
    while size < n:
        s = line(rng)
        parts.append(s)
        size += len(s)
    text = "".join(parts)
    return text[: max(n, len(head))]


def _repo_line(rng: random.Random) -> str:
    return f"  src/mod_{rng.randrange(20)}.py  tests/test_mod_{rng.randrange(20)}.py\n"


def _code_line(rng: random.Random) -> str:
    k, a, b = rng.randrange(100), rng.randrange(2, 10), rng.randrange(100)
    return f"def func_{k}(x):\n    return x * {a} + {b}\n"


def _log_line(rng: random.Random) -> str:
    ok = "PASSED" if rng.random() < 0.8 else "FAILED"
    return f"tests/test_mod_{rng.randrange(20)}.py::test_case_{rng.randrange(50)} {ok}\n"


def swe_tasks(n: int = 64, seed: int = 0, n_tests: int = 4) -> TaskSet:
    """``n`` synthetic repository issues, each with ``n_tests`` hidden needle characters."""
    rng = random.Random(f"swe:{seed}")
    alphabet = string.ascii_lowercase + string.digits
    tasks = []
    for i in range(n):
        needles = "".join(rng.choice(alphabet) for _ in range(n_tests))
        mod = rng.randrange(20)
        prompt = (
            f"func_{rng.randrange(100)} in src/mod_{mod}.py returns the wrong value; "
            f"make tests/test_mod_{mod}.py pass."
        )
        tasks.append(
            Task(id=f"swe-{seed}-{i}", prompt=prompt, answer=needles, meta={"needles": needles})
        )
    return TaskSet(tasks, name=f"swe_like(seed={seed})")


__all__ = ["SMALL", "Dist", "SWEConfig", "SWELikeEnv", "classify", "small_env", "swe_tasks"]
