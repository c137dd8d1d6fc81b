"""Discrete-event simulator of a whole PEARL cluster at paper scale (§6), driving the real
controller (:mod:`pearl.core.controller`) with simulated time.

Layers, bottom up: :mod:`workload` (SWE-bench-like GRPO batches), :mod:`costs` (per-iteration
roofline from the catalog), :mod:`worker` / :mod:`link` / :mod:`rollout` (fluid continuous
batching, KV transfers, routing, aborts), :mod:`executor` and :mod:`runner` (commands with
Table 3 latencies, the asynchronous RL loop, traces), :mod:`experiments` (the paper's
comparisons), :mod:`calibration` (the §3 targets) and :mod:`agreement` (closed-form checks).
See docs/simulator.md.
"""

from pearl.sim.availability import SEGMENTS, Availability
from pearl.sim.result import RunResult, StepRecord
from pearl.sim.runner import Simulation
from pearl.sim.scenario import MAIN_POLICIES, POLICIES, PolicySpec, Scenario, scenario

__all__ = [
    "MAIN_POLICIES",
    "POLICIES",
    "SEGMENTS",
    "Availability",
    "PolicySpec",
    "RunResult",
    "Scenario",
    "Simulation",
    "StepRecord",
    "scenario",
]
