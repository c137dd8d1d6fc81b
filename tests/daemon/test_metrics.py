"""pearld's /metrics: the exposition parses, the named metrics exist and move with a scripted run
(a join and a reclaim that each switch the PD mode, a borrow cycle), only /metrics is served, and
a bad address fails the start."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
from typing import Any

import pytest
import zmq
from prometheus_client.parser import text_string_to_metric_families

from pearl.core import events as ev
from tests.daemon.conftest import Pearld, wait_until
from tests.daemon.test_startup import run_failing, the_problem
from tests.ports import free_base

pytestmark = pytest.mark.slow

# The names other tools rely on (issue 19), and the rest docs/observability.md lists.
NAMED = {
    "pearl_workers",
    "pearl_log_seq",
    "pearl_event_to_plan_seconds",
    "pearl_plans",  # pearl_plans_total
    "pearl_predicted_makespan_seconds",
    "pearl_measured_makespan_seconds",
    "pearl_borrow_return_seconds",
    "pearl_plan_seconds",
    "pearl_plan_aborts",
    "pearl_mode_switches",
    "pearl_ratio_changes",
    "pearl_gate_verdicts",
    "pearl_log_records",
    "pearl_worker_deaths",
    "pearl_prefill_workers",
    "pearl_decode_workers",
    "pearl_colocated_workers",
    "pearl_mode_info",
    "pearl_gpus",
    "pearl_training_info",
    "pearl_training_step",
    "pearl_weights_version",
    "pearl_plan_in_flight",
    "pearl_controller_recoveries",
    "pearl_predicted_colocated_makespan_seconds",
    "pearl_profile",
    "pearl_log_append_seconds",
    "pearl_borrow_activation_seconds",
    "pearl_log_fsync_seconds",
    "pearl_api_requests",
    "pearl_api_request_seconds",
}


def scrape(url: str) -> dict[str, Any]:
    """{family name: family} of one scrape, parsed by prometheus_client's own parser."""
    with urllib.request.urlopen(url, timeout=5) as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain")
        text = r.read().decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def value(fams: dict[str, Any], name: str, sample: str | None = None, **labels: str) -> float:
    """The sum of a family's samples named ``sample`` (default: the family) with ``labels``."""
    fam = fams[name]
    want = sample or name
    return sum(
        s.value
        for s in fam.samples
        if s.name == want and all(s.labels.get(k) == v for k, v in labels.items())
    )


def test_metrics_follow_a_scripted_run(pearld_factory: Any) -> None:
    port = free_base(1)
    d: Pearld = pearld_factory(
        "daemon.borrow=always",
        f"daemon.metrics=127.0.0.1:{port}",
        # No hysteresis: this small cluster's priors favour 2P3D at 5 dedicated workers by 1.2%
        # and colocation at 2, so the join and the reclaim each switch the mode. Both come while
        # training runs: no role switch begins while training GPUs are lent.
        "decision.mode_switch_threshold=0.0",
    )
    url = f"http://127.0.0.1:{port}/metrics"
    s = d.settled()
    assert s["mode"] == "colocated"
    m = scrape(url)
    assert NAMED <= set(m), NAMED - set(m)
    assert value(m, "pearl_log_seq") == s["seq"]
    assert value(m, "pearl_workers") == len(s["workers"])
    routable = [w for w in s["workers"] if w["activity"] == "active" and w["role"] != "training"]
    assert value(m, "pearl_colocated_workers") == s["N_C"] == len(routable)
    assert value(m, "pearl_gpus", pool="training") == 4
    events0 = value(m, "pearl_api_requests", "pearl_api_requests_total", command="event")
    appends0 = value(m, "pearl_log_append_seconds", "pearl_log_append_seconds_count")

    # Training Begin takes the lent GPUs back: one return plan, one return latency observed.
    returns0 = value(m, "pearl_borrow_return_seconds", "pearl_borrow_return_seconds_count")
    d.event(ev.TrainingBegin(step=1))
    wait_until(lambda: d.status()["training_may_proceed"] == 1, 20, "training may proceed")
    s = d.settled()
    m = scrape(url)
    assert value(m, "pearl_borrow_return_seconds", "pearl_borrow_return_seconds_count") == (
        returns0 + 1
    )
    assert value(m, "pearl_plans", "pearl_plans_total", kind="return", outcome="committed") >= 1
    plans0 = value(m, "pearl_plans", "pearl_plans_total", outcome="committed")
    switches0 = value(m, "pearl_mode_switches", "pearl_mode_switches_total")
    latencies0 = value(m, "pearl_event_to_plan_seconds", "pearl_event_to_plan_seconds_count")

    # A join while training runs: one event, one expansion plan committed (it re-roles the
    # serving workers too: a mode switch, one), one event -> plan latency observed.
    d.event(ev.GpusAdded(gpus=(8, 9, 10, 11, 12, 13)))
    s = d.settled()
    m = scrape(url)
    assert value(m, "pearl_log_seq") == s["seq"]
    assert value(m, "pearl_plans", "pearl_plans_total", kind="expand", outcome="committed") >= 1
    assert value(m, "pearl_plans", "pearl_plans_total", outcome="committed") == plans0 + 1
    count = value(m, "pearl_event_to_plan_seconds", "pearl_event_to_plan_seconds_count")
    assert count == latencies0 + 1
    assert value(m, "pearl_gpus", pool="present") == 6
    assert s["mode"] == "disaggregated"
    assert value(m, "pearl_mode_switches", "pearl_mode_switches_total") == switches0 + 1
    assert value(m, "pearl_mode_info", mode="disaggregated") == 1
    assert value(m, "pearl_prefill_workers") == s["N_P"] and s["N_P"] > 0

    # Training Finished lends the GPUs again: the borrowed workers join the split as it is.
    activations0 = value(
        m, "pearl_borrow_activation_seconds", "pearl_borrow_activation_seconds_count"
    )
    d.event(ev.TrainingFinished(step=1, weights_version=1))
    wait_until(
        lambda: (d.status()["borrow"]["current"] or {}).get("activation_s") is not None,
        20,
        "the borrowed workers to serve",
    )
    s = d.settled()
    m = scrape(url)
    activations = value(
        m, "pearl_borrow_activation_seconds", "pearl_borrow_activation_seconds_count"
    )
    assert activations == activations0 + 1
    assert s["mode"] == "disaggregated"
    assert value(m, "pearl_mode_switches", "pearl_mode_switches_total") == switches0 + 1
    assert value(m, "pearl_training_step") == 1 and value(m, "pearl_weights_version") == 1
    assert value(m, "pearl_log_seq") == s["seq"]

    # A reclaim while training runs again: the workers on those GPUs leave in a return plan
    # and the mode switches back.
    d.event(ev.TrainingBegin(step=2))
    wait_until(lambda: d.status()["training_may_proceed"] == 2, 20, "training may proceed")
    d.settled()
    switches = value(scrape(url), "pearl_mode_switches", "pearl_mode_switches_total")
    d.event(ev.GpusReclaimed(gpus=(8, 9, 10, 11, 12, 13)))
    s = d.settled()
    m = scrape(url)
    assert s["mode"] == "colocated"
    assert value(m, "pearl_mode_switches", "pearl_mode_switches_total") == switches + 1
    assert value(m, "pearl_gpus", pool="present") == 0
    assert value(m, "pearl_workers") == len(s["workers"])
    assert value(m, "pearl_log_records", "pearl_log_records_total") >= 1

    # The API and the log: five events answered, appends and their syncs timed, a message that
    # does not decode counted under kind "?".
    assert value(m, "pearl_api_requests", "pearl_api_requests_total", command="event") == (
        events0 + 5
    )
    assert value(m, "pearl_api_requests", "pearl_api_requests_total", command="status-request") >= 4
    assert value(m, "pearl_api_request_seconds", "pearl_api_request_seconds_count") >= 8
    assert value(m, "pearl_log_append_seconds", "pearl_log_append_seconds_count") >= appends0 + 4
    assert value(m, "pearl_log_fsync_seconds", "pearl_log_fsync_seconds_count") >= 4
    raw = zmq.Context.instance().socket(zmq.DEALER)
    raw.linger = 0
    raw.connect(d.endpoint)
    raw.send_multipart([b"not msgpack"])
    assert raw.poll(5000), "no error reply"
    raw.close()
    m = scrape(url)
    assert value(m, "pearl_api_requests", "pearl_api_requests_total", command="?") == 1
    assert value(m, "pearl_api_requests", "pearl_api_requests_total", outcome="malformed") == 1

    # Read-only, one path: anything else is 404; no control is served.
    for path in ("/", "/metrics/x", "/status"):
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5)
        assert e.value.code == 404
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(urllib.request.Request(url, data=b"x", method="POST"), timeout=5)
    assert e.value.code == 501


@pytest.mark.parametrize("address", ["nonsense", "127.0.0.1:notaport", "127.0.0.1:70000"])
def test_a_malformed_metrics_address_fails_the_start_in_one_line(
    pearld_factory: Any, address: str
) -> None:
    d: Pearld = pearld_factory(f"daemon.metrics={address}", start=False)
    rc, _, err = run_failing(d.command(d.endpoint))
    assert rc != 0
    line = the_problem(err)
    assert "daemon.metrics" in line and address in line and "HOST:PORT" in line, line


def test_a_taken_metrics_port_fails_the_start_in_one_line(pearld_factory: Any) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        d: Pearld = pearld_factory(f"daemon.metrics=127.0.0.1:{port}", start=False)
        rc, _, err = run_failing(d.command(d.endpoint))
    assert rc != 0
    line = the_problem(err)
    assert f"127.0.0.1:{port}" in line and "cannot listen" in line, line
