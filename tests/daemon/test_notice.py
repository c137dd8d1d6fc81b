"""Preemption notices on a live pearld with sim worker hosts and the rollout pipeline running:
notice then reclaim before the deadline, the deadline passing, a withdrawn notice, pearld killed
in between; no trajectory lost, nothing left on a GPU after its deadline, status == replay."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from typing import Any

import pytest

import pearl
from pearl.core import events as ev
from tests.daemon.conftest import ROOT, Pearld, wait_until

pytestmark = pytest.mark.slow

PIPELINE = [
    "daemon.borrow=never",
    # Notices, not PD: the small cluster's priors may pick a split, whose batches take this file
    # from ~90 s to ~135 s (tests/actors/test_adoption.py covers a split's hosts after a restart).
    "daemon.pd=colocated",
    "rl.env=tool_use",
    "workload.batch=8",
    "workload.group_size=2",
    "rl.max_turns=3",
    "rl.max_new_tokens=16",
    "engine.sim.time_scale=0.05",
]
NOTICED = (8, 9)


def start(factory: Any) -> tuple[Pearld, Any]:
    d: Pearld = factory(*PIPELINE)
    d.event(ev.GpusAdded(gpus=(8, 9, 10, 11)))
    wait_until(lambda: len(routable(d)) == 4, 60, "4 workers serving")
    return d, pearl.connect(d.endpoint)


def routable(d: Pearld) -> list[int]:
    return [
        w["id"]
        for w in d.status()["workers"]
        if w["activity"] == "active" and w["role"] != "training"
    ]


def worker_on(d: Pearld, gpu: int) -> int:
    return next(w["id"] for w in d.status()["workers"] if gpu in w["gpus"])


def leaving(d: Pearld) -> list[dict[str, Any]]:
    return d.status()["gpus"]["leaving"]  # type: ignore[no-any-return]


def batches_complete(rt: Any, n: int) -> int:
    """Take ``n`` batches: every trajectory ended and no turn failed. Returns aborted turns."""
    aborted = 0
    for _ in range(n):
        batch = rt.next_batch(timeout_s=120)
        assert len(batch) == 8
        for t in batch:
            assert t.done, f"trajectory {t.id} never ended"
            reasons = [turn.finish_reason for turn in t.turns]
            assert "error" not in reasons, reasons
            aborted += reasons.count("abort")
    return aborted


def same_as_replay(d: Pearld) -> None:
    """``pearl status`` rows equal ``pearl log replay`` rows at the same sequence number (the
    view may lag the log by a change: compare until they meet)."""

    def agree() -> bool:
        s = d.status()
        t = d.replayed(s["seq"]).to_json()
        return s["workers"] == t["workers"] and s["gpus"] == t["gpus"]

    wait_until(agree, 30, "status == replay")


def cli(d: Pearld, *words: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pearl", "--endpoint", d.endpoint, "event", *words],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def host_pid(d: Pearld, wid: int) -> int:
    pids = [p for name, p in d.host_pids().items() if name.startswith(f"worker-{wid}-")]
    assert pids, d.host_pids()
    return pids[-1]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie of a child that exited is not running
    with contextlib.suppress(Exception), open(f"/proc/{pid}/stat") as f:
        return f.read().split(") ")[1].split()[0] != "Z"
    return True


def test_notice_then_reclaim_before_deadline_withdrawal_and_errors(pearld_factory: Any) -> None:
    d, rt = start(pearld_factory)
    batches_complete(rt, 1)
    wid = worker_on(d, 8)

    r = cli(d, "gpus-reclaiming", "--gpus", "8-9", "--deadline", "2m")
    assert r.returncode == 0, r.stderr
    wait_until(lambda: leaving(d) and leaving(d)[0]["gpus"] == [8, 9], 30, "gpus.leaving")
    deadline = leaving(d)[0]["deadline"]
    assert 100 < deadline - time.time() <= 120
    wait_until(lambda: wid not in routable(d) and len(routable(d)) == 3, 30, "no new turns there")
    assert wid in {w["id"] for w in d.status()["workers"]}  # usable until the deadline
    same_as_replay(d)

    # Clear errors, nothing changed.
    for words, said in [
        (("gpus-reclaiming", "--gpus", "8-9", "--deadline", "30s"), "already has a reclaim notice"),
        (("gpus-reclaiming", "--gpus", "12-13", "--deadline", "30s"), "GPU 12 is not present"),
        (("gpus-reclaiming", "--gpus", "10-11", "--deadline", "2h"), "more than the 3600 s"),
        (("gpus-reclaiming", "--gpus", "10-11", "--deadline", "soon"), "expected a duration"),
        (("gpus-reclaim-cancelled", "--gpus", "10"), "no pending reclaim notice"),
    ]:
        r = cli(d, *words)
        assert r.returncode == 1 and said in r.stderr, (words, r.stderr)
    assert leaving(d) == [{"gpus": [8, 9], "deadline": deadline}]

    batches_complete(rt, 2)  # rollout goes on on the workers that stay
    d.event(ev.GpusReclaimed(gpus=NOTICED))
    wait_until(lambda: wid not in {w["id"] for w in d.status()["workers"]}, 30, "worker gone")
    s = d.settled(60)
    assert s["gpus"]["leaving"] == [] and not set(NOTICED) & set(s["gpus"]["present"])
    same_as_replay(d)

    # A withdrawn notice returns the workers to service.
    other = worker_on(d, 10)
    d.event(ev.GpusReclaiming(gpus=(10, 11), deadline=time.time() + 90))
    wait_until(lambda: other not in routable(d), 30, "worker 10-11 out of routing")
    d.event(ev.GpusReclaimCancelled(gpus=(10, 11)))
    wait_until(lambda: other in routable(d) and not leaving(d), 30, "worker back in service")
    batches_complete(rt, 2)
    same_as_replay(d)
    rt.stop()


def test_deadline_passes_nothing_runs_there_after_it(pearld_factory: Any) -> None:
    d, rt = start(pearld_factory)
    batches_complete(rt, 1)
    wid = worker_on(d, 8)
    pid = host_pid(d, wid)
    deadline = time.time() + 4.0
    d.event(ev.GpusReclaiming(gpus=NOTICED, deadline=deadline))
    batches_complete(rt, 2)  # turns moved early resume from their prefix; none fails
    # Treated as arrived at the deadline: the worker's host is gone then (a loaded machine may
    # take a moment to reap it), its GPUs are not present any more.
    wait_until(lambda: not alive(pid), 60, f"host {pid} of worker {wid} to exit")
    s = wait_until(
        lambda: (lambda s: s if not set(NOTICED) & set(s["gpus"]["present"]) else None)(d.status()),
        60,
        "GPUs 8-9 reclaimed",
    )
    assert s["gpus"]["leaving"] == []
    records = [r for _, r in d.records()]
    reclaimed = [r for r in records if isinstance(r, ev.GpusReclaimed)]
    assert reclaimed and set(reclaimed[-1].gpus) == set(NOTICED)
    batches_complete(rt, 2)
    same_as_replay(d)
    rt.stop()


def test_pearld_killed_with_a_notice_pending_restores_it(pearld_factory: Any) -> None:
    d, rt = start(pearld_factory)
    batches_complete(rt, 1)
    rt.stop()
    deadline = time.time() + 25.0
    d.event(ev.GpusReclaiming(gpus=NOTICED, deadline=deadline))
    wait_until(lambda: leaving(d), 30, "the notice in status")
    d.kill9()
    d.start(60)
    assert leaving(d) == [{"gpus": [8, 9], "deadline": deadline}]  # exactly as logged
    wid = worker_on(d, 8)
    d.settled(60)  # hosts re-register; the leaving one is not re-admitted
    assert wid not in routable(d) and len(routable(d)) == 3
    same_as_replay(d)
    rt = pearl.connect(d.endpoint)
    batches_complete(rt, 1)
    wait_until(
        lambda: not set(NOTICED) & set(d.status()["gpus"]["present"]),
        max(5.0, deadline - time.time()) + 60,
        "the deadline to pass and the GPUs to be reclaimed",
    )
    assert time.time() >= deadline - 1.0  # not before its time
    batches_complete(rt, 1)
    same_as_replay(d)
    rt.stop()
