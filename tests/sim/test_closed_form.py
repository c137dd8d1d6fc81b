"""No elasticity: the simulator against the closed-form makespan models (eq. 1-3)."""

from __future__ import annotations

import dataclasses

import pytest

from pearl.sim.agreement import lockstep, prediction_errors, uniform
from pearl.sim.costs import EngineParams
from pearl.sim.scenario import scenario

# Where eq. 1's assumptions hold (identical trajectories in lockstep, colocated, no elasticity)
# the simulator and eq. 1 fed with the simulator's own cost coefficients agree within this.
LOCKSTEP_TOLERANCE = 0.05


@pytest.mark.parametrize("model", ["qwen3-8b", "qwen3-30b-a3b"])
@pytest.mark.parametrize("N", [1, 2, 4, 8])
def test_lockstep_colocated_agrees_with_eq1(model: str, N: int) -> None:
    sim, closed = lockstep(model, N, uniform(turns=6, batch=16, env_s=0.0))
    assert closed == pytest.approx(sim, rel=LOCKSTEP_TOLERANCE)


@pytest.mark.parametrize("N", [1, 2, 4, 8])
def test_lockstep_environment_lies_between_overlapped_and_added(N: int) -> None:
    """Trajectories in lockstep enter their tools together, so nothing fills the workers while
    they wait: the one case where work conservation (eq. 1's premise, which overlaps T_env with
    the other trajectories' prefill) does not hold. The simulator then lies between eq. 1 and eq.
    1 with T_env added whole (the paper's sum), and nearer the sum."""
    wl = uniform(turns=6, batch=16, env_s=0.5)
    sim, closed = lockstep("qwen3-8b", N, wl)
    work = lockstep("qwen3-8b", N, dataclasses.replace(wl, env_s=0.0))[1]
    added = work + (wl.turns - 1) * wl.env_s * EngineParams().time_scale
    assert closed * (1 - LOCKSTEP_TOLERANCE) <= sim <= added * (1 + LOCKSTEP_TOLERANCE)
    assert abs(sim - added) < abs(sim - closed)


def test_lockstep_agreement_can_fail() -> None:
    """Eq. 1 has no queueing at the KV limit: a batch whose KV does not fit disagrees."""
    sim, closed = lockstep("qwen3-8b", 1, uniform(turns=3, new=60_000, gen=20, batch=32))
    assert abs(closed / sim - 1) > LOCKSTEP_TOLERANCE


def test_decision_engine_prediction_error_is_reported_per_configuration(capsys) -> None:
    sc = scenario("qwen3-8b")
    configs = [(2, 0, 0), (4, 0, 0), (8, 0, 0), (0, 2, 2), (0, 3, 5)]
    rows = prediction_errors(sc, configs, seeds=(0,), batches=8)
    assert [r["config"] for r in rows] == ["2C", "4C", "8C", "2P2D", "3P5D"]
    with capsys.disabled():
        print("\ndecision engine vs simulator (calibrated Qwen3-8B workload):")
        for r in rows:
            print(
                f"  {r['config']:>5}: simulated {r['simulated_s']:7.0f} s, predicted "
                f"{r['predicted_s']:7.0f} s, error {100 * r['error']:+6.1f}%"
            )
    for r in rows:
        assert r["simulated_s"] > 0 and r["predicted_s"] > 0
    # Colocation with enough workers is where eq. 1 is meant to be accurate.
    big = next(r for r in rows if r["config"] == "8C")
    assert abs(big["error"]) < 0.25
