"""``[rl]`` and ``[demo]``: the Pipeline Scheduler's environment and sampling; ``pearl demo``."""

from __future__ import annotations

from dataclasses import dataclass

from pearl.core.errors import ConfigError


@dataclass(frozen=True)
class RLConfig:
    """``[rl]``: the Pipeline Scheduler's environment and sampling."""

    env: str = ""
    """The environment the Pipeline Scheduler runs, a name or ``module:Factory``; "": none."""
    tasks: int = 256
    """Size of the environment's task set."""
    seed: int = 0
    """Seed of the task order and sampling."""
    max_turns: int = 0
    """Turns per trajectory (0: the environment's default)."""
    max_new_tokens: int = 48
    """Tokens generated per turn, at most."""
    temperature: float = 1.0
    """Sampling temperature."""
    top_p: float = 1.0
    """Nucleus sampling: top-p."""


@dataclass(frozen=True)
class DemoConfig:
    """``[demo]``: what ``pearl demo`` runs on top of the runtime (its flags override)."""

    env: str = "tool_use_counts"
    """The environment the demo learns on ("": ``rl.env`` as it is)."""
    warm_start: bool = True
    """A supervised warm start first (tool_use_counts only)."""
    eval_every: int = 4
    """Held-out evaluation every N training steps, and after the last (0: none)."""
    segment: str = "S2"
    """The Bamboo trace segment the preemptible workers follow."""
    budget: str = ""
    """Scripted budget instead of the segment: "STEP:N,..." preemptible GPUs from STEP on."""
    trace_s: float = 0.0
    """Seconds the segment is squeezed into (``--trace-s``); 0: 4 s per step."""


def parse_budget(text: str, preemptible: int, where: str = "demo.budget") -> list[tuple[int, int]]:
    """``"1:0,5:2,11:0"`` -> [(1, 0), (5, 2), (11, 0)]: steps strictly increasing from 1,
    counts within the ``preemptible`` GPUs."""
    out: list[tuple[int, int]] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        step, sep, n = part.partition(":")
        try:
            pair = (int(step), int(n))
        except ValueError:
            pair = (0, -1)
        if not sep or pair[0] < 1 or pair[1] < 0:
            raise ConfigError(
                f"{where}: {part!r} is not STEP:COUNT (a training step >= 1 and a number of "
                'preemptible GPUs >= 0), e.g. "1:0,5:2,11:0"'
            )
        if out and pair[0] <= out[-1][0]:
            raise ConfigError(f"{where}: steps must increase; {part!r} follows step {out[-1][0]}")
        if pair[1] > preemptible:
            raise ConfigError(
                f"{where}: {part!r} asks for {pair[1]} preemptible GPUs; "
                f"cluster.preemptible_gpus has {preemptible}"
            )
        out.append(pair)
    return out


__all__ = ["DemoConfig", "RLConfig", "parse_budget"]
