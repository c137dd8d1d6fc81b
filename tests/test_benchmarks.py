"""Every benchmark runs to its end in its small mode (``--small``), so none can rot unseen.

Each runs in a subprocess as ``make bench`` would run it, and must exit 0 and print its figures:
a ratio (``1.23x``) or a JSON field. What the benchmarks measure is not checked here.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHES = sorted((ROOT / "benchmarks").glob("bench_*.py"))
# A ratio (1.23x; infx when the baseline is 0) or a JSON field; bench_vllm prints its ratio bare.
FIGURES = re.compile(r'(\d\.\d+|inf) ?x\b|"\w+": |PEARL / direct: \d\.\d+')
TIMEOUT_S = 480  # a smoke run's bound, not a figure: the suite runs beside it
# Seconds of each small mode alone on the 2-core machine: the longest start first, so that the
# two lanes end together, not one run alone.
SECONDS = {"bench_vllm": 51, "bench_demo": 35, "bench_ray": 34, "bench_notice": 20,
           "bench_learning": 23, "bench_gateway": 18, "bench_capacity": 16, "bench_engine": 12,
           "bench_pd": 12, "bench_device": 8, "bench_n": 6, "bench_structured": 6, "bench_log": 5,
           "bench_metrics": 5, "bench_pearld": 5, "bench_sim": 3}  # fmt: skip
PYTHONPATH = os.environ.get("PYTHONPATH", "")


def skip_reason(name: str) -> str | None:
    if name == "bench_vllm" and not (ROOT / ".venv-vllm" / "bin" / "python").exists():
        return "no .venv-vllm (make vllm)"
    if name == "bench_ray" and importlib.util.find_spec("ray") is None:
        return "ray is not installed (pip install -e '.[ray]')"
    if name == "bench_gateway" and importlib.util.find_spec("sglang_router") is None:
        return "sglang-router is not installed (pip install -e '.[test]')"
    return None


def run_small(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(path), "--small"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), PYTHONPATH)))},
    )


@pytest.fixture(scope="module")
def small_runs() -> Iterator[dict[str, Future[subprocess.CompletedProcess[str]]]]:
    """Every runnable benchmark's small mode, two at a time (most of their time is spent
    waiting on their own processes), the slowest first; each test waits for its own."""
    order = sorted(BENCHES, key=lambda p: -SECONDS.get(p.stem, 0))
    with ThreadPoolExecutor(max_workers=2) as pool:
        runs = {p.stem: pool.submit(run_small, p) for p in order if skip_reason(p.stem) is None}
        yield runs
        for f in runs.values():
            f.cancel()


@pytest.mark.slow
@pytest.mark.timeout(2 * TIMEOUT_S * len(BENCHES))
@pytest.mark.parametrize("path", BENCHES, ids=lambda p: p.stem)
def test_benchmark_runs_in_its_small_mode(
    path: Path, small_runs: dict[str, Future[subprocess.CompletedProcess[str]]]
) -> None:
    if (why := skip_reason(path.stem)) is not None:
        pytest.skip(why)
    proc = small_runs[path.stem].result()
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{path.name} --small exited {proc.returncode}:\n{out[-4000:]}"
    assert FIGURES.search(proc.stdout), f"{path.name} --small printed no figures:\n{out[-4000:]}"


def test_every_benchmark_is_found() -> None:
    """The glob above sees the benchmarks (a moved directory would silently test nothing)."""
    assert {"bench_decide", "bench_log", "bench_sim"} <= {p.stem for p in BENCHES}
