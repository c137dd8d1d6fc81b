"""deploy/: the Grafana dashboard and the Prometheus scrape config are well formed, and every
metric the dashboard queries is one pearld (pearl.metrics.Metrics) or a worker host
(pearl.metrics.HostMetrics) really exposes — a renamed metric breaks this test, not a panel."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml  # PyYAML: installed with transformers (huggingface_hub), not a dependency of ours
from prometheus_client.parser import text_string_to_metric_families

from pearl import config as config_mod
from pearl.core import events as ev
from pearl.core.borrow import BorrowCycle
from pearl.core.gate import GateResult
from pearl.core.profile import prior_profile
from pearl.core.state import Activity, Mode, Role, Target, Worker, Zone
from pearl.core.view import ClusterView, DecisionView, TableSnapshot
from pearl.metrics import Metrics

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "deploy" / "grafana" / "pearl.json"
PROMETHEUS = ROOT / "deploy" / "prometheus.yml"
DS_UID = "${DS_PROMETHEUS}"
# Grafana's own variables a query may use besides the dashboard's.
BUILTIN_VARS = {"__rate_interval", "__interval", "__range", "__range_s", "__interval_ms"}
METRIC = re.compile(r"\bpearl_[a-z_]+\b")
HIST_SUFFIXES = ("_bucket", "_sum", "_count")
COLOC2 = Target(mode=Mode.COLOCATED, N_P=0, N_D=0, N_C=2)

# What the brief for the dashboard asks it to show, by the metric each panel needs.
REQUIRED = {
    "pearl_workers",
    "pearl_prefill_workers",
    "pearl_decode_workers",
    "pearl_colocated_workers",
    "pearl_mode_info",
    "pearl_predicted_makespan_seconds",
    "pearl_measured_makespan_seconds",
    "pearl_makespan_prediction_ratio",
    "pearl_borrow_return_seconds_bucket",
    "pearl_gate_verdicts_total",
    "pearl_plan_seconds_bucket",
    "pearl_event_to_plan_seconds_bucket",
    "pearl_plans_total",
    "pearl_plan_aborts_total",
    "pearl_gpus",
    "pearl_log_seq",
    "pearl_log_records_total",
    "pearl_worker_deaths",
    "pearl_worker_decode_tokens_total",
    "pearl_worker_requests_in_flight",
    "pearl_worker_kv_used_ratio",
}


# -- the files ----------------------------------------------------------------------------------


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def panels() -> list[dict[str, Any]]:
    """Every panel, rows included, with those nested in collapsed rows."""
    out = []
    for p in dashboard()["panels"]:
        out.append(p)
        out.extend(p.get("panels", []))
    return out


def targets() -> list[tuple[str, dict[str, Any]]]:
    return [(p["title"], t) for p in panels() for t in p.get("targets", [])]


def referenced() -> dict[str, set[str]]:
    """Metric name -> titles of the panels whose queries use it (names as written: a histogram
    appears as its ``_bucket``/``_sum``/``_count`` series)."""
    out: dict[str, set[str]] = {}
    for title, t in targets():
        for name in METRIC.findall(t["expr"]):
            out.setdefault(name, set()).add(title)
    return out


def scrape_config() -> dict[str, Any]:
    return yaml.safe_load(PROMETHEUS.read_text())


# -- what pearld and a worker host expose -------------------------------------------------------


def series_names(exposition: bytes) -> set[str]:
    """Every series name the exposition can produce: its samples', and those its families
    declare even before they have a sample (a labelled counter nothing has counted yet)."""
    names: set[str] = set()
    for fam in text_string_to_metric_families(exposition.decode()):
        names.update(s.name for s in fam.samples)
        if fam.type == "counter":
            names.update({fam.name + "_total", fam.name + "_created"})
        elif fam.type == "histogram":
            names.update(fam.name + s for s in (*HIST_SUFFIXES, "_created"))
        else:
            names.add(fam.name)
    return names


def pearld_series() -> set[str]:
    """pearld's metrics fed a view with everything in it (profile, decision, gate, a returned
    borrow cycle) and records of every kind it counts, so every family has its samples."""
    m = Metrics(deaths=lambda: {"missed heartbeats": 1}, hosts=lambda: {"restarts": 1, "lost": 0})
    workers = (
        Worker(
            id=0,
            gpus=(0,),
            role=Role.TRAINING,
            activity=Activity.INACTIVE,
            zone=Zone.OVERLAP,
            incarnation=1,
        ),
        Worker(
            id=1,
            gpus=(2,),
            role=Role.COLOCATED,
            activity=Activity.ACTIVE,
            zone=Zone.DEDICATED,
            incarnation=2,
        ),
        Worker(
            id=2,
            gpus=(3,),
            role=Role.COLOCATED,
            activity=Activity.ACTIVE,
            zone=Zone.DEDICATED,
            incarnation=3,
        ),
    )
    view = ClusterView(
        table=TableSnapshot(seq=12, tp=1, workers=workers, training_gpus=(0,)),
        profile=prior_profile(config_mod.load(None)),
        decision=DecisionView(target=COLOC2, predicted_makespan_s=90.0, reason="test"),
        measured_makespan_s=80.0,
        gate=GateResult(enabled=True, benefit_s=1.0, T_ded=3.0, T_full=2.0, T_toggle=0.05),
        cycle=BorrowCycle(step=1, opened=0.0, closed=1.0, returned=1.07),
    )
    telemetry = ev.Telemetry(
        step=1,
        batch=16,
        S=4,
        delta_L=120,
        r=48,
        theta=0.3,
        A=0.01,
        b=0.001,
        t_prefill=1e-4,
        T_env=0.3,
        makespan_s=80.0,
    )
    m.committed(
        [ev.GpusAdded(gpus=(3,)), ev.PlanBegin(plan=1, cause="expand", target=COLOC2, steps=())],
        view,
        received=0.0,
    )
    m.committed([ev.PlanCommit(plan=1), telemetry], view)
    m.committed([ev.PlanBegin(plan=2, cause="rebalance", target=COLOC2, steps=())], view)
    m.committed([ev.PlanAbort(plan=2, reason="worker 3 failed")], view)
    return series_names(m.exposition())


def host_series() -> set[str]:
    """A worker host's metrics, fed one decode host's telemetry (an iteration, a KV transfer each
    way)."""
    from pearl.engines.base import EngineTelemetry, IterationStat, KVTransferStat
    from pearl.metrics import HostMetrics

    m = HostMetrics(3, 1, "sim")  # worker, incarnation, engine
    m.set_role("decode")
    m.observe(
        EngineTelemetry(
            iterations=(
                IterationStat(t_start=0.0, duration_s=0.02, decode_batch=4, prefill_tokens=128),
            ),
            transfers=(
                KVTransferStat(transfer_id="t1", bytes=4096, duration_s=0.001, direction="send"),
                KVTransferStat(transfer_id="t2", bytes=4096, duration_s=0.001, direction="recv"),
            ),
        )
    )
    return series_names(m.exposition())


# -- the dashboard ------------------------------------------------------------------------------


def test_the_dashboard_imports_on_any_grafana() -> None:
    d = dashboard()
    assert d["schemaVersion"] >= 38
    assert d["title"] and d["uid"]
    inputs = {i["name"]: i for i in d["__inputs"]}
    assert inputs["DS_PROMETHEUS"]["pluginId"] == "prometheus"
    variables = {v["name"]: v for v in d["templating"]["list"]}
    ds = variables["DS_PROMETHEUS"]  # provisioned from a file, where __inputs is not asked
    assert (ds["type"], ds["query"]) == ("datasource", "prometheus")


def test_panels_have_unique_ids_fit_the_grid_and_sit_in_rows() -> None:
    ps = panels()
    ids = [p["id"] for p in ps]
    assert len(ids) == len(set(ids)), "duplicate panel ids"
    assert ps[0]["type"] == "row", "panels are grouped in rows"
    assert sum(p["type"] == "row" for p in ps) >= 4
    cells: dict[tuple[int, int], str] = {}
    for p in ps:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["w"] > 0 and g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']!r} overlaps {cells[x, y]!r}"
                cells[x, y] = p["title"]


def test_every_panel_and_target_has_a_title_a_query_and_the_datasource() -> None:
    variables = {v["name"] for v in dashboard()["templating"]["list"]} | BUILTIN_VARS
    for p in panels():
        assert p.get("title"), p["id"]
        if p["type"] == "row":
            continue
        assert p["datasource"]["uid"] == DS_UID, p["title"]
        assert p["targets"], p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]
        if p["type"] == "timeseries":
            assert p["fieldConfig"]["defaults"].get("unit"), f"{p['title']}: no unit"
    for title, t in targets():
        assert t.get("expr", "").strip(), title
        assert t["datasource"] == {"type": "prometheus", "uid": DS_UID}, title
        assert t["expr"].count("(") == t["expr"].count(")"), title
        assert t["expr"].count("[") == t["expr"].count("]"), title
        for var in re.findall(r"\$\{?(\w+)", t["expr"]):
            assert var in variables, f"{title}: ${var} is not a dashboard variable"


def test_quantiles_come_from_bucket_rates_summed_by_le() -> None:
    quantiles = [(title, t["expr"]) for title, t in targets() if "histogram_quantile" in t["expr"]]
    assert quantiles
    for title, expr in quantiles:
        assert re.search(r"sum by \(le\b[^)]*\) \(rate\(pearl_\w+_bucket\[", expr), (title, expr)


def test_the_dashboard_shows_what_it_was_built_for() -> None:
    missing = REQUIRED - set(referenced())
    assert not missing, f"no panel queries {sorted(missing)}"


def test_every_pearld_metric_the_dashboard_queries_is_exposed_by_pearld() -> None:
    """Names pearld does not expose must be worker-host metrics (checked below)."""
    exposed = pearld_series()
    assert {"pearl_makespan_prediction_ratio", "pearl_profile"} <= exposed  # the feed is full
    for name in referenced():
        base = name.removesuffix("_bucket").removesuffix("_sum").removesuffix("_count")
        if name != base:
            assert base + "_bucket" in exposed or base.startswith("pearl_worker_"), name
    unknown = {
        n: sorted(titles)
        for n, titles in referenced().items()
        if n not in exposed and not n.startswith("pearl_worker_")
    }
    assert not unknown, f"pearld exposes none of {unknown}"


def test_every_other_metric_the_dashboard_queries_is_exposed_by_a_worker_host() -> None:
    exposed = pearld_series()
    wanted = {n: sorted(t) for n, t in referenced().items() if n not in exposed}
    assert wanted, "the dashboard shows worker-host metrics"
    host = host_series()
    unknown = {n: titles for n, titles in wanted.items() if n not in host}
    assert not unknown, f"neither pearld nor a worker host exposes {unknown}"


# -- the scrape config --------------------------------------------------------------------------


def test_one_scrape_job_finds_pearld_and_every_worker_host_in_targets_json() -> None:
    c = scrape_config()
    assert c["global"]["scrape_interval"] == "5s"
    (job,) = c["scrape_configs"]
    assert "static_configs" not in job
    assert "relabel_configs" not in job  # the job label comes from targets.json, untouched
    assert job["honor_labels"] is True  # a host's own worker/role beat targets.json's
    (sd,) = job["file_sd_configs"]
    assert sd["refresh_interval"]
    assert sd["files"]
    for path in sd["files"]:
        assert path.endswith("/targets.json"), path
        assert not Path(path).is_absolute(), path


def test_the_scrape_config_paths_are_state_dirs_of_this_repository() -> None:
    """Relative file-SD paths are taken from the config's directory: each lands in the repo."""
    (job,) = scrape_config()["scrape_configs"]
    for path in job["file_sd_configs"][0]["files"]:
        resolved = (PROMETHEUS.parent / path).resolve()
        assert resolved.is_relative_to(ROOT), path


@pytest.mark.parametrize("path", ["deploy/prometheus.yml", "deploy/grafana/pearl.json"])
def test_the_docs_say_how_to_use_them(path: str) -> None:
    assert path in (ROOT / "docs" / "observability.md").read_text()


def listed_metrics() -> set[str]:
    """Every metric name in the first column of docs/observability.md's tables."""
    section = (ROOT / "docs" / "observability.md").read_text()
    names: set[str] = set()
    for line in section.splitlines():
        if line.startswith("| `pearl_"):
            first = line.split("|")[1]
            names.update(re.sub(r"\{.*?\}", "", n) for n in re.findall(r"`(pearl_[^`]+)`", first))
    return names


def test_every_metric_the_docs_list_is_exposed() -> None:
    listed = listed_metrics()
    assert len(listed) >= 30, sorted(listed)
    exposed = pearld_series() | host_series()
    missing = {n for n in listed if n not in exposed and f"{n}_bucket" not in exposed}
    assert not missing, f"docs/observability.md lists metrics nobody exposes: {sorted(missing)}"
