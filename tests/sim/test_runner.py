"""Whole runs: the real controller on a trace; determinism, checks, policies' resources."""

from __future__ import annotations

import dataclasses

import pytest

from pearl.core.policy import Borrow
from pearl.sim import availability as av
from pearl.sim.availability import Availability
from pearl.sim.runner import Simulation, roll_large_gpus
from pearl.sim.scenario import POLICIES, scenario

SC = scenario("qwen3-8b")


def _run(name: str, avail: Availability, **changes: object):  # type: ignore[no-untyped-def]
    sc = dataclasses.replace(SC, **changes) if changes else SC
    return Simulation(sc, POLICIES[name], avail).run()


@pytest.mark.slow
def test_deterministic_for_a_seed() -> None:
    a = av.load(segment_name="S1", minutes=60)
    r1, r2 = _run("pearl", a), _run("pearl", a)
    assert r1.steps == r2.steps and r1.plans == r2.plans
    r3 = _run("pearl", a, seed=1)
    assert r3.steps != r1.steps


@pytest.mark.parametrize("name", ["pearl", "rlboost+"])
def test_a_segment_has_no_invariant_violation_and_no_late_return(name: str) -> None:
    r = _run(name, av.load(segment_name="S2"))
    assert r.invariant_violations == 0, r.errors
    assert r.late_returns == 0
    assert len(r.window()) >= 4 and r.throughput > 0
    assert r.controller_events > 100


def test_pearl_borrows_and_returns_on_time() -> None:
    r = _run("pearl", Availability.constant(4, 7200))
    assert r.ops.get("ActivateWorker", 0) > 0 and r.ops.get("DeactivateWorker", 0) > 0
    assert max(r.return_waits) <= SC.return_bound_s
    assert r.late_returns == 0


def test_late_returns_are_counted() -> None:
    """Make deactivation slower than the bound: every borrowed return is late."""
    slow = dataclasses.replace(SC.costs, deactivate_s=SC.return_bound_s + 5)
    r = Simulation(
        dataclasses.replace(SC, costs=slow), POLICIES["pearl"], Availability.constant(0, 5400)
    ).run()
    assert r.late_returns > 0


@pytest.mark.slow
def test_baselines_use_their_fixed_resources() -> None:
    a = av.load(segment_name="S2")
    roll = _run("roll", a)
    assert roll.reserved_gpus == 4 and roll.plans == [roll.plans[0]]  # one start-up plan
    assert roll_large_gpus(a) == 10 == _run("roll-large", a).reserved_gpus
    assert POLICIES["rlboost+"].borrow is Borrow.NEVER
    rlb = _run("rlboost+", a)
    assert "ActivateWorker" not in rlb.ops and rlb.ops["StartWorker"] > 2  # follows the trace


def test_more_gpus_more_throughput() -> None:
    few = _run("rlboost+", Availability.constant(0, 5400))
    many = _run("rlboost+", Availability.constant(12, 5400))
    assert many.throughput > 1.3 * few.throughput
