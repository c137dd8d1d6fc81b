"""Worker hosts' /metrics and targets.json: with pearld's metrics on, every worker host serves its
engine's metrics on loopback, status --json lists where, and targets.json (Prometheus file SD)
lists pearld and every live host, losing a host whose GPUs are reclaimed; with them off no host
serves and there is no targets.json."""

from __future__ import annotations

import json
from typing import Any

import pytest

from actors import names
from actors.messages import Route
from pearl.core import events as ev
from pearl.core.schema import to_wire
from pearl.engines.base import GenerateRequest, SamplingParams
from tests.daemon.conftest import Pearld, wait_until
from tests.daemon.test_metrics import scrape, value
from tests.ports import free_base
from transports.protocol import Call

pytestmark = pytest.mark.slow


def tell(d: Pearld, actor: str, msg: Any) -> None:
    assert d.client is not None
    d.client.request(Call(actor=actor, method="tell", args={"msg": to_wire(msg)}))


def targets(d: Pearld) -> list[dict[str, Any]] | None:
    path = d.state / "targets.json"
    return json.loads(path.read_text()) if path.exists() else None


def workers_in(t: list[dict[str, Any]] | None) -> dict[int, tuple[str, str]]:
    """{worker: (address, role)} of the worker hosts a targets.json lists."""
    return {
        int(e["labels"]["worker"]): (e["targets"][0], e["labels"]["role"])
        for e in t or []
        if e["labels"]["job"] == "pearl-worker"
    }


def rollout(s: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {w["id"]: w for w in s["workers"] if w["role"] != "training"}


def address(s: dict[str, Any], worker: int) -> str | None:
    """Where status --json says worker's host serves its metrics (None: it does not)."""
    return s["worker_metrics"].get(str(worker))


def listed(d: Pearld) -> dict[str, Any] | None:
    """The status once targets.json lists exactly its rollout workers, in their roles, at the
    addresses status --json gives."""
    s = d.settled()
    want = {i: (address(s, i), w["role"]) for i, w in rollout(s).items()}
    return s if workers_in(targets(d)) == want else None


def test_worker_hosts_serve_metrics_and_targets_follow_them(pearld_factory: Any) -> None:
    port = free_base(1)
    d: Pearld = pearld_factory(f"daemon.metrics=127.0.0.1:{port}")
    s = wait_until(lambda: listed(d), 30, "targets.json to list every worker host", every=0.2)
    t = targets(d)
    assert t is not None and t[0] == {"targets": [f"127.0.0.1:{port}"], "labels": {"job": "pearld"}}
    rows = rollout(s)
    assert rows and all(address(s, w).startswith("127.0.0.1:") for w in rows)
    assert all(address(s, w["id"]) is None for w in s["workers"] if w["role"] == "training")

    for wid, w in rows.items():  # each target is that worker's host
        m = scrape(f"http://{address(s, wid)}/metrics")
        info = [x for x in m["pearl_worker_info"].samples if x.name == "pearl_worker_info"]
        assert [x.labels["worker"] for x in info] == [str(wid)]
        assert info[0].labels["incarnation"] == str(w["incarnation"])
        assert info[0].labels["engine"] == "sim"
        if w["activity"] == "active":
            assert info[0].labels["role"] == w["role"]
            assert value(m, "pearl_worker_kv_used_ratio") >= 0
        assert value(m, "pearl_worker_requests_in_flight") >= 0

    # Requests run: the engines' telemetry moves their hosts' counters.
    for i in range(4):
        request = GenerateRequest(
            rid=f"m{i}", input_ids=(1, 2, 3), sampling=SamplingParams(max_new_tokens=8)
        )
        tell(d, names.ROUTER, Route(request=request, reply_to="nobody"))  # the results go nowhere

    def total(counter: str) -> float:  # over the hosts: the router spreads the requests
        return sum(
            value(scrape(f"http://{address(s, wid)}/metrics"), counter, f"{counter}_total")
            for wid in rows
        )

    # Each request is prefilled (3 tokens) then decoded; the hosts' telemetry arrives in its own
    # time, so wait for both counters rather than reading one when the other moves.
    wait_until(
        lambda: (
            total("pearl_worker_prefill_tokens") >= 4 * 3
            and total("pearl_worker_decode_tokens") >= 4
        ),
        20,
        "every request prefilled and some tokens decoded",
        every=0.2,
    )
    assert total("pearl_worker_iterations") > 0

    # A join: its host becomes a target; a reclaim: it leaves targets.json.
    d.event(ev.GpusAdded(gpus=(8, 9)))
    s = wait_until(lambda: listed(d), 30, "the joiner to be listed", every=0.2)
    joined = [i for i, w in rollout(s).items() if set(w["gpus"]) <= {8, 9}]
    assert joined and set(joined) <= set(workers_in(targets(d)))
    d.event(ev.GpusReclaimed(gpus=(8, 9)))
    s = wait_until(lambda: listed(d), 30, "the reclaimed worker to leave", every=0.2)
    assert not set(joined) & set(workers_in(targets(d)))
    assert set(workers_in(targets(d))) == set(rollout(s))


def test_without_metrics_no_host_serves_and_there_is_no_targets_json(
    pearld_factory: Any,
) -> None:
    d: Pearld = pearld_factory(start=False)
    d.state.mkdir(parents=True)
    (d.state / "targets.json").write_text("[]\n")  # an earlier run's, with metrics on
    d.start()
    s = d.settled()
    assert rollout(s) and s["worker_metrics"] == {}
    assert not (d.state / "targets.json").exists()
    pids = d.host_pids()
    assert pids
    for name in pids:  # a forked host's first log line is its command (its cmdline the server's)
        command = (d.state / "workers" / f"{name}.log").read_text().splitlines()[0]
        assert command.startswith("python -m actors.worker_host ") and "--metrics" not in command
