"""Crash at every write: a real child process dies at the n-th failpoint, for every n.

After each crash the log replays to exactly what was acknowledged, or that plus the one batch
that was in flight (written but not yet acknowledged); never less, never anything torn.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pearl.core.fold import replay
from pearl.log import FileLog, failpoints

from .crash_child import batches

BATCHES = 12
ROOT = Path(__file__).resolve().parents[2]


def run_child(path: Path, point: str | None, n: int) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop(failpoints.ENV, None)
    if point is not None:
        env[failpoints.ENV] = f"{point}:{n}"
    return subprocess.run(
        [sys.executable, "-m", "tests.log.crash_child", str(path), str(BATCHES)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.slow
@pytest.mark.parametrize("point", sorted(failpoints.POINTS))
def test_crash_at_every_failpoint(tmp_path: Path, point: str) -> None:
    stream = batches(BATCHES + 1)
    records = [r for b in stream for r in b]
    ends = [0]
    for b in stream:
        ends.append(ends[-1] + len(b))
    crashes = 0
    for n in range(1, 200):
        path = tmp_path / f"{point}-{n}"
        child = run_child(path, point, n)
        lines = [line.split() for line in child.stdout.splitlines()]
        acks = [int(seq) for what, seq in lines if what == "ack"]
        snaps = [int(seq) for what, seq in lines if what == "snap"]
        acked = acks[-1] if acks else 0
        if child.returncode == 0:
            assert acked == ends[BATCHES]
            break
        assert child.returncode == failpoints.EXIT_CODE, child.stderr
        crashes += 1
        with FileLog(path) as log:
            loaded = log.load()
            state = loaded.state
            assert loaded.snapshot_seq == (snaps[-1] if snaps else 0)
            in_flight = ends[ends.index(acked) + 1]
            assert state.seq in (acked, in_flight), (point, n, acked, state.seq)
            if point in ("before-write", "snapshot-rename"):
                assert state.seq == acked  # nothing of the next batch reached the file
            assert state == replay(records[: state.seq])
            assert not list(path.glob("*.tmp"))  # a half-written snapshot never survives
            k = ends.index(state.seq)
            log.append(stream[k])  # the recovered log takes the next batch
        with FileLog(path) as log:
            assert log.repaired is None
            assert log.load().state == replay(records[: ends[k + 1]])
    else:
        pytest.fail("the child never completed")
    expected = BATCHES // 4 if point == "snapshot-rename" else BATCHES
    assert crashes == expected
