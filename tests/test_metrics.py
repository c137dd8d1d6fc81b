"""pearl.metrics.Metrics counts what the log records: plans by kind and outcome, mode switches and
ratio changes at commit, aborts by reason, event -> plan latency; and addresses are checked."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pearl.core import events as ev
from pearl.core.errors import ConfigError
from pearl.core.state import Mode, Target
from pearl.core.view import ClusterView
from pearl.metrics import Metrics, parse_address

COLOC2 = Target(Mode.COLOCATED, 0, 0, 2)
SPLIT_1_1 = Target(Mode.DISAGGREGATED, 1, 1, 0)
SPLIT_2_1 = Target(Mode.DISAGGREGATED, 2, 1, 0)


def samples(m: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(m.exposition().decode()):
        for s in fam.samples:
            out[s.name, tuple(sorted(s.labels.items()))] = s.value
    return out


def test_plans_mode_switches_ratio_changes_and_aborts_are_counted() -> None:
    m = Metrics()
    view = ClusterView()
    m.committed([ev.GpusAdded((0, 1)), ev.PlanBegin(1, "expand", COLOC2, ())], view, received=0.0)
    m.committed([ev.PlanCommit(1)], view)
    m.committed([ev.PlanBegin(2, "rebalance", SPLIT_1_1, ())], view)
    m.committed([ev.PlanCommit(2)], view)  # colocated -> disaggregated
    m.committed([ev.PlanBegin(3, "rebalance", SPLIT_2_1, ())], view)
    m.committed([ev.PlanCommit(3)], view)  # 1P1D -> 2P1D
    m.committed([ev.PlanBegin(4, "expand", COLOC2, ())], view)
    m.committed([ev.PlanAbort(4, "training-begin: the trainer takes its GPUs back")], view)
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
    m.committed([ev.GpusReclaimed((4, 5))], view, received=0.0)  # a plan is in flight: no answer
    assert samples(m)["pearl_event_to_plan_seconds_count", ()] == 0
    m.committed([ev.PlanBegin(7, "return", COLOC2, ())], view)
    assert samples(m)["pearl_event_to_plan_seconds_count", ()] == 1


@pytest.mark.parametrize("bad", ["", "9440", "host:", ":9440", "127.0.0.1:-1", "h:99999", "h:x"])
def test_a_bad_address_names_the_setting_and_the_form(bad: str) -> None:
    with pytest.raises(ConfigError, match=r"daemon\.metrics.*HOST:PORT"):
        parse_address(bad)


def test_addresses() -> None:
    assert parse_address("127.0.0.1:9440") == ("127.0.0.1", 9440)
    assert parse_address("[::1]:0") == ("::1", 0)
