"""pearl.metrics.Metrics counts what the log records: plans by kind and outcome, mode switches and
ratio changes at commit, aborts by reason, event -> plan latency; and addresses are checked.
HostMetrics moves by exactly the engine telemetry it is given and follows the engine's role;
targets.json lists pearld and the worker hosts, written atomically and only when it changes."""

from __future__ import annotations

import json
import os
import socket
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pearl.core import events as ev
from pearl.core.errors import ConfigError
from pearl.core.state import Mode, Role, Target
from pearl.core.view import ClusterView
from pearl.engines.base import EngineTelemetry, IterationStat, KVTransferStat
from pearl.metrics import (
    HostMetrics,
    Metrics,
    MetricsServer,
    parse_address,
    render_targets,
    write_targets,
)

COLOC2 = Target(mode=Mode.COLOCATED, N_P=0, N_D=0, N_C=2)
SPLIT_1_1 = Target(mode=Mode.DISAGGREGATED, N_P=1, N_D=1, N_C=0)
SPLIT_2_1 = Target(mode=Mode.DISAGGREGATED, N_P=2, N_D=1, N_C=0)


def samples(m: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(m.exposition().decode()):
        for s in fam.samples:
            out[s.name, tuple(sorted(s.labels.items()))] = s.value
    return out


def test_plans_mode_switches_ratio_changes_and_aborts_are_counted() -> None:
    m = Metrics()
    view = ClusterView()
    m.committed(
        [ev.GpusAdded(gpus=(0, 1)), ev.PlanBegin(plan=1, cause="expand", target=COLOC2, steps=())],
        view,
        received=0.0,
    )
    m.committed([ev.PlanCommit(plan=1)], view)
    m.committed([ev.PlanBegin(plan=2, cause="rebalance", target=SPLIT_1_1, steps=())], view)
    m.committed([ev.PlanCommit(plan=2)], view)  # colocated -> disaggregated
    m.committed([ev.PlanBegin(plan=3, cause="rebalance", target=SPLIT_2_1, steps=())], view)
    m.committed([ev.PlanCommit(plan=3)], view)  # 1P1D -> 2P1D
    m.committed([ev.PlanBegin(plan=4, cause="expand", target=COLOC2, steps=())], view)
    m.committed(
        [ev.PlanAbort(plan=4, reason="training-begin: the trainer takes its GPUs back")], view
    )
    s = samples(m)
    assert s["pearl_plans_total", (("kind", "expand"), ("outcome", "committed"))] == 1
    assert s["pearl_plans_total", (("kind", "rebalance"), ("outcome", "committed"))] == 2
    assert s["pearl_plans_total", (("kind", "expand"), ("outcome", "aborted"))] == 1
    assert s["pearl_plan_aborts_total", (("reason", "training-begin"),)] == 1
    assert s["pearl_mode_switches_total", ()] == 1
    assert s["pearl_ratio_changes_total", ()] == 1
    assert s["pearl_event_to_plan_seconds_count", ()] == 1  # one elastic event, one answer
    assert s["pearl_plan_seconds_count", (("kind", "rebalance"),)] == 2
    assert s["pearl_log_records_total", ()] == 9
    assert s["pearl_log_seq", ()] == 0


def test_an_event_waits_for_the_next_plan() -> None:
    m = Metrics()
    view = ClusterView()
    m.committed(
        [ev.GpusReclaimed(gpus=(4, 5))], view, received=0.0
    )  # a plan is in flight: no answer
    assert samples(m)["pearl_event_to_plan_seconds_count", ()] == 0
    m.committed([ev.PlanBegin(plan=7, cause="return", target=COLOC2, steps=())], view)
    assert samples(m)["pearl_event_to_plan_seconds_count", ()] == 1


@pytest.mark.parametrize("event", ev.ELASTIC_EVENTS, ids=lambda c: c.KIND)
def test_every_elastic_event_waits_for_its_plan(event: type[ev.ElasticEvent]) -> None:
    m = Metrics()
    view = ClusterView()
    fields = {"gpus": (4,), "deadline": 1.8e9, "step": 2}
    record = event(**{k: v for k, v in fields.items() if k in event.__struct_fields__})
    m.committed([record], view, received=0.0)
    m.committed([ev.WeightsPublished(version=3)], view)  # not elastic: no plan answers it
    m.committed([ev.PlanBegin(plan=7, cause="return", target=COLOC2, steps=())], view)
    assert samples(m)["pearl_event_to_plan_seconds_count", ()] == 1


@pytest.mark.parametrize("cause", ev.AbortCause)
def test_an_abort_is_labelled_by_its_cause(cause: ev.AbortCause) -> None:
    m = Metrics()
    view = ClusterView()
    m.committed([ev.PlanBegin(plan=4, cause="expand", target=COLOC2, steps=())], view)
    m.committed([ev.PlanAbort(plan=4, reason=cause.reason("3 lost: no reply"))], view)
    assert samples(m)["pearl_plan_aborts_total", (("reason", cause.value),)] == 1


def test_api_requests_log_appends_and_syncs_are_timed() -> None:
    m = Metrics(deaths=lambda: {"exited": 3}, hosts=lambda: {"restarts": 2, "lost": 1})
    m.api_request("event", "ok", 0.002)
    m.api_request("event", "rejected", 0.001)
    m.api_request("?", "malformed", 0.0001)
    m.committed([ev.GpusAdded(gpus=(0, 1))], ClusterView(), append_s=0.0007)
    m.committed([ev.PlanCommit(plan=1)], ClusterView())  # no append time given: none observed
    m.log_synced(0.0004)
    s = samples(m)
    assert s["pearl_api_requests_total", (("command", "event"), ("outcome", "ok"))] == 1
    assert s["pearl_api_requests_total", (("command", "event"), ("outcome", "rejected"))] == 1
    assert s["pearl_api_requests_total", (("command", "?"), ("outcome", "malformed"))] == 1
    assert s["pearl_api_request_seconds_count", (("command", "event"),)] == 2
    assert s["pearl_api_request_seconds_sum", (("command", "event"),)] == pytest.approx(0.003)
    assert s["pearl_log_append_seconds_count", ()] == 1
    assert s["pearl_log_append_seconds_bucket", (("le", "0.001"),)] == 1
    assert s["pearl_log_fsync_seconds_count", ()] == 1
    assert s["pearl_log_fsync_seconds_sum", ()] == pytest.approx(0.0004)
    assert s["pearl_worker_deaths", (("reason", "exited"),)] == 3
    assert s["pearl_worker_restarts_total", ()] == 2
    assert s["pearl_workers_lost_total", ()] == 1


@pytest.mark.parametrize("bad", ["", "9440", "host:", ":9440", "127.0.0.1:-1", "h:99999", "h:x"])
def test_a_bad_address_names_the_setting_and_the_form(bad: str) -> None:
    with pytest.raises(ConfigError, match=r"daemon\.metrics.*HOST:PORT"):
        parse_address(bad)


def test_addresses() -> None:
    assert parse_address("127.0.0.1:9440") == ("127.0.0.1", 9440)
    assert parse_address("[::1]:0") == ("::1", 0)


# -- a worker host's metrics ---------------------------------------------------------------------


class FakeEngine:
    """What HostMetrics reads at scrape time: role, in_flight(), kv_usage()."""

    def __init__(self, role: Role, in_flight: int, pages: int, free: int, cached: int) -> None:
        self.role, self._n = role, in_flight
        self.usage = {"pages": pages, "free": free, "cached": cached}

    def in_flight(self) -> list[str]:
        return [f"r{i}" for i in range(self._n)]

    def kv_usage(self) -> dict[str, int]:
        return self.usage


def host_samples(m: HostMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(m.exposition().decode()):
        for s in fam.samples:
            out[s.name, tuple(sorted(s.labels.items()))] = s.value
    return out


def of(role: str, **more: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted({"worker": "3", "role": role, **more}.items()))


TELEMETRY = EngineTelemetry(
    iterations=(
        IterationStat(t_start=0.0, duration_s=0.0005, decode_batch=4, prefill_tokens=100),
        IterationStat(t_start=1.0, duration_s=0.02, decode_batch=8, prefill_tokens=0),
        IterationStat(t_start=2.0, duration_s=20.0, decode_batch=2, prefill_tokens=50),
    ),
    transfers=(
        KVTransferStat(transfer_id="a", bytes=1000, duration_s=0.1, direction="send"),
        KVTransferStat(transfer_id="b", bytes=500, duration_s=0.1, direction="recv"),
        KVTransferStat(transfer_id="c", bytes=24, duration_s=0.1, direction="send"),
    ),
)


def test_host_metrics_move_by_exactly_the_telemetry_observed() -> None:
    m = HostMetrics(3, 7, "sim")
    s = host_samples(m)
    assert s["pearl_worker_info", of("none", incarnation="7", engine="sim")] == 1
    assert s["pearl_worker_requests_in_flight", of("none")] == 0
    assert not any(name == "pearl_worker_kv_used_ratio" for name, _ in s)  # no engine: no sample
    assert s["pearl_worker_decode_tokens_total", of("none")] == 0

    m.observe(TELEMETRY)
    s = host_samples(m)
    assert s["pearl_worker_decode_tokens_total", of("none")] == 14
    assert s["pearl_worker_prefill_tokens_total", of("none")] == 150
    assert s["pearl_worker_iterations_total", of("none")] == 3
    h = "pearl_worker_iteration_seconds"
    assert s[f"{h}_bucket", of("none", le="0.001")] == 1
    assert s[f"{h}_bucket", of("none", le="0.01")] == 1
    assert s[f"{h}_bucket", of("none", le="0.025")] == 2
    assert s[f"{h}_bucket", of("none", le="10.0")] == 2
    assert s[f"{h}_bucket", of("none", le="+Inf")] == 3
    assert s[f"{h}_count", of("none")] == 3
    assert s[f"{h}_sum", of("none")] == pytest.approx(20.0205)
    assert s["pearl_worker_kv_transfer_bytes_total", of("none", direction="send")] == 1024
    assert s["pearl_worker_kv_transfer_bytes_total", of("none", direction="recv")] == 500

    m.observe(
        EngineTelemetry(
            iterations=(
                IterationStat(t_start=3.0, duration_s=0.003, decode_batch=5, prefill_tokens=7),
            )
        )
    )
    m.observe(EngineTelemetry())  # nothing happened: nothing moves
    s = host_samples(m)
    assert s["pearl_worker_decode_tokens_total", of("none")] == 14 + 5
    assert s["pearl_worker_prefill_tokens_total", of("none")] == 150 + 7
    assert s["pearl_worker_iterations_total", of("none")] == 4
    assert s[f"{h}_bucket", of("none", le="0.0025")] == 1
    assert s[f"{h}_bucket", of("none", le="0.005")] == 2
    assert s["pearl_worker_kv_transfer_bytes_total", of("none", direction="send")] == 1024


def test_host_metrics_read_the_engine_at_scrape_time_and_follow_its_role() -> None:
    m = HostMetrics(3, 7, "sim")
    m.observe(TELEMETRY)
    engine = FakeEngine(Role.DECODE, in_flight=2, pages=100, free=60, cached=15)
    m.watch(engine)
    s = host_samples(m)
    assert s["pearl_worker_info", of("decode", incarnation="7", engine="sim")] == 1
    assert s["pearl_worker_requests_in_flight", of("decode")] == 2
    assert s["pearl_worker_kv_used_ratio", of("decode")] == pytest.approx(0.25)
    # Counters continue under the new role; no series of the old role is left behind.
    assert s["pearl_worker_decode_tokens_total", of("decode")] == 14
    assert not any(dict(labels).get("role") == "none" for _, labels in s)

    engine._n, engine.usage = 5, {"pages": 100, "free": 0, "cached": 0}  # read live
    m.set_role("prefill")
    s = host_samples(m)
    assert s["pearl_worker_requests_in_flight", of("prefill")] == 5
    assert s["pearl_worker_kv_used_ratio", of("prefill")] == 1.0
    assert s["pearl_worker_iterations_total", of("prefill")] == 3
    assert {dict(labels)["role"] for _, labels in s} == {"prefill"}

    engine.usage = {"pages": 0, "free": 0, "cached": 0}  # released: no pool, no ratio
    assert ("pearl_worker_kv_used_ratio", of("prefill")) not in host_samples(m)
    m.watch(None)
    s = host_samples(m)
    assert s["pearl_worker_requests_in_flight", of("prefill")] == 0
    assert all(name != "pearl_worker_kv_used_ratio" for name, _ in s)


def test_a_host_serves_only_get_metrics() -> None:
    m = HostMetrics(3, 7, "sim")
    server = MetricsServer(m, "127.0.0.1:0", "--metrics")
    try:
        url = f"http://{server.address}"
        with urllib.request.urlopen(f"{url}/metrics", timeout=5) as r:
            text = r.read().decode()
        assert 'pearl_worker_info{engine="sim",incarnation="7",role="none",worker="3"}' in text
        for path in ("/", "/metrics/x"):
            with pytest.raises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(f"{url}{path}", timeout=5)
            assert e.value.code == 404
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(urllib.request.Request(url, data=b"x"), timeout=5)
        assert e.value.code == 501
    finally:
        server.close()


def test_a_bad_or_taken_host_address_is_one_line_naming_it() -> None:
    with pytest.raises(ConfigError, match=r"^--metrics = 'nope': expected HOST:PORT"):
        MetricsServer(HostMetrics(3, 7, "sim"), "nope", "--metrics")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=rf"^--metrics = '127.0.0.1:{port}': cannot listen"):
            MetricsServer(HostMetrics(3, 7, "sim"), f"127.0.0.1:{port}", "--metrics")


# -- targets.json --------------------------------------------------------------------------------


def test_targets_list_pearld_then_each_worker_host_with_its_labels() -> None:
    got = render_targets(
        "0.0.0.0:9440", {3: ("127.0.0.1:41001", "decode"), 1: ("127.0.0.1:41000", "prefill")}
    )
    assert got == [
        {"targets": ["127.0.0.1:9440"], "labels": {"job": "pearld"}},  # a wildcard: loopback
        {
            "targets": ["127.0.0.1:41000"],
            "labels": {"job": "pearl-worker", "worker": "1", "role": "prefill"},
        },
        {
            "targets": ["127.0.0.1:41001"],
            "labels": {"job": "pearl-worker", "worker": "3", "role": "decode"},
        },
    ]
    assert render_targets("[::1]:9440", {}) == [
        {"targets": ["[::1]:9440"], "labels": {"job": "pearld"}}
    ]


def test_targets_are_written_atomically_and_only_when_they_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "targets.json"
    replaced: list[tuple[str, str]] = []
    real = os.replace

    def replace(src: Any, dst: Any) -> None:
        replaced.append((str(src), str(dst)))
        assert Path(src).read_bytes().endswith(b"]\n")  # complete before it is swapped in
        real(src, dst)

    monkeypatch.setattr("pearl.metrics.os.replace", replace)
    workers = {3: ("127.0.0.1:41001", "decode")}
    assert write_targets(path, "127.0.0.1:9440", workers) is True
    assert json.loads(path.read_text()) == render_targets("127.0.0.1:9440", workers)
    assert len(replaced) == 1 and replaced[0][1] == str(path)
    assert Path(replaced[0][0]).parent == tmp_path and Path(replaced[0][0]) != path
    inode = path.stat().st_ino

    assert write_targets(path, "127.0.0.1:9440", dict(workers)) is False  # unchanged
    assert len(replaced) == 1 and path.stat().st_ino == inode

    assert write_targets(path, "127.0.0.1:9440", {3: ("127.0.0.1:41001", "prefill")}) is True
    assert json.loads(path.read_text())[1]["labels"]["role"] == "prefill"
    assert write_targets(path, "127.0.0.1:9440", {}) is True  # the host left
    assert json.loads(path.read_text()) == [
        {"targets": ["127.0.0.1:9440"], "labels": {"job": "pearld"}}
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["targets.json"]  # no temp file left
