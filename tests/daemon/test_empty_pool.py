"""pearld with no rollout worker left keeps serving: status shows no prediction and why, and a
restart on the same state directory comes up (issue 41 item 2, both ways it named)."""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest

from pearl.core import events as ev
from pearl.core.decision import NO_PREDICTION
from tests.daemon.conftest import Pearld, wait_until

pytestmark = pytest.mark.slow


def empty(s: dict[str, Any]) -> bool:
    d = s.get("decision") or {}
    return s["budget"]["workers"] == 0 and d.get("predicted_makespan_s", 0) is None


def no_crash(d: Pearld) -> None:
    assert d.running(), d.tail(40)
    text = d.log_path(d.starts).read_text(errors="replace")
    assert "actor api failed" not in text and "restarting actor" not in text, d.tail(40)


def test_reclaiming_every_rollout_gpu_leaves_pearld_serving(pearld_factory: Any) -> None:
    """Preemptible GPUs only: all reclaimed, then training takes the lent ones back."""
    d: Pearld = pearld_factory(
        "cluster.reserved_gpus=", "cluster.initial_preemptible=8-15", "daemon.borrow=never"
    )
    d.settled()
    d.event(ev.GpusReclaimed(gpus=tuple(range(8, 16))))
    d.event(ev.TrainingBegin(step=1))
    wait_until(lambda: empty(d.status()), 30, "an empty pool")
    assert d.settled()["decision"]["reason"] == NO_PREDICTION
    no_crash(d)
    assert d.stop() == 0
    d.start()  # the same state directory: it died again within 6 s before the fix
    wait_until(lambda: empty(d.status()), 30, "the empty pool again")
    d.event(ev.GpusAdded(gpus=(8, 9)))  # and serves again when GPUs come
    wait_until(lambda: d.settled()["budget"]["workers"] == 1, 30, "a worker again")
    no_crash(d)


def test_a_reserved_worker_given_up_on_leaves_pearld_serving(pearld_factory: Any) -> None:
    """kill -9 the only worker's host until its supervisor gives up on it."""
    d: Pearld = pearld_factory("cluster.reserved_gpus=4-5", "daemon.borrow=never")
    s = d.settled()
    (worker,) = [w for w in s["workers"] if w["role"] != "training"]
    killed: set[int] = set()

    def kill_the_host() -> bool:
        if empty(d.status()):
            return True
        for h in d.hosts():
            if h.worker == worker["id"] and h.pid not in killed:
                killed.add(h.pid)
                os.kill(h.pid, signal.SIGKILL)
        return False

    wait_until(
        pred=kill_the_host, timeout=60, what="the supervisor to give up on the worker", every=0.05
    )
    assert len(killed) >= 2, killed
    s = d.status()
    assert s["decision"]["reason"] == NO_PREDICTION
    no_crash(d)
    assert d.stop() == 0
    d.start()  # answers status (the quarantine of the lost worker's GPUs is not kept)
    d.settled()
    no_crash(d)
