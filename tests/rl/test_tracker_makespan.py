"""The Runtime Tracker on the torch engine: after three steps its profile predicts the next one.

``pearl demo``'s job (tiny Qwen3 workers on virtual devices, the tool-use environment, real GRPO
steps) on a fixed colocated pool with no borrowing and no preemptible GPUs, so that the workers
do not change between the forecast and the step. The profile starts from the catalog roofline
(orders of magnitude off for a CPU slot); from the third step on it must come from measurements:
decode A and b, t_prefill, the prompt tokens really prefilled per turn (delta_P) and the
trajectories really in flight (B_flight). The benchmark (bench_demo.py) carries the tight figure.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pearl import demo

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


def test_prediction_after_three_steps_is_within_35_percent(tmp_path: Path) -> None:
    report = demo.run(CONFIG, 4, tmp_path / "run", overrides=STEADY, quiet=True)
    records = report["records"]
    assert len(records) == 4 and not report["interrupted"]
    fourth = records[3]
    measured = fourth["measured_makespan_s"]
    assert measured and measured > 0
    # Made before the fourth batch was handed out, from the profile of the first three steps.
    forecast = fourth["forecast_makespan_s"]
    assert forecast is not None
    assert abs(forecast / measured - 1) <= TOLERANCE, (forecast, measured, records)
    # The same profile for the workers and concurrency the batch really had.
    predicted = fourth["predicted_makespan_s"]
    assert predicted is not None
    assert abs(predicted / measured - 1) <= TOLERANCE, (predicted, measured, records)
