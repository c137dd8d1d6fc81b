"""``pearl log verify|show|replay``: verdicts, JSON shapes, and one-line errors for bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pearl.cli import main
from pearl.core import events as ev
from pearl.core.fold import replay
from pearl.core.state import Activity, Role, Zone
from pearl.log import FileLog

ROOT = Path(__file__).resolve().parents[2]
RECORDS: list[Any] = [
    ev.ClusterInit(tp=1, training_gpus=(0, 1), reserved_gpus=(2, 3), preemptible_gpus=(4, 5)),
    ev.GpusAdded(gpus=(4,)),
    ev.WorkerAdded(worker=1, gpus=(2,), role=Role.PREFILL, zone=Zone.DEDICATED),
    ev.ActivityChanged(worker=1, activity=Activity.ACTIVE),
    ev.WorkerAdded(worker=2, gpus=(4,), role=Role.DECODE, zone=Zone.DEDICATED),
    ev.ActivityChanged(worker=2, activity=Activity.ACTIVE),
    ev.TrainingBegin(step=1),
    ev.TrainingFinished(step=1, weights_version=1),
    ev.GpusReclaimed(gpus=(4,)),
    ev.WorkerRemoved(worker=2, reason="reclaimed"),
]


@pytest.fixture
def logdir(tmp_path: Path) -> Path:
    path = tmp_path / "log"
    with FileLog(path, segment_bytes=120) as log:
        for r in RECORDS:
            log.append([r])
            if log.last_seq == 6:
                log.write_snapshot(replay(RECORDS[:6]))
    return path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["log", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("pearl log: ")
    return lines[0]


def test_verify_ok(capsys, logdir: Path) -> None:
    nseg = len(list(logdir.glob("*.seg")))
    assert nseg > 2
    code, out, err = run(capsys, "verify", str(logdir))
    assert (code, err) == (0, "")
    assert out == f"ok: 10 records, seq 1..10, {nseg} segments, snapshot at 6\n"


def test_verify_empty_log(capsys, tmp_path: Path) -> None:
    FileLog(tmp_path / "empty").close()
    assert run(capsys, "verify", str(tmp_path / "empty")) == (
        0,
        "ok: 0 records, 1 segment, no snapshot\n",
        "",
    )


def test_verify_reports_a_torn_tail_without_repairing_it(capsys, logdir: Path) -> None:
    last = sorted(logdir.glob("*.seg"))[-1]
    data = last.read_bytes() + bytes(100)
    last.write_bytes(data)
    code, out, err = run(capsys, "verify", str(logdir))
    line = one_error_line(err)
    assert code == 1 and out == "" and "torn tail" in line and str(last) in line
    assert last.read_bytes() == data and not (logdir / "repair").exists()
    code, out, _ = run(capsys, "replay", str(logdir), "--json")  # readers still work
    assert code == 0 and json.loads(out)["seq"] == 10


def test_verify_names_the_corrupt_file_and_offset(capsys, logdir: Path) -> None:
    seg = sorted(logdir.glob("*.seg"))[0]
    data = bytearray(seg.read_bytes())
    data[20] ^= 0xFF
    seg.write_bytes(data)
    for cmd in ("verify", "show", "replay"):
        code, out, err = run(capsys, cmd, str(logdir))
        line = one_error_line(err)
        assert code == 1 and out == "" and str(seg) in line and "byte offset 0" in line


def test_verify_catches_a_snapshot_that_disagrees_with_the_log(capsys, logdir: Path) -> None:
    wrong = replay(
        RECORDS[:5]
        + [
            ev.Telemetry(
                step=0,
                batch=1,
                S=1.0,
                delta_L=1.0,
                r=1.0,
                theta=0.0,
                A=0.0,
                b=0.0,
                t_prefill=0.0,
                T_env=0.0,
                makespan_s=1.0,
            )
        ]
    )
    with FileLog(logdir) as log:
        log.write_snapshot(wrong)
    code, _, err = run(capsys, "verify", str(logdir))
    assert code == 1 and "snapshot at seq 6 differs" in one_error_line(err)


def test_show_text_and_ranges(capsys, logdir: Path) -> None:
    code, out, _ = run(capsys, "show", str(logdir))
    lines = out.splitlines()
    assert code == 0 and len(lines) == 10
    assert lines[2].split()[:3] == ["3", "worker-added", "worker=1"]
    assert "gpus=2" in lines[2] and "role=prefill" in lines[2]
    code, out, _ = run(capsys, "show", str(logdir), "--from", "4", "--until", "6")
    assert [line.split()[0] for line in out.splitlines()] == ["4", "5", "6"]


def test_show_json(capsys, logdir: Path) -> None:
    code, out, _ = run(capsys, "show", str(logdir), "--json", "--from", "9")
    objs = [json.loads(line) for line in out.splitlines()]
    assert code == 0
    assert objs == [
        {"seq": 9, "kind": "gpus-reclaimed", "gpus": [4]},
        {"seq": 10, "kind": "worker-removed", "worker": 2, "reason": "reclaimed"},
    ]
    code, out, _ = run(capsys, "show", str(logdir), "--json")
    assert [json.loads(line)["seq"] for line in out.splitlines()] == list(range(1, 11))


def test_replay_json_is_the_table_as_of_a_seq(capsys, logdir: Path) -> None:
    for until in (None, 5, 6, 0):
        args = ["replay", str(logdir), "--json"]
        args += [] if until is None else ["--until", str(until)]
        code, out, _ = run(capsys, *args)
        assert code == 0 and len(out.splitlines()) == 1
        obj = json.loads(out)
        n = 10 if until is None else until
        assert obj == json.loads(json.dumps(replay(RECORDS[:n]).to_json()))
        assert list(obj)[:2] == ["seq", "workers"] and obj["seq"] == n
    w = json.loads(run(capsys, "replay", str(logdir), "--json", "--until", "5")[1])["workers"][2]
    assert w == {
        "id": 2,
        "gpus": [4],
        "role": "decode",
        "activity": "transitioning",
        "zone": "dedicated",
        "incarnation": 3,
    }


def test_replay_table(capsys, logdir: Path) -> None:
    code, out, _ = run(capsys, "replay", str(logdir), "--until", "6")
    assert code == 0
    assert out.splitlines()[0].startswith("seq 6  tp 1  mode disaggregated  P/D/C 1/1/0")
    rows = [line.split() for line in out.splitlines() if line.split()[:1] in (["1"], ["2"])]
    assert rows == [
        ["1", "prefill", "active", "dedicated", "2"],
        ["2", "decode", "active", "dedicated", "4"],
    ]
    code, _, err = run(capsys, "replay", str(logdir), "--until", "11")
    assert code == 1 and "holds seq 1..10" in one_error_line(err)


def test_bad_directories_give_one_line(capsys, tmp_path: Path, logdir: Path) -> None:
    (tmp_path / "plain").mkdir()
    (tmp_path / "file").write_text("x")
    (logdir / "0000000000000011.seg").mkdir()  # the next segment, unreadable
    cases = {
        "missing": "no such directory",
        "plain": "not a PEARL event log",
        "file": "not a directory",
        "log": "cannot open the log",
    }
    for name, message in cases.items():
        for cmd in ("verify", "show", "replay"):
            code, out, err = run(capsys, cmd, str(tmp_path / name))
            assert code == 1 and out == "" and message in one_error_line(err), (name, cmd, err)
    assert not (tmp_path / "missing").exists() and list((tmp_path / "plain").iterdir()) == []


def test_as_a_real_command(logdir: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "pearl", "log"]
    ok = subprocess.run(
        [*cmd, "verify", str(logdir)], capture_output=True, text=True, env=env, timeout=60
    )
    assert ok.returncode == 0 and ok.stdout.startswith("ok: 10 records"), ok.stderr
    bad = subprocess.run(
        [*cmd, "replay", str(logdir.parent / "nope"), "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert bad.returncode == 1 and bad.stdout == ""
    assert bad.stderr.count("\n") == 1 and "no such directory" in bad.stderr
    # a reader that stops early (| head) ends the command quietly
    proc = subprocess.Popen(
        [*cmd, "show", str(logdir)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    assert proc.stdout is not None and proc.stdout.readline().split()[0] == b"1"
    proc.stdout.close()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and b"Traceback" not in err
