"""``pearl event training-begin`` returns when training may proceed and says how long it took."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from typing import Any

import pytest

from tests.daemon.conftest import ROOT, Pearld, wait_until

pytestmark = pytest.mark.slow


def cli(*args: str, endpoint: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pearl", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PEARL_ENDPOINT": endpoint},
        cwd=ROOT,
        timeout=60,
    )


def borrowed(s: dict[str, Any]) -> list[dict[str, Any]]:
    return [w for w in s["workers"] if w["zone"] == "overlap" and w["role"] != "training"]


def lent_and_settled(d: Pearld) -> dict[str, Any]:
    return wait_until(
        lambda: (s := d.settled())["budget"]["lent"] and borrowed(s) and s,
        30,
        "the training GPUs to be lent",
    )


def test_it_waits_for_borrowed_workers_and_says_how_long(pearld_factory: Any) -> None:
    d: Pearld = pearld_factory("daemon.borrow=always")
    n = len([w for w in borrowed(lent_and_settled(d)) if w["activity"] == "active"])
    assert n >= 1
    r = cli("event", "training-begin", endpoint=d.endpoint)
    assert r.returncode == 0, r.stderr
    ack, proceed = r.stdout.strip().splitlines()
    assert re.fullmatch(r"ok: training-begin logged at seq \d+", ack), r.stdout
    m = re.fullmatch(r"training may proceed: (\d+) borrowed workers? back in (\d+) ms", proceed)
    assert m and int(m[1]) == n, r.stdout
    s = d.status()  # safe the moment the command returns
    assert s["training_may_proceed"] == 1
    assert all(w["activity"] == "inactive" for w in borrowed(s)), s["workers"]
    assert all(w["activity"] == "active" for w in s["workers"] if w["role"] == "training")

    r = cli("event", "training-finished", endpoint=d.endpoint)
    assert r.returncode == 0, r.stderr
    lent_and_settled(d)
    r = cli("event", "training-begin", "--no-wait", endpoint=d.endpoint)  # the ack only
    assert r.returncode == 0, r.stderr
    assert re.fullmatch(r"ok: training-begin logged at seq \d+\n", r.stdout), r.stdout
    wait_until(lambda: d.status()["training_may_proceed"] == 2, 20, "the go-ahead for step 2")


def test_nothing_lent_says_so(pearld_factory: Any) -> None:
    d: Pearld = pearld_factory("daemon.borrow=never")
    assert not d.settled()["budget"]["lent"]
    r = cli("event", "training-begin", "--step", "1", endpoint=d.endpoint)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[1] == (
        "training may proceed: nothing was lent, no borrowed workers had to come back"
    ), r.stdout
    assert d.status()["training_may_proceed"] == 1


def test_a_return_past_the_timeout_is_a_clear_error(pearld_factory: Any) -> None:
    # Slow heartbeats: frozen hosts are not declared dead (and forced out) for 15 s.
    d: Pearld = pearld_factory("daemon.borrow=always", "daemon.heartbeat_s=5")
    s = lent_and_settled(d)
    pids = d.host_pids()
    # Frozen hosts cannot hand their GPUs back: the return waits for them.
    frozen = [pids[f"worker-{w['id']}-{w['incarnation']}"] for w in borrowed(s)]
    for pid in frozen:
        os.kill(pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        r = cli("event", "training-begin", "--return-timeout", "0.3", endpoint=d.endpoint)
        took = time.monotonic() - t0
    finally:
        for pid in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "logged at seq" in r.stdout  # the event itself was acknowledged
    err = r.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "borrowed workers are not back after 0.3s: do not start training yet" in err, err
    assert took < 10, took
    wait_until(lambda: d.status()["training_may_proceed"] == 1, 30, "the forced return")
