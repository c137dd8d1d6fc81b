"""Prometheus metrics: pearld's (the control plane's view, its decisions and their latencies)
and every worker host's (its engine's work).

:class:`Metrics` is fed by the Orchestrator after every logged change (the records just appended
and the new :class:`~pearl.core.view.ClusterView`) and renders, at scrape time, gauges from the
latest view plus counters and histograms it kept from the records. :class:`HostMetrics` is fed by
a worker host's WorkerActor (the engine telemetry it reports, its role, its engine). A
:class:`MetricsServer` serves either as ``GET /metrics`` (text exposition format) over HTTP:
pearld's on ``[daemon] metrics = "HOST:PORT"`` (loopback unless ``daemon.metrics_public``: the
port has no authentication), each worker host's on a free loopback port when pearld's is on. Every
other path is 404 and no other method is served. Nothing they expose is a control, a key path or a
task's content; the server is a bounded surface (:mod:`pearl.metrics_http`). :func:`write_targets`
keeps ``targets.json`` in pearld's state directory: where Prometheus finds all of them
(``file_sd_configs``).

Names follow Prometheus conventions: a ``pearl_`` prefix, base units (seconds), ``_total``
counters. The list is in the README (Observability).
"""

from __future__ import annotations

import bisect
import itertools
import json
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)

from pearl.core import events as ev
from pearl.core.makespan import T_coloc
from pearl.core.state import Activity, Mode, Role, Target
from pearl.core.view import ClusterView
from pearl.metrics_http import (
    MAX_CONNECTIONS,
    READ_TIMEOUT_S,
    MetricsServer,
    check_exposure,
    parse_address,
)
from transports.rpc import MALFORMED

if TYPE_CHECKING:
    from pearl.core.gate import GateResult
    from pearl.engines.base import Engine, EngineTelemetry

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
PLAN_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
ITERATION_BUCKETS = LATENCY_BUCKETS[1:]  # 1 ms .. 10 s
TARGETS = "targets.json"  # in pearld's state directory


class Metrics:
    """Counters and histograms of what the log records, gauges of the latest view.

    Thread-safe: the Orchestrator's thread calls :meth:`committed`, the HTTP thread collects.
    """

    def __init__(
        self,
        deaths: Callable[[], dict[str, int]] | None = None,
        hosts: Callable[[], dict[str, int]] | None = None,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._deaths = deaths  # hosts declared dead, by reason
        self._hosts = hosts  # what became of them: {"restarts": n, "lost": m}
        # Connections the metrics HTTP server is serving now (set once it runs).
        self.http_connections: Callable[[], int] | None = None
        self._lock = threading.Lock()
        self._view: ClusterView | None = None
        self._event_at: float | None = None  # an elastic event is waiting for its plan
        self._plans: dict[int, tuple[str, Target, float]] = {}  # in flight: cause, target, begun
        self._serving: Target | None = None  # the last committed plan's target
        self._gate: GateResult | None = None
        self._returned_step: int | None = None
        self._activated_step: int | None = None
        r = self.registry
        self.event_to_plan = Histogram(
            "pearl_event_to_plan_seconds",
            "Elastic event received -> the plan answering it logged",
            registry=r,
            buckets=LATENCY_BUCKETS,
        )
        self.plan_seconds = Histogram(
            "pearl_plan_seconds",
            "Plan begin -> commit or abort, by plan kind",
            ["kind"],
            registry=r,
            buckets=PLAN_BUCKETS,
        )
        self.plans = Counter(
            "pearl_plans", "Plans ended, by kind and outcome", ["kind", "outcome"], registry=r
        )
        self.aborts = Counter(
            "pearl_plan_aborts",
            "Plans aborted, by reason (its first words)",
            ["reason"],
            registry=r,
        )
        self.mode_switches = Counter(
            "pearl_mode_switches", "Committed plans that changed the PD mode", registry=r
        )
        self.ratio_changes = Counter(
            "pearl_ratio_changes",
            "Committed plans that changed N_P:N_D in disaggregation",
            registry=r,
        )
        self.gate = Counter(
            "pearl_gate_verdicts", "Borrowing gate (eq. 7) verdicts", ["verdict"], registry=r
        )
        self.borrow_return = Histogram(
            "pearl_borrow_return_seconds",
            "Training Begin -> training may proceed (borrowed GPUs back)",
            registry=r,
            buckets=LATENCY_BUCKETS,
        )
        self.borrow_activation = Histogram(
            "pearl_borrow_activation_seconds",
            "Borrow plan begun -> lent workers serving (lend + activate)",
            registry=r,
            buckets=LATENCY_BUCKETS,
        )
        self.records = Counter("pearl_log_records", "Records appended to the event log", registry=r)
        self.log_append = Histogram(
            "pearl_log_append_seconds",
            "The Orchestrator's durable append of one change's records (write + sync)",
            registry=r,
            buckets=LATENCY_BUCKETS,
        )
        self.log_sync = Histogram(
            "pearl_log_fsync_seconds",
            "One data sync of the event log (fdatasync; a group commit covers several appends)",
            registry=r,
            buckets=LATENCY_BUCKETS,
        )
        self.api_requests = Counter(
            "pearl_api_requests",
            "Messages pearld's API answered, by kind and outcome (ok, or the error reply's code; "
            f"kind {MALFORMED!r}: the message did not decode)",
            ["command", "outcome"],
            registry=r,
        )
        self.api_seconds = Histogram(
            "pearl_api_request_seconds",
            "Message received -> answered by pearld's API, by kind",
            ["command"],
            registry=r,
            buckets=LATENCY_BUCKETS,
        )
        r.register(_ViewCollector(self))

    # -- fed by the Orchestrator ----------------------------------------------------------------

    def committed(
        self,
        records: Sequence[ev.Record],
        view: ClusterView,
        received: float | None = None,
        append_s: float | None = None,
    ) -> None:
        """Records were appended (in ``append_s`` seconds, durable) and ``view`` is the state
        after them. ``received``: when the message that caused them arrived (None: a tick or
        recovery)."""
        now = time.monotonic()
        if append_s is not None:
            self.log_append.observe(append_s)
        with self._lock:
            self._view = view
            self.records.inc(len(records))
            for rec in records:
                self._record(rec, now, received)
            self._observe_view(view)

    def log_synced(self, seconds: float) -> None:
        """The event log synced its data (``FileLog.on_sync``, on the flushing thread)."""
        self.log_sync.observe(seconds)

    def api_request(self, command: str, outcome: str, seconds: float) -> None:
        """pearld's API answered a message (the rpc Server's observer, on its thread)."""
        self.api_requests.labels(command, outcome).inc()
        self.api_seconds.labels(command).observe(seconds)

    def _record(self, rec: ev.Record, now: float, received: float | None) -> None:
        if isinstance(rec, ev.ElasticEvent) and self._event_at is None:
            self._event_at = received if received is not None else now
        elif isinstance(rec, ev.PlanBegin):
            if self._event_at is not None:
                self.event_to_plan.observe(max(0.0, now - self._event_at))
                self._event_at = None
            self._plans[rec.plan] = (rec.cause, rec.target, now)
        elif isinstance(rec, ev.PlanCommit | ev.PlanAbort):
            cause, target, begun = self._plans.pop(rec.plan, ("unknown", None, now))
            self.plan_seconds.labels(cause).observe(max(0.0, now - begun))
            if isinstance(rec, ev.PlanAbort):
                self.plans.labels(cause, "aborted").inc()
                self.aborts.labels(_reason(rec.reason)).inc()
                return
            self.plans.labels(cause, "committed").inc()
            before, self._serving = self._serving, target
            if before is None or target is None or not target.N:
                return
            if before.mode is not target.mode:
                self.mode_switches.inc()
            elif target.mode is Mode.DISAGGREGATED and before.N_P != target.N_P:
                self.ratio_changes.inc()

    def _observe_view(self, view: ClusterView) -> None:
        if view.gate is not None and view.gate != self._gate:
            self.gate.labels(view.gate.verdict).inc()
        self._gate = view.gate
        c = view.cycle
        if c is None:
            return
        activation = c.activation_s
        if activation is not None and c.step != self._activated_step:
            self._activated_step = c.step
            self.borrow_activation.observe(max(0.0, activation))
        if c.returned is None or c.closed is None or c.step == self._returned_step:
            return
        self._returned_step = c.step
        self.borrow_return.observe(max(0.0, c.returned - c.closed))

    # -- read at scrape time ------------------------------------------------------------------

    def snapshot(self) -> ClusterView | None:
        with self._lock:
            return self._view

    def deaths(self) -> dict[str, int]:
        return self._deaths() if self._deaths is not None else {}

    def host_outcomes(self) -> dict[str, int]:
        return self._hosts() if self._hosts is not None else {}

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def _reason(reason: str) -> str:
    """An abort reason's first words (a bounded label set): 'training-begin', 'worker 3 failed'
    -> 'worker'."""
    word = reason.split(":", 1)[0].split(" ", 1)[0]
    return word[:40] or "unknown"


class _ViewCollector:
    """Gauges of the latest view, built at scrape time."""

    def __init__(self, metrics: Metrics) -> None:
        self.m = metrics

    def describe(self) -> Iterable[Metric]:
        return []  # built from the view at collect time; nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        view = self.m.snapshot()
        measured = view.measured_makespan_s if view is not None else None
        workers = GaugeMetricFamily(
            "pearl_workers",
            "Workers in the table, by role and activity",
            labels=["role", "activity"],
        )
        counts = {(r, a): 0 for r in Role for a in Activity}
        if view is not None:
            for w in view.table.workers:
                counts[w.role, w.activity] += 1
        for (role, act), n in counts.items():
            workers.add_metric([role.value, act.value], n)
        yield workers
        seq = view.seq if view is not None else None
        yield _gauge("pearl_log_seq", "Sequence number of the last logged record", seq)
        served = self.m.http_connections
        yield _gauge(
            "pearl_metrics_connections",
            "Connections the metrics endpoint serves now, each on a thread (this scrape's "
            "included; at most the cap)",
            served() if served is not None else None,
        )
        deaths = GaugeMetricFamily(
            "pearl_worker_deaths",
            "Worker hosts declared dead since pearld started, by reason ('silent but busy': "
            "silences found to be compute, spared)",
            labels=["reason"],
        )
        for reason, n in sorted(self.m.deaths().items()):
            deaths.add_metric([reason], n)
        yield deaths
        outcomes = self.m.host_outcomes()
        for key, name, doc in (
            ("restarts", "pearl_worker_restarts", "Dead worker hosts relaunched"),
            ("lost", "pearl_workers_lost", "Worker hosts given up after their restart budget"),
        ):
            family = CounterMetricFamily(name, doc)
            family.add_metric([], outcomes.get(key, 0))
            yield family
        yield _gauge(
            "pearl_measured_makespan_seconds",
            "Measured makespan of the last rollout batch",
            measured,
        )
        if view is None:
            return
        t = view.table
        serving = view.serving
        yield _gauge("pearl_prefill_workers", "N_P: routable prefill workers", serving.N_P)
        yield _gauge("pearl_decode_workers", "N_D: routable decode workers", serving.N_D)
        yield _gauge("pearl_colocated_workers", "N_C: routable colocated workers", serving.N_C)
        mode = InfoMetricFamily("pearl_mode", "PD mode of the routable workers")
        mode.add_metric([], {"mode": serving.mode.value})
        yield mode
        gpus = GaugeMetricFamily("pearl_gpus", "GPUs by pool", labels=["pool"])
        for pool, ids in (
            ("training", t.training_gpus),
            ("reserved", t.reserved_gpus),
            ("preemptible", t.preemptible_gpus),
            ("present", t.present_gpus),
            ("reclaiming", t.reclaiming_gpus),
            ("quarantined", view.quarantined_gpus),
        ):
            gpus.add_metric([pool], len(ids))
        yield gpus
        phase = InfoMetricFamily("pearl_training", "Training phase")
        phase.add_metric([], {"phase": t.phase.value})
        yield phase
        yield _gauge("pearl_training_step", "Last training step begun", t.training_step)
        yield _gauge("pearl_weights_version", "Newest published weights version", t.weights_version)
        yield _gauge("pearl_plan_in_flight", "1 while a plan is in flight", int(t.plan is not None))
        yield _gauge(
            "pearl_controller_recoveries",
            "Controller invariant violations recovered from the log in place",
            view.controller_recoveries,
        )
        d = view.decision
        yield _gauge(
            "pearl_predicted_makespan_seconds",
            "Predicted makespan of the chosen configuration (eq. 1-3)",
            d.predicted_makespan_s if d is not None else None,
        )
        p = view.profile
        n = serving.N_P + serving.N_D + serving.N_C
        yield _gauge(
            "pearl_predicted_colocated_makespan_seconds",
            "Predicted makespan of colocation on the routable workers (eq. 1)",
            float(T_coloc(p, n)) if p is not None and n else None,
        )
        if d is not None and d.predicted_makespan_s is not None and measured:
            yield _gauge(
                "pearl_makespan_prediction_ratio",
                "Predicted / measured makespan of the last batch",
                d.predicted_makespan_s / measured,
            )
        if p is not None:
            prof = GaugeMetricFamily(
                "pearl_profile", "Fitted workload profile (seconds, tokens)", labels=["param"]
            )
            for name in ("A", "b", "t_prefill", "theta", "T_toggle", "T_window", "S", "r", "kappa"):
                prof.add_metric([name], float(getattr(p, name)))
            prof.add_metric(["delta_L"], float(p.delta_L))
            yield prof


def _gauge(name: str, doc: str, value: float | int | None) -> GaugeMetricFamily:
    g = GaugeMetricFamily(name, doc)
    if value is not None:
        g.add_metric([], float(value))
    return g


class HostMetrics:
    """One worker host's engine, as the host's ``GET /metrics`` shows it.

    The WorkerActor calls :meth:`observe` with the telemetry it sends the tracker (before sending
    it), :meth:`watch` with its engine whenever the engine comes up, switches role or goes (live
    gauges are read from it at scrape time: requests in flight, KV use), and :meth:`set_role`.
    Thread-safe: the actor's thread feeds it, the HTTP thread collects.

    The counters and the histogram are this process's totals, continuous across role switches:
    every series is labelled with the role at scrape time, so a switch ends the series of the old
    role and starts one of the new role at the same total (``rate()`` per series, summed by
    ``worker``, sees no jump). Before its engine is up a host's role is ``none``.
    """

    def __init__(self, worker: int, incarnation: int, engine: str) -> None:
        self.worker, self.incarnation, self.engine = str(worker), str(incarnation), engine
        self._lock = threading.Lock()
        self._role = "none"
        self._engine: Engine | None = (
            None  # read at scrape time: in_flight(), kv_usage() if it has one
        )
        self._decode = self._prefill = self._iterations = 0
        self._buckets = [0] * (len(ITERATION_BUCKETS) + 1)  # per bucket; the last is +Inf
        self._seconds = 0.0
        self._kv_bytes = {"send": 0, "recv": 0}
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def set_role(self, role: str) -> None:
        with self._lock:
            self._role = role

    def watch(self, engine: Engine | None) -> None:
        """The engine whose live gauges a scrape reads (None: no engine), in its role."""
        with self._lock:
            self._engine = engine
        if engine is not None:
            self.set_role(engine.role.value)

    def observe(self, t: EngineTelemetry) -> None:
        with self._lock:
            for it in t.iterations:
                self._decode += it.decode_batch
                self._prefill += it.prefill_tokens
                self._iterations += 1
                self._buckets[bisect.bisect_left(ITERATION_BUCKETS, it.duration_s)] += 1
                self._seconds += it.duration_s
            for x in t.transfers:
                self._kv_bytes[x.direction] = self._kv_bytes.get(x.direction, 0) + x.bytes

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def describe(self) -> Iterable[Metric]:
        return []  # built at collect time; nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            role, engine = self._role, self._engine
            decode, prefill, iterations = self._decode, self._prefill, self._iterations
            buckets, seconds, kv_bytes = list(self._buckets), self._seconds, dict(self._kv_bytes)
        labels, ids = ["worker", "role"], [self.worker, role]
        info = GaugeMetricFamily(
            "pearl_worker_info",
            "This worker host: its incarnation and engine kind (always 1)",
            labels=[*labels, "incarnation", "engine"],
        )
        info.add_metric([*ids, self.incarnation, self.engine], 1)
        yield info
        in_flight = GaugeMetricFamily(
            "pearl_worker_requests_in_flight", "Requests queued or running", labels=labels
        )
        in_flight.add_metric(ids, len(engine.in_flight()) if engine is not None else 0)
        yield in_flight
        kv = GaugeMetricFamily(
            "pearl_worker_kv_used_ratio",
            "Share of the KV pool held by running requests (resident prefixes count as free)",
            labels=labels,
        )
        ratio = kv_used_ratio(engine)
        if ratio is not None:
            kv.add_metric(ids, ratio)
        yield kv
        for name, doc, total in (
            ("decode_tokens", "Tokens decoded (sum of decode batches)", decode),
            ("prefill_tokens", "Prompt tokens prefilled", prefill),
            ("iterations", "Scheduler iterations", iterations),
        ):
            c = CounterMetricFamily(f"pearl_worker_{name}", doc, labels=labels)
            c.add_metric(ids, total)
            yield c
        h = HistogramMetricFamily(
            "pearl_worker_iteration_seconds", "Duration of one scheduler iteration", labels=labels
        )
        bounds = [*(str(float(b)) for b in ITERATION_BUCKETS), "+Inf"]
        h.add_metric(ids, list(zip(bounds, itertools.accumulate(buckets), strict=True)), seconds)
        yield h
        xfer = CounterMetricFamily(
            "pearl_worker_kv_transfer_bytes",
            "KV cache bytes moved between prefill and decode workers, by direction",
            labels=[*labels, "direction"],
        )
        for direction, n in sorted(kv_bytes.items()):
            xfer.add_metric([*ids, direction], n)
        yield xfer


def kv_used_ratio(engine: object) -> float | None:
    """Pages held by running requests / pages of the KV pool (0-1), for an engine with
    ``kv_usage()``; None without an engine, a pool or that method."""
    usage = getattr(engine, "kv_usage", None)
    if usage is None:
        return None
    u = usage()
    if not u.get("pages"):
        return None
    return float(u["pages"] - u["free"] - u.get("cached", 0)) / u["pages"]


def render_targets(pearld: str, workers: Mapping[int, tuple[str, str]]) -> list[dict[str, Any]]:
    """Prometheus ``file_sd_configs`` entries: pearld at ``pearld`` and each worker host
    (``{worker: (address, role)}``)."""
    out: list[dict[str, Any]] = [{"targets": [_scrapable(pearld)], "labels": {"job": "pearld"}}]
    for worker, (address, role) in sorted(workers.items()):
        labels = {"job": "pearl-worker", "worker": str(worker), "role": role}
        out.append({"targets": [_scrapable(address)], "labels": labels})
    return out


def write_targets(path: Path, pearld: str, workers: Mapping[int, tuple[str, str]]) -> bool:
    """Write :func:`render_targets` to ``path`` atomically (a temporary file, then
    ``os.replace``: Prometheus never reads half a file); False, leaving the file untouched, when it
    already says that."""
    body = (json.dumps(render_targets(pearld, workers), indent=2) + "\n").encode()
    try:
        if path.read_bytes() == body:
            return False
    except FileNotFoundError:
        pass
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(body)
    os.replace(tmp, path)
    return True


def _scrapable(address: str) -> str:
    """A wildcard listener is scraped on loopback (the worker hosts' own address)."""
    host, _, port = address.rpartition(":")
    loopback = {"0.0.0.0": "127.0.0.1", "[::]": "[::1]"}.get(host)
    return f"{loopback}:{port}" if loopback else address


__all__ = [
    "TARGETS",
    "HostMetrics",
    "MAX_CONNECTIONS",
    "READ_TIMEOUT_S",
    "Metrics",
    "MetricsServer",
    "check_exposure",
    "kv_used_ratio",
    "parse_address",
    "render_targets",
    "write_targets",
]
