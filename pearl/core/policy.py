"""Which decisions the controller makes: PEARL's, or a baseline's or an ablation's.

PEARL decides the PD mode and ratio with the PD Decision Engine (§4.3) and borrows training GPUs
through the benefit-aware gate (§4.6). The baselines and ablations of §6 run the *same* controller
with other choices: always colocated (ROLL, RLBoost+), always disaggregated at the best ratio
(ablation A), borrowing never (RLBoost+), always (ungated toggle, ablation B) or gated (C).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol

import msgspec

from pearl.core.decision import Decision, DecisionParams, decide
from pearl.core.events import Telemetry
from pearl.core.gate import GateResult, borrow_gate
from pearl.core.makespan import T_coloc
from pearl.core.profile import RuntimeTracker, WorkloadProfile
from pearl.core.state import Mode, Target


class PD(enum.StrEnum):
    ADAPTIVE = "adaptive"  # the PD Decision Engine
    COLOCATED = "colocated"  # every worker colocated
    DISAGGREGATED = "disaggregated"  # forced disaggregation at the best feasible ratio


class Borrow(enum.StrEnum):
    GATED = "gated"  # eq. 7
    ALWAYS = "always"  # ungated toggle
    NEVER = "never"


class _EngineKnobs(Protocol):
    @property
    def colocated_only(self) -> bool: ...


class _DaemonKnobs(Protocol):
    @property
    def pd(self) -> PD: ...
    @property
    def borrow(self) -> Borrow: ...


class _DecisionKnobs(DecisionParams, Protocol):
    @property
    def ema_alpha(self) -> float: ...


class _WorkloadKnobs(Protocol):
    @property
    def max_trajectory_tokens(self) -> int: ...


class PolicyConfig(Protocol):
    """What :meth:`Policy.of_config` reads; :class:`pearl.config.Config` has it all (core does
    not import the config)."""

    @property
    def engine(self) -> _EngineKnobs: ...
    @property
    def daemon(self) -> _DaemonKnobs: ...
    @property
    def decision(self) -> _DecisionKnobs: ...
    @property
    def workload(self) -> _WorkloadKnobs: ...


@dataclass(frozen=True)
class Policy:
    decision: DecisionParams
    pd: PD = PD.ADAPTIVE
    borrow: Borrow = Borrow.GATED
    alpha: float = 0.3  # EMA weight of a new step's telemetry
    L_max: float = 32768.0  # maximum trajectory length (caps K_seq)

    @classmethod
    def of_config(cls, cfg: PolicyConfig) -> Policy:
        """The policy a pearld with this :class:`pearl.config.Config` runs (``daemon.pd``,
        ``daemon.borrow``, the decision knobs); core reads it without importing the config."""
        # A pool that serves colocated only (vLLM) is colocated at every budget.
        pd = PD.COLOCATED if cfg.engine.colocated_only else PD(cfg.daemon.pd)
        return cls(
            cfg.decision,
            pd=pd,
            borrow=Borrow(cfg.daemon.borrow),
            alpha=cfg.decision.ema_alpha,
            L_max=cfg.workload.max_trajectory_tokens,
        )

    def decide(self, profile: WorkloadProfile, N: int, current: Target | None) -> Decision:
        """Target for N workers under this policy (hysteresis against ``current``)."""
        if self.pd is PD.ADAPTIVE or N <= 1:
            d = decide(profile=profile, N=N, current=current, cfg=self.decision)
            if self.pd is PD.ADAPTIVE or d.target.mode is Mode.COLOCATED:
                return d
        if self.pd is PD.COLOCATED:
            target = Target(mode=Mode.COLOCATED, N_P=0, N_D=0, N_C=N)
            alternatives = decide(
                profile=profile, N=N, current=None, cfg=self.decision
            ).alternatives
            return Decision(
                target=target,
                predicted_makespan_s=float(T_coloc(profile, N)),
                alternatives=alternatives,
                reason="policy: colocated",
            )
        # Forced disaggregation: the best feasible split, ignoring colocation.
        d = decide(profile=profile, N=N, current=None, cfg=_NoModeSwitch(self.decision))
        splits = [a for a in d.alternatives if a.mode is Mode.DISAGGREGATED and a.feasible]
        if not splits:
            splits = [a for a in d.alternatives if a.mode is Mode.DISAGGREGATED]
        if not splits:
            return d
        best = min(splits, key=lambda a: a.predicted_makespan_s)
        return Decision(
            target=best.target,
            predicted_makespan_s=best.predicted_makespan_s,
            alternatives=d.alternatives,
            reason="policy: disaggregated",
        )

    def gate(
        self,
        profile: WorkloadProfile,
        N_ded: int,
        N_full: int,
        R: int,
        window_left_s: float | None = None,
    ) -> GateResult:
        """Whether to borrow the training GPUs (N_full - N_ded overlap workers) now;
        ``window_left_s``: when the next batch is expected complete (see :func:`borrow_gate`)."""
        result = borrow_gate(
            profile=profile,
            N_ded=N_ded,
            N_overlap=N_full - N_ded,
            R=min(max(R, 0), profile.B),
            cfg=self.decision,
            window_left_s=window_left_s,
        )
        if self.borrow is Borrow.GATED:
            return result
        return msgspec.structs.replace(
            result,
            enabled=self.borrow is Borrow.ALWAYS and N_full > N_ded,
            reason=f"policy: borrow {self.borrow.value} (gate: {result.reason})",
        )

    def observe(self, profile: WorkloadProfile, summary: Telemetry) -> WorkloadProfile:
        """The profile after one more step's telemetry (EMA, §4.3.2)."""
        return RuntimeTracker(profile, self.alpha, self.L_max).observe(summary)


@dataclass(frozen=True)
class _NoModeSwitch:
    """Decision knobs for forced disaggregation: no hysteresis, same constraints."""

    inner: DecisionParams

    @property
    def mode_switch_threshold(self) -> float:
        return 0.0

    @property
    def ratio_change_threshold(self) -> float:
        return 0.0

    @property
    def prefill_max_utilization(self) -> float:
        return self.inner.prefill_max_utilization


__all__ = ["PD", "Borrow", "Policy", "PolicyConfig"]
