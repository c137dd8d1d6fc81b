"""Churn leaves a bounded workers/ folder: the last few logs per worker slot, and no more than
one pid file of a dead host per slot (the last one killed, until the slot starts again)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from actors import worker_files as wf
from pearl.core import events as ev
from tests.daemon.conftest import Pearld, wait_until

pytestmark = pytest.mark.slow

CYCLES = 6  # incarnations of one slot, twice what it keeps


def serving(s: dict[str, Any], gpu: int) -> bool:
    return any(w["gpus"][0] == gpu and w["activity"] == "active" for w in s["workers"])


def test_gpu_churn_leaves_a_bounded_workers_folder(pearld_factory: Any) -> None:
    d: Pearld = pearld_factory("daemon.borrow=never")
    d.settled()
    for _ in range(CYCLES):
        d.event(ev.GpusAdded(gpus=(8, 9)))
        wait_until(lambda: serving(d.status(), 8), 30, "a worker serving on GPUs 8-9")
        d.event(ev.GpusReclaimed(gpus=(8, 9)))
        d.settled()
    files = wf.scan(d.state / "workers")
    slots = {f.worker for f in files}
    incarnations = {(f.worker, f.incarnation) for f in files}
    logs = Counter(f.worker for f in files if f.kind == "log")
    assert max(i for _, i in incarnations) > CYCLES  # the churn happened
    assert all(n <= wf.KEEP for n in logs.values()), logs
    dead = Counter(f.worker for f in files if f.kind == "pid" and not wf.host_alive(f.path))
    assert all(n <= 1 for n in dead.values()), dead
    assert len(files) <= len(slots) * (wf.KEEP + 1) + len(d.host_pids())
