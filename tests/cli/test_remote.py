"""The remote CLI without a daemon: its key handling, and how fast it says nobody answers."""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from pearl.cli import main
from pearl.cli.remote import _reachable, client, render
from pearl.core.errors import PearlError

ROOT = Path(__file__).resolve().parents[2]


def test_a_wildcard_change_stream_is_reached_where_the_api_was() -> None:
    assert _reachable("tcp://0.0.0.0:5001", "tcp://10.0.0.7:7440") == "tcp://10.0.0.7:5001"
    assert _reachable("tcp://[::]:5001", "tcp://node-3:7440") == "tcp://node-3:5001"
    assert _reachable("tcp://127.0.0.1:5001", "tcp://127.0.0.1:7440") == "tcp://127.0.0.1:5001"
    assert _reachable("ipc:///tmp/a.sock.pub", "ipc:///tmp/a.sock") == "ipc:///tmp/a.sock.pub"


def test_a_bad_keys_dir_names_the_option(tmp_path: Path) -> None:
    args = argparse.Namespace(endpoint="tcp://127.0.0.1:1", keys_dir=str(tmp_path), timeout=0.1)
    with pytest.raises(PearlError, match=r"check --keys-dir: .*client\.key_secret"):
        client(args)


def test_status_with_no_daemon_fails_in_one_line_within_two_seconds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    t0 = time.monotonic()
    assert main(["status", "--endpoint", f"ipc://{tmp_path}/api.sock"]) == 1
    took = time.monotonic() - t0
    err = capsys.readouterr().err
    assert took < 2.0, took  # 11.5 s before: two attempts of 5 s, then a diagnosis
    assert err.count("\n") == 1 and err.startswith("pearl status: no reply from ipc://"), err
    assert "is unreachable" in err and "within 1.5s" in err


def test_status_names_stranded_gpus_and_a_decision_for_another_budget() -> None:
    s: dict[str, Any] = {
        "seq": 23, "mode": "colocated", "N_P": 0, "N_D": 0, "N_C": 3, "phase": "idle",
        "training_step": 0, "weights_version": 0, "tp": 2, "workers": [],
        "budget": {"dedicated_gpus": 7, "training_gpus": 16, "lent": False, "workers": 3,
                   "stranded_gpus": [23]},
        "decision": {"target": "4C", "predicted_makespan_s": 94.6, "reason": "budget 2 -> 4",
                     "workers": 4, "current": False},
    }  # fmt: skip
    lines = render(s).splitlines()
    assert lines[2] == "stranded: GPU 23 present but unused: too few free GPUs for a TP2 worker"
    assert (
        lines[3] == "decision (for 4 workers, before the budget changed to 3): 4C predicted 94.6s"
    )
    s["decision"] = {**s["decision"], "target": "3C", "workers": 3, "current": True}
    s["budget"] = {**s["budget"], "stranded_gpus": []}
    lines = render(s).splitlines()
    assert lines[2] == "decision: 3C predicted 94.6s (budget 2 -> 4)"


def test_status_of_an_empty_pool_shows_no_prediction_and_why() -> None:
    reason = "no rollout worker in the budget: no makespan to predict"
    s: dict[str, Any] = {
        "seq": 40, "mode": "colocated", "N_P": 0, "N_D": 0, "N_C": 0, "phase": "training",
        "training_step": 1, "weights_version": 0, "tp": 1, "workers": [],
        "budget": {"dedicated_gpus": 0, "training_gpus": 2, "lent": False, "workers": 0,
                   "stranded_gpus": []},
        "decision": {"target": "0C", "predicted_makespan_s": None, "reason": reason,
                     "workers": 0, "current": True},
    }  # fmt: skip
    assert f"decision: 0C no prediction ({reason})" in render(s).splitlines()


def test_a_failed_connect_closes_its_sockets(tmp_path: Path) -> None:
    """``pearl.connect`` that finds nobody raises and leaves no open socket behind: a trainer
    retrying until pearld is up must not leave one client (and its socket monitor) per try for
    the garbage collector, which closed them under later clients' feet. Counted in a process of
    its own: in this one, other tests' threads may open sockets meanwhile."""
    script = f"""
import gc, zmq, pearl
from pearl.core.errors import PearlError
def open_sockets():
    return {{id(o) for o in gc.get_objects() if isinstance(o, zmq.Socket) and not o.closed}}
before = open_sockets()
for _ in range(3):
    try:
        pearl.connect("ipc://{tmp_path}/nothing.sock", timeout_s=0.2)
    except PearlError as e:
        assert "unreachable" in str(e), e
    else:
        raise SystemExit("connected to nobody")
left = open_sockets() - before
print(len(left))
"""
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "0", out.stdout + out.stderr[-2000:]
