"""What a run measured: per-step throughput (§6.1), the controller's plans, and the checks."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pearl.sim.availability import Availability


@dataclass(frozen=True)
class StepRecord:
    """Training step ``step``: finished at ``t_done``, ``duration_s`` after the previous one."""

    step: int
    t_done: float
    duration_s: float
    generated: int  # rollout generation tokens of its batch
    trained: int  # tokens the training step consumed
    rollout_s: float  # the batch's rollout makespan
    train_s: float
    wait_s: float  # how long training waited for borrowed GPUs to come back

    @property
    def tokens(self) -> int:
        return self.generated + self.trained

    @property
    def throughput(self) -> float:
        """§6.1: (generation + training tokens) / step duration."""
        return self.tokens / self.duration_s if self.duration_s > 0 else 0.0


@dataclass
class RunResult:
    policy: str
    model: str
    reserved_gpus: int
    availability: Availability
    seed: int
    steps: list[StepRecord] = field(default_factory=list)
    plans: list[tuple[float, str, str, int]] = field(default_factory=list)  # t, cause, target, n
    timeline: list[tuple[float, int, int, str]] = field(default_factory=list)  # t, ded, ovl, cfg
    return_waits: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    invariant_violations: int = 0
    late_returns: int = 0
    controller_events: int = 0
    events: int = 0
    ops: dict[str, int] = field(default_factory=dict)
    wall_s: float = 0.0

    def window(self) -> list[StepRecord]:
        """Steps that finished inside the trace window (0, duration]."""
        end = self.availability.duration_s
        return [s for s in self.steps if 0.0 < s.t_done <= end]

    @property
    def throughput(self) -> float:
        """Average system throughput: window tokens over the window steps' durations."""
        steps = self.window()
        span = sum(s.duration_s for s in steps)
        return sum(s.tokens for s in steps) / span if span > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        steps = self.window()
        return {
            "throughput_tok_s": round(self.throughput, 3),
            "steps": len(steps),
            "invariant_violations": self.invariant_violations,
            "late_returns": self.late_returns,
            "reserved_gpus": self.reserved_gpus,
            "mean_step_s": round(sum(s.duration_s for s in steps) / len(steps), 3)
            if steps
            else None,
            "mean_rollout_s": round(sum(s.rollout_s for s in steps) / len(steps), 3)
            if steps
            else None,
            "mean_train_s": round(sum(s.train_s for s in steps) / len(steps), 3) if steps else None,
            "max_return_wait_s": round(max(self.return_waits, default=0.0), 3),
            "plans": len([p for p in self.plans if p[0] >= 0]),
            "operations": dict(sorted(self.ops.items())),
            "per_step": [
                {
                    "step": s.step,
                    "t_done_s": round(s.t_done, 3),
                    "duration_s": round(s.duration_s, 3),
                    "generated": s.generated,
                    "trained": s.trained,
                    "rollout_s": round(s.rollout_s, 3),
                    "throughput_tok_s": round(s.throughput, 3),
                }
                for s in steps
            ],
            "errors": self.errors[:20],
            "wall_s": round(self.wall_s, 3),
        }


__all__ = ["RunResult", "StepRecord"]
