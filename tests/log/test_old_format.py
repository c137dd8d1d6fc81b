"""Logs written before the msgspec codec (format 1, schema version 1) still open and replay.

``data/v1-log`` was written by the hand-written converter that preceded msgspec (see
``data/make_v1_log.py``): 406 records of the realistic stream (every record kind but
gpus-reclaimed) and a snapshot at seq 251. ``v1-log.expected.json`` holds what that code read
back: every record's wire mapping and the final table. ``data/snapshot-v1.bin`` is one snapshot
file written by the per-field snapshot converter (see ``data/make_snapshot_v1.py``); its table is
:data:`SNAPSHOT_V1`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest

from pearl.core import events as ev
from pearl.core.fold import replay
from pearl.core.schema import to_wire
from pearl.core.state import (
    Activity,
    ClusterState,
    Mode,
    PlanProgress,
    Role,
    Step,
    StepOp,
    Target,
    TrainingPhase,
    Worker,
    Zone,
    validate,
)
from pearl.log import FileLog, snapshot, verify
from pearl.log.snapshot import state_from_snapshot

from .data import make_snapshot_v1

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
    assert loaded.state == state_from_snapshot(EXPECTED["state"])  # the mapping as v1 wrote it
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
        new = ev.WeightsPublished(version=state.weights_version + 1, uri="file:///w/new")
        assert log.append([new]) == [state.seq + 1]
    with FileLog(v1_log, readonly=True) as log:
        assert log.last_seq == EXPECTED["last_seq"] + 1
        assert [r for _, r in log.read(log.last_seq)] == [new]
        assert log.load().state.weights_version == new.version


def _w(wid: int, gpus: range, role: Role, activity: Activity, zone: Zone, inc: int) -> Worker:
    return Worker(
        id=wid, gpus=tuple(gpus), role=role, activity=activity, zone=zone, incarnation=inc
    )


A, I, T, D, O = (
    Activity.ACTIVE,
    Activity.INACTIVE,
    Activity.TRANSITIONING,
    Zone.DEDICATED,
    Zone.OVERLAP,
)
# data/snapshot-v1.bin's table, written out by hand (see data/make_snapshot_v1.py).
SNAPSHOT_V1 = ClusterState(
    seq=33,
    tp=2,
    training_gpus=frozenset(range(8)),
    reserved_gpus=frozenset(range(8, 12)),
    preemptible_gpus=frozenset(range(12, 20)),
    present_gpus=frozenset(range(12, 16)),
    reclaiming_gpus=frozenset({16, 17}),
    regranted_gpus=frozenset({16}),
    workers=MappingProxyType(
        {
            0: _w(
                wid=0, gpus=range(8), role=Role.TRAINING, activity=I, zone=O, inc=1
            ),  # lent: a borrow in progress
            1: _w(wid=1, gpus=range(8, 10), role=Role.PREFILL, activity=A, zone=D, inc=2),
            2: _w(wid=2, gpus=range(10, 12), role=Role.DECODE, activity=A, zone=D, inc=3),
            3: _w(wid=3, gpus=range(12, 14), role=Role.DECODE, activity=A, zone=D, inc=4),
            4: _w(
                wid=4, gpus=range(16, 18), role=Role.COLOCATED, activity=T, zone=D, inc=5
            ),  # its GPUs reclaimed
            5: _w(
                wid=5, gpus=range(0, 2), role=Role.DECODE, activity=A, zone=O, inc=7
            ),  # on borrowed training GPUs
            6: _w(wid=6, gpus=range(2, 4), role=Role.DECODE, activity=A, zone=O, inc=8),
            7: _w(wid=7, gpus=range(4, 6), role=Role.COLOCATED, activity=I, zone=O, inc=9),
            8: _w(
                wid=8, gpus=range(14, 16), role=Role.DECODE, activity=T, zone=D, inc=6
            ),  # under a reclaim notice
        }
    ),
    leaving_gpus=MappingProxyType({14: 1_800_000_000.25, 15: 1_800_000_000.25}),
    phase=TrainingPhase.IDLE,
    training_step=1,
    weights_version=2,
    plan=PlanProgress(
        plan=2,
        cause="rebalance",
        target=Target(mode=Mode.DISAGGREGATED, N_P=1, N_D=5, N_C=0),
        steps=(
            Step(op=StepOp.SET_ROLE, worker=8, role=Role.DECODE),
            Step(op=StepOp.REMOVE, worker=4),
            Step(op=StepOp.ACTIVATE, worker=7),
        ),
        done=(0,),
    ),
    last_plan=2,
    next_incarnation=10,
)


def test_a_format_1_snapshot_file_loads() -> None:
    validate(SNAPSHOT_V1)
    state, extra = snapshot.decode((DATA / "snapshot-v1.bin").read_bytes(), "snapshot-v1.bin")
    assert state == SNAPSHOT_V1
    assert extra == {"note": "written by the format-1 field converters"}


def test_a_format_1_snapshot_in_a_log_resumes_like_a_full_replay(tmp_path: Path) -> None:
    """The old snapshot as a log's starting point: snapshot + tail equals replaying everything."""
    records = make_snapshot_v1.RECORDS
    tail = [
        ev.WorkerRemoved(worker=4),
        ev.StepDone(plan=2, step=1),
    ]  # GPU 16 present again, 17 gone
    with FileLog(tmp_path / "log") as log:
        log.append(records)
        (tmp_path / "log" / snapshot.file_name(33)).write_bytes(
            (DATA / "snapshot-v1.bin").read_bytes()
        )
    with FileLog(tmp_path / "log") as log:
        assert log.snapshots() == [33]
        log.append(tail)
        loaded = log.load()
    assert loaded.snapshot_seq == 33
    assert loaded.state == replay([*records, *tail])
