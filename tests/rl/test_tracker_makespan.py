"""The Runtime Tracker on the torch engine: after three steps its profile predicts the next one.

``pearl demo``'s job (tiny Qwen3 workers on virtual devices, the tool-use environment, real GRPO
steps) on a fixed colocated pool with no borrowing and no preemptible GPUs, so that the workers
do not change between the forecast and the step. The profile starts from the catalog roofline
(orders of magnitude off for a CPU slot); from the third step on it must come from measurements:
decode A and b, t_prefill, the prompt tokens really prefilled per turn (delta_P) and the
trajectories really in flight (B_flight). The benchmark (bench_demo.py) carries the tight figure.

One step alone is a coin, not a measurement: a batch of 8 ends with its longest trajectory (a
random maximum of turns, tokens and environment time) and overlaps the next batch by chance of
the pipeline. And the first two batches start together at t = 0 and wait for the worker's cold
start (B_flight 16, against 11-14 from step 3 on), which the EMA carries into the next few
forecasts. Over 30 steps (3-8 of five runs) single-step errors spread -4..+67% (forecast, median
22%, highest at steps 3-6) and -11..+37% (the batch's own workers and concurrency, median 12%); one
step 4 failed CI at -39% when the test judged it alone. So the test takes the median of seven
steps, each predicted from all the steps before it, from the fourth step on (medians 2-21% in five
runs; 4-17% in five once the virtual devices stopped billing the host's noise).
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
TOLERANCE = 0.35
STEPS = 10  # steps 4-10 are judged


def _median_abs_error(records: list[dict], field: str) -> tuple[float, list[float]]:
    errors = makespan_errors(records, field, first_step=4)
    assert len(errors) == len(records) - 3, (field, records)  # every judged step has both
    return float(statistics.median(abs(e) for e in errors)), errors


def test_prediction_after_three_steps_is_within_35_percent(tmp_path: Path) -> None:
    report = demo.run(CONFIG, STEPS, tmp_path / "run", overrides=STEADY, quiet=True)
    records = report["records"]
    assert len(records) == STEPS and not report["interrupted"]
    # Made before each batch was handed out, from the profile of the steps before it.
    forecast, errors = _median_abs_error(records, "forecast_makespan_s")
    assert forecast <= TOLERANCE, (forecast, errors)
    # The same profile for the workers and concurrency each batch really had.
    predicted, errors = _median_abs_error(records, "predicted_makespan_s")
    assert predicted <= TOLERANCE, (predicted, errors)
