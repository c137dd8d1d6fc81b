"""Logs written before the msgspec codec (format 1, schema version 1) still open and replay.

``data/v1-log`` was written by the hand-written converter that preceded msgspec (see
``data/make_v1_log.py``): 406 records of the realistic stream (every record kind but
gpus-reclaimed) and a snapshot at seq 251. ``v1-log.expected.json`` holds what that code read
back: every record's wire mapping and the final table.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from pearl.core import events as ev
from pearl.core.fold import replay
from pearl.core.schema import to_wire
from pearl.log import FileLog, verify
from pearl.log.snapshot import state_to_snapshot

DATA = Path(__file__).parent / "data"
EXPECTED = json.loads((DATA / "v1-log.expected.json").read_text())


def _plain(x: Any) -> Any:
    return json.loads(json.dumps(x))


@pytest.fixture
def v1_log(tmp_path: Path) -> Path:
    """A private copy (a writer takes a lock file and may repair; the fixture stays pristine)."""
    dst = tmp_path / "v1-log"
    shutil.copytree(DATA / "v1-log", dst)
    return dst


def test_replays_to_the_same_state(v1_log: Path) -> None:
    with FileLog(v1_log, readonly=True) as log:
        assert log.last_seq == EXPECTED["last_seq"]
        assert log.snapshots() == [EXPECTED["snapshot_seq"]]
        loaded = log.load()
        assert loaded.snapshot_seq == EXPECTED["snapshot_seq"]
        assert loaded.extra == {"note": "written by the v1 codec", "step": 3}
        records = [r for _, r in log.read()]
    assert _plain(state_to_snapshot(loaded.state)) == EXPECTED["state"]
    assert replay(records) == loaded.state  # from seq 1, without the snapshot
    assert _plain([to_wire(r) for r in records]) == EXPECTED["records"]


def test_verifies(v1_log: Path) -> None:
    verdict = verify(v1_log)
    assert verdict.ok, verdict.problem
    assert verdict.records == EXPECTED["last_seq"]


def test_a_writer_appends_after_the_old_records(v1_log: Path) -> None:
    with FileLog(v1_log) as log:
        assert log.repaired is None
        state = log.load().state
        new = ev.WeightsPublished(state.weights_version + 1, "file:///w/new")
        assert log.append([new]) == [state.seq + 1]
    with FileLog(v1_log, readonly=True) as log:
        assert log.last_seq == EXPECTED["last_seq"] + 1
        assert [r for _, r in log.read(log.last_seq)] == [new]
        assert log.load().state.weights_version == new.version
