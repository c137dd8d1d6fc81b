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
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHES = sorted((ROOT / "benchmarks").glob("bench_*.py"))
# A ratio (1.23x; infx when the baseline is 0) or a JSON field; bench_vllm prints its ratio bare.
FIGURES = re.compile(r'(\d\.\d+|inf) ?x\b|"\w+": |PEARL / direct: \d\.\d+')
TIMEOUT_S = 240
PYTHONPATH = os.environ.get("PYTHONPATH", "")


def skip_reason(name: str) -> str | None:
    if name == "bench_vllm" and not (ROOT / ".venv-vllm" / "bin" / "python").exists():
        return "no .venv-vllm (make vllm)"
    if name == "bench_ray" and importlib.util.find_spec("ray") is None:
        return "ray is not installed (pip install -e '.[ray]')"
    return None


@pytest.mark.slow
@pytest.mark.parametrize("path", BENCHES, ids=lambda p: p.stem)
def test_benchmark_runs_in_its_small_mode(path: Path) -> None:
    if (why := skip_reason(path.stem)) is not None:
        pytest.skip(why)
    proc = subprocess.run(
        [sys.executable, str(path), "--small"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), PYTHONPATH)))},
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{path.name} --small exited {proc.returncode}:\n{out[-4000:]}"
    assert FIGURES.search(proc.stdout), f"{path.name} --small printed no figures:\n{out[-4000:]}"


def test_every_benchmark_is_found() -> None:
    """The glob above sees the benchmarks (a moved directory would silently test nothing)."""
    assert {"bench_decide", "bench_log", "bench_sim"} <= {p.stem for p in BENCHES}
