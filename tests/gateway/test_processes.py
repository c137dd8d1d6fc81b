"""``gateway.processes = 2``: the data path in two gateway processes, off pearld's interpreter.

Agents stream multi-turn sessions through both processes (one port, ``SO_REUSEPORT``) while
preemptible GPUs join and are reclaimed with turns in flight, a preemption notice takes a worker
away, and borrow cycles lend the training GPUs and take them back at Training Begin. No request
fails, a reclaim moves turns with their prefixes, every process served, sessions kept their
worker, and the Tracker heard the processes' rollout steps. A killed gateway process is started
again, and pearld's stop takes every process down.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

import pearl
from pearl.runtime import wait_training_may_proceed
from pearl.testing.wait import poll, wait_until
from tests.gateway.test_gateway_churn import Agents, control
from tests.gateway.test_pool import SETS, routable

openai = pytest.importorskip("openai")

ROOT = Path(__file__).resolve().parents[2]
AGENTS = 12
HUGE = 2**64  # no worker host can be sent it
POISON = [  # (path, body): a token id out of any range, an id past the vocabulary, a huge seed
    ("/v1/completions", {"model": "pearl-sim", "prompt": [HUGE], "max_tokens": 4}),
    ("/generate", {"input_ids": [10**9, 5], "sampling_params": {"max_new_tokens": 4}}),
    (
        "/v1/chat/completions",
        {"model": "pearl-sim", "messages": [{"role": "user", "content": "x"}], "seed": HUGE},
    ),
]


def hosts_metrics(state: Path) -> dict[int, str]:
    """Where each worker host serves its metrics, as pearld's Prometheus targets list them."""
    path = state / "targets.json"
    targets = json.loads(path.read_text()) if path.exists() else []
    return {
        int(t["labels"]["worker"]): t["targets"][0]
        for t in targets
        if t["labels"]["job"] == "pearl-worker"
    }


def in_flight(address: str) -> int:
    """``pearl_worker_requests_in_flight`` from a worker host's metrics endpoint."""
    text = httpx.get(f"http://{address}/metrics", timeout=5).text
    return sum(
        int(float(line.rsplit(" ", 1)[1]))
        for line in text.splitlines()
        if line.startswith("pearl_worker_requests_in_flight{")
    )


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_two_gateway_processes_lose_no_request_through_reclaims_notices_and_returns(
    tmp_path: Path,
) -> None:
    rt = pearl.Runtime.from_config(
        ROOT / "configs" / "local-cpu.toml",
        state_dir=tmp_path / "state",
        overrides=(
            *SETS,
            "gateway.listen=127.0.0.1:0",
            "gateway.model=pearl-sim",
            "gateway.processes=2",
            "daemon.metrics=127.0.0.1:0",
        ),
    )
    rt.start()
    agents: Agents | None = None
    gateways = rt.daemon.gateway_processes
    assert gateways is not None and all(gateways.pids)
    try:
        url = rt.gateway_url
        assert url is not None
        event = control(url)
        wait_until(lambda: routable(rt), 60, "a worker serving", every=0.1)
        agents = Agents(url, AGENTS)
        agents.thread.start()
        # Poison beside the agents, to every process: refused alone, nothing restarted.
        started = list(gateways.pids)
        for _ in range(4):  # a connection each: the kernel spreads them over the processes
            for path, body in POISON:
                r = httpx.post(f"{url.removesuffix('/v1')}{path}", json=body, timeout=30)
                assert r.status_code == 400, (path, r.status_code, r.text)
        assert gateways.pids == started

        def busy(gpus: set[int]) -> bool:  # a worker on these GPUs holds requests
            metrics = hosts_metrics(tmp_path / "state")
            return any(
                set(w.gpus) & gpus and w.id in metrics and in_flight(metrics[w.id]) > 0
                for w in routable(rt)
            )

        # Join and reclaim until a reclaim caught a turn mid-flight (reported with its end).
        for _ in range(5):
            event("gpus-added", gpus=[3, 4])
            wait_until(lambda: len(routable(rt)) >= 3, 60, "the added workers serving", every=0.1)
            wait_until(lambda: busy({3, 4}), 60, "an added worker with turns", every=0.02)
            event("gpus-reclaimed", gpus=[3, 4])
            if poll(lambda: agents.migrations > 0, 30, 0.05):
                break
        moved = agents.migrations
        # A notice: the worker on GPU 5 leaves at its deadline; its turns move before it.
        event("gpus-added", gpus=[5])
        wait_until(lambda: busy({5}), 60, "the worker on GPU 5 with turns", every=0.02)
        event("gpus-reclaiming", gpus=[5], deadline=time.time() + 2.0)
        wait_until(
            lambda: not any(5 in w.gpus for w in rt.status().workers), 60, "GPU 5 gone", every=0.1
        )
        for step in (1, 2):  # the lent training GPUs come back at each Training Begin
            event("training-begin", step=step)
            wait_training_may_proceed(rt.status, step, timeout_s=60)
            event("training-finished", step=step)
        done = agents.completed
        wait_until(lambda: agents.completed >= done + AGENTS, 120, "turns after the churn")
        observed = rt.status().profile.observed
        # A gateway process killed is started again; the other serves meanwhile.
        victim = gateways.pids[0]
        os.kill(victim, signal.SIGKILL)
        wait_until(
            lambda: gateways.pids[0] not in (0, victim), 60, "gateway process 0 again", every=0.1
        )
        done = agents.completed
        wait_until(lambda: agents.completed >= done + AGENTS, 120, "turns after the restart")
        agents.stop.set()
        agents.thread.join(180)
        assert not agents.thread.is_alive()
    finally:
        if agents is not None:
            agents.stop.set()
            agents.thread.join(180)
        pids = [p for p in (gateways.pids if gateways else []) if p]
        rt.stop()
    # A killed process's connections fail (their agents' requests are the only excused ones).
    excused = [f for f in agents.failures if "Connection" in f or "RemoteProtocol" in f]
    assert [f for f in agents.failures if f not in excused] == []
    assert moved > 0  # a reclaim moved streams across processes' Routers, and they kept flowing
    assert set(agents.processes) == {"0", "1"}, agents.processes  # both processes served
    assert observed > 0  # the Tracker heard the processes' rollout steps
    for pid in pids:  # stopped with pearld
        assert poll(lambda pid=pid: not alive(pid), 10, 0.05), f"gateway pid {pid} still runs"


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is not running
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_rendezvous_homes_agree_across_processes_and_move_only_a_leaving_workers() -> None:
    """Two Routers that never talk place every session on the same worker; a worker that
    leaves moves only the sessions it held."""
    from pearl.core.routing import hashed_home

    pool = [1, 2, 3, 4]
    sessions = [f"s{i}" for i in range(2000)]
    first = {s: hashed_home(s, pool) for s in sessions}
    assert first == {s: hashed_home(s, list(reversed(pool))) for s in sessions}  # order-free
    spread = Counter(first.values())
    assert set(spread) == set(pool) and min(spread.values()) > 400  # about 500 each
    after = {s: hashed_home(s, [1, 2, 4]) for s in sessions}
    assert {s for s in sessions if after[s] != first[s]} == {s for s in sessions if first[s] == 3}


def test_the_config_refuses_processes_that_could_not_serve() -> None:
    from pearl.config import load
    from pearl.core.errors import ConfigError

    cfg = ROOT / "configs" / "local-cpu.toml"
    ok = load(cfg, ["gateway.listen=127.0.0.1:0", "gateway.processes=4"])
    assert ok.gateway.processes == 4 and load(cfg, []).gateway.processes == 0
    for sets, why in [
        (["gateway.processes=2"], "needs gateway.listen"),
        (["gateway.listen=127.0.0.1:0", "gateway.processes=65"], "at most 64"),
        (["gateway.listen=127.0.0.1:0", "gateway.processes=-1"], ">= 0"),
        (
            ["gateway.listen=127.0.0.1:0", "gateway.processes=2", "engine.router=sglang-router"],
            "sglang-router",
        ),
    ]:
        with pytest.raises(ConfigError, match=why):
            load(cfg, sets)
