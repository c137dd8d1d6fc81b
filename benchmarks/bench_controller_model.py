"""Nightly-style soak of the controller model (pearl/testing/controller_model.py).

`make test` runs >= 10,000 model steps; this runs as many as asked and prints the steps taken,
the violations found (0, or 1 with the shrunk failing sequence) and the rate. It is a soak, not
a timing: its figure is the count of violations, which must stay 0.

    python benchmarks/bench_controller_model.py [--examples 2000] [--steps 200] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hypothesis import HealthCheck, settings  # noqa: E402
from hypothesis.stateful import run_state_machine_as_test  # noqa: E402

from pearl.testing import controller_model as model  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--examples", type=int, default=2000)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--json", type=Path)
    p.add_argument("--small", action="store_true", help="30 examples of 30 steps (a smoke run)")
    a = p.parse_args()
    if a.small:
        a.examples, a.steps = 30, 30
    t0 = time.perf_counter()
    error = None
    try:
        run_state_machine_as_test(
            model.ControllerModel,
            settings=settings(
                max_examples=a.examples,
                stateful_step_count=a.steps,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            ),
        )
    except Exception as e:  # the shrunk failing sequence is in the message
        error = f"{type(e).__name__}: {e}"
    wall = time.perf_counter() - t0
    out = {
        "examples": a.examples,
        "steps": model.STEPS_RUN[0],
        "violations": 0 if error is None else 1,
        "steps_per_s": round(model.STEPS_RUN[0] / wall, 1),
        "error": error,
    }
    print(json.dumps(out, indent=2))
    if a.json:
        a.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0 if error is None else 1


if __name__ == "__main__":
    sys.exit(main())
