"""The Runtime Tracker on the torch engine: after three steps its profile predicts the next one.

``pearl demo``'s job (tiny Qwen3 workers on virtual devices, the tool-use environment, real GRPO
steps) on a fixed colocated pool with no borrowing and no preemptible GPUs, so that the workers
do not change between the forecast and the step. The profile starts from the catalog roofline
(orders of magnitude off for a CPU slot); from the third step on it must come from measurements:
decode A and b, t_prefill, the prompt tokens really prefilled per turn (delta_P) and the
trajectories really in flight (B_flight).

How close the forecast comes is a measurement (``bench_demo.py``'s
``makespan_forecast_median_abs_error``), not a test: on shared cores a step's error moves with
whatever runs beside it. What this test holds is that from the fourth step on both predictions
come from the measured profile: their median is within a factor of 2 of the measured makespan,
either way (an under-prediction as far off as an over-prediction: the roofline under-predicts).
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from pearl import demo
from pearl.demo import makespan_errors

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "local-cpu.toml"
STEADY = (
    "daemon.pd=colocated",
    "daemon.borrow=never",
    "cluster.preemptible_gpus=",  # no trace events: the pool stays as it is
    "workload.batch=8",
    "rl.max_new_tokens=32",
)
FACTOR = 2.0  # the measured profile, not the roofline (many times too fast for a CPU slot)
STEPS = 7  # steps 4-7 are judged


def _median_factor(records: list[dict], field: str) -> tuple[float, list[float]]:
    """The median of max(p / m, m / p) over the judged steps, and their errors p / m - 1."""
    errors = makespan_errors(records, field, first_step=4)
    assert len(errors) == len(records) - 3, (field, records)  # every judged step has both
    return float(statistics.median(max(1 + e, 1 / (1 + e)) for e in errors)), errors


def test_prediction_after_three_steps_comes_from_the_measured_profile(tmp_path: Path) -> None:
    report = demo.run(CONFIG, STEPS, tmp_path / "run", overrides=STEADY, quiet=True)
    records = report["records"]
    assert len(records) == STEPS and not report["interrupted"]
    # Made before each batch was handed out, from the profile of the steps before it.
    forecast, errors = _median_factor(records, "forecast_makespan_s")
    assert forecast <= FACTOR, (forecast, errors)
    # The same profile for the workers and concurrency each batch really had.
    predicted, errors = _median_factor(records, "predicted_makespan_s")
    assert predicted <= FACTOR, (predicted, errors)
