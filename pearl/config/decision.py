"""``[decision]`` and ``[gate]``: the PD Decision Engine's hysteresis and the borrowing gate."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DecisionConfig:
    """``[decision]``: the PD Decision Engine's hysteresis and limits (§4.3)."""

    mode_switch_threshold: float = 0.10
    """Relative gain needed to switch between colocation and disaggregation."""
    ratio_change_threshold: float = 0.03
    """Relative gain needed to change N_P:N_D."""
    ema_alpha: float = 0.3
    """Weight of a new step's telemetry in the workload profile (EMA)."""
    # Prefill keeps up (§4.2) when its busy time, lambda_P * t_prefill / N_P, is at most this share
    # of the decode-path time (eq. 2); beyond it prefill queues grow and delay decode.
    prefill_max_utilization: float = 0.9
    """Highest share of the decode-path time prefill may be busy (eq. 2), in (0, 1]."""


@dataclass(frozen=True)
class GateConfig:
    """``[gate]``: the benefit-aware gate for borrowing training GPUs (§4.6)."""

    enabled: bool = True
    """Gate borrowing by its benefit."""
    toggle_cost_s: float = 9.44
    """Prior T_toggle, in seconds: activation 6.26 s + return 3.18 s (Table 3)."""


__all__ = ["DecisionConfig", "GateConfig"]
