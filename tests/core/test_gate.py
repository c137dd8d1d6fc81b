"""Benefit-aware borrowing gate, eq. 7: (R / B)(T_ded - T_full) > T_toggle."""

from __future__ import annotations

import math

import msgspec
import pytest

from pearl.config import DecisionConfig
from pearl.core import events
from pearl.core.borrow import Verdict
from pearl.core.gate import GateResult, borrow_gate
from pearl.core.profile import RuntimeTracker
from tests.core.profiles import HAND

# For 4 dedicated workers only colocation fits (splits need 4 decode workers):
#   T_ded  = 10 * (1.6 + 100 * (0.01 + 0.001 * 16) + 0.2) + 50 = 94 s;
# with 4 overlap workers the best of 8 is colocation at 78 s. Saving 16 s.
P = msgspec.structs.replace(HAND, K_seq=1e9)
CFG = DecisionConfig()


def gate(R: int, T_toggle: float, N_ded: int = 4, N_overlap: int = 4) -> GateResult:
    return borrow_gate(
        profile=msgspec.structs.replace(P, T_toggle=T_toggle),
        N_ded=N_ded,
        N_overlap=N_overlap,
        R=R,
        cfg=CFG,
    )


def test_hand_computed_benefit() -> None:
    g = gate(R=32, T_toggle=5.0)
    assert (g.T_ded, g.T_full) == pytest.approx((94.0, 78.0))
    assert g.benefit_s == pytest.approx(8.0)  # 32/64 of the 16 s saving
    assert g.enabled and g.T_toggle == 5.0


def test_the_verdict_follows_the_gate() -> None:
    assert gate(R=32, T_toggle=5.0).verdict is Verdict.APPROVED
    assert gate(R=32, T_toggle=50.0).verdict is Verdict.DECLINED


def test_flips_exactly_at_the_boundary() -> None:
    benefit = gate(R=32, T_toggle=0.0).benefit_s
    assert not gate(R=32, T_toggle=benefit).enabled  # equality: off
    assert gate(R=32, T_toggle=math.nextafter(benefit, 0.0)).enabled
    assert not gate(R=32, T_toggle=math.nextafter(benefit, math.inf)).enabled


def test_fewer_remaining_trajectories_shrink_the_benefit() -> None:
    assert gate(R=64, T_toggle=9.44).enabled  # 16 s > 9.44 s
    assert not gate(R=32, T_toggle=9.44).enabled  # 8 s
    off = gate(R=0, T_toggle=0.0)
    assert not off.enabled and off.benefit_s == 0.0


def test_nothing_to_borrow_means_no_benefit() -> None:
    g = gate(R=64, T_toggle=0.0, N_overlap=0)
    assert not g.enabled and g.benefit_s == 0.0 and g.T_ded == g.T_full


def test_no_dedicated_workers_makes_borrowing_worth_it() -> None:
    """T_ded and the benefit have no prediction: None, never inf (JSON has none)."""
    g = gate(R=64, T_toggle=1e6, N_ded=0)
    assert g.enabled and g.T_ded is None and g.T_full == pytest.approx(94.0)
    assert g.benefit_s is None and "no dedicated rollout worker" in g.reason


def test_no_workers_at_all_has_no_prediction_and_no_benefit() -> None:
    g = gate(R=64, T_toggle=0.0, N_ded=0, N_overlap=0)
    assert not g.enabled and (g.T_ded, g.T_full, g.benefit_s) == (None, None, 0.0)
    idle = gate(R=0, T_toggle=0.0, N_ded=0)
    assert not idle.enabled and idle.T_ded is None and idle.benefit_s == 0.0


def test_measured_toggle_costs_close_the_gate() -> None:
    tracker = RuntimeTracker(msgspec.structs.replace(P, T_toggle=5.0), alpha=0.5, L_max=1e9)
    assert borrow_gate(profile=tracker.profile, N_ded=4, N_overlap=4, R=32, cfg=CFG).enabled
    s = events.Telemetry(
        step=1,
        batch=64,
        S=10.0,
        delta_L=1000.0,
        r=100.0,
        theta=1.0,
        A=0.01,
        b=0.001,
        t_prefill=1e-4,
        T_env=50.0,
        makespan_s=90.0,
        toggle_s=15.0,
    )
    tracker.observe(s)  # T_toggle -> 10 s > 8 s benefit
    g = borrow_gate(profile=tracker.profile, N_ded=4, N_overlap=4, R=32, cfg=CFG)
    assert g.T_toggle == pytest.approx(10.0) and not g.enabled


def test_a_window_about_to_close_is_declined() -> None:
    """Worth it by eq. 7 (8 s > 5 s), but the next batch is due in 9 s: activation would take
    more than half of what is left, and Training Begin would cut the borrow short."""
    p = msgspec.structs.replace(P, T_toggle=5.0)
    assert borrow_gate(
        profile=p, N_ded=4, N_overlap=4, R=32, cfg=CFG, window_left_s=10.0
    ).enabled  # 5 s = half: it fits
    g = borrow_gate(profile=p, N_ded=4, N_overlap=4, R=32, cfg=CFG, window_left_s=9.0)
    assert not g.enabled and g.window_left_s == 9.0 and g.benefit_s == pytest.approx(8.0)
    assert "expected complete in 9 s" in g.reason
    assert borrow_gate(
        profile=p, N_ded=4, N_overlap=4, R=32, cfg=CFG, window_left_s=None
    ).enabled  # not known: eq. 7 alone
    with pytest.raises(ValueError, match="window_left_s"):
        borrow_gate(profile=p, N_ded=4, N_overlap=4, R=32, cfg=CFG, window_left_s=-1.0)


@pytest.mark.parametrize(
    ("N_ded", "N_overlap", "R"), [(-1, 4, 1), (4, -1, 1), (4, 4, 65), (4, 4, -1)]
)
def test_bad_arguments(N_ded: int, N_overlap: int, R: int) -> None:
    with pytest.raises(ValueError):
        borrow_gate(profile=P, N_ded=N_ded, N_overlap=N_overlap, R=R, cfg=CFG)
