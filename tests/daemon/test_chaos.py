"""One minute of the chaos run (``benchmarks/chaos.py``): random elastic events and training
cycles against a real pearld while worker hosts are SIGKILLed and SIGSTOPped, pearld itself is
SIGKILLed and restarted, its log disk fills for a few seconds and its metrics port is flooded.
Nothing acknowledged is lost, nothing refused is logged, no fact of the world is refused, no
actor crashes, status equals the replay of the log, and borrowed GPUs come back within the
paper's bound. Agents chat through pearld's gateway meanwhile, and it is sent poison requests,
held by slow clients and left by clients that hang up: no agent's request fails but for a pearld
kill."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SEED = 2026
# Issue 21: Training Begin -> may proceed <= 3.2 s (the paper returns in 3-4 s), for returns no
# fault of the run came near; one near a fault may also wait for the fault to be detected.
RETURN_MAX_S = 3.2


def sweep(root: Path) -> list[int]:
    """SIGKILL every process whose command line names ``root`` (pearld, worker hosts): a run
    that was itself killed cannot clean up after itself."""
    killed = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(str(root).encode() in a for a in argv):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(entry), signal.SIGKILL)
                killed.append(int(entry))
    return killed


def test_chaos_one_minute(tmp_path: Path) -> None:
    out = tmp_path / "chaos.json"
    run = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "benchmarks" / "chaos.py"), "--minutes", "1",
         "--seed", str(SEED), "--json", str(out), "--keep", str(run)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        stdout, _ = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGTERM)  # chaos.py stops what it started, by pid
        stdout, _ = proc.communicate(timeout=90)
        pytest.fail(f"chaos run did not finish in 240 s:\n{stdout.decode()[-3000:]}")
    finally:
        left = sweep(run)
    log = stdout.decode(errors="replace")
    assert proc.returncode == 0, log[-3000:]
    assert not left, f"processes left behind: {left}"
    r = json.loads(out.read_text())
    assert r["faults"]["kill-pearld"] >= 1, r["fault_log"]
    assert r["faults"]["kill-host"] + r["faults"]["stop-host"] >= 1, r["fault_log"]
    assert r["faults"]["disk-full"] >= 1 and r["faults"]["metrics-flood"] >= 1, r["fault_log"]
    assert r["facts_refused"] == 0, r["facts_refused_detail"]
    assert r["reported_failed_but_durable"] == 0, r["reported_failed_but_durable_detail"]
    assert r["world_equals_table"], r["world_vs_table"]
    assert r["metrics_flood_scrapes_ok"], r["fault_log"]
    assert r["metrics_flood_connections_max"] <= 64, r["fault_log"]
    assert r["faults"]["pearld-exit"] == 0, r["fault_log"]  # a disk-full window kills nothing
    assert r["cycles"] >= 5, log[-3000:]
    assert r["settled"], r["unsettled"]  # once the faults stop, nothing stays in flight or failed
    assert r["events_lost"] == 0, r["lost_detail"]
    assert r["replay_equal"], r["replay_diff"]
    assert r["log_verified"], r["log_verify"]
    assert r["orchestrator_restarts"] == 0, r["actor_failures"]
    assert r["return_timeouts"] == 0, r["return_log"]
    assert r["return_max_s"] <= RETURN_MAX_S, [x for x in r["return_log"] if not x["near"]]
    assert not r["tables_invalid"], r["tables_invalid"]
    # Agents chat through the gateway all along: poison, slow clients and abandoned requests
    # fail none of theirs; only a pearld killed on purpose excuses a failure.
    assert r["faults"]["poison"] >= 1 and r["faults"]["slow-clients"] >= 1, r["fault_log"]
    assert r["faults"]["abandon"] >= 1, r["fault_log"]
    assert r["requests_ok"] > 0, r["requests_failed_detail"]
    assert r["requests_failed"] == 0, r["requests_failed_detail"]
    assert not r["poison_not_4xx"], r["poison_not_4xx"]
    assert all(x["probe_ok"] for x in r["slow_clients"]), r["slow_clients"]
