"""A real Prometheus against a real pearld: it finds pearld and the worker hosts through the
targets.json pearld writes (file SD), reports every target up, and a query on ``pearl_workers``
returns the table's worker count; ``promtool check metrics`` accepts both expositions.

Prometheus is not a Python package: these run where the OS provides it (``.ci/run`` installs it
from the OS packages when it can: ``apt-get install prometheus``) and are skipped, saying so,
where it does not. The exposition parser tests (tests/test_metrics.py, tests/test_deploy.py) run
everywhere."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.daemon.conftest import Pearld, wait_until
from tests.daemon.test_worker_metrics import listed
from tests.ports import free_base

pytestmark = pytest.mark.slow

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
needs_prometheus = pytest.mark.skipif(
    PROMETHEUS is None, reason="no prometheus binary (apt-get install prometheus)"
)
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="no promtool binary (apt-get install prometheus)"
)


def api(base: str, path: str, **query: str) -> Any:
    url = f"{base}{path}?{urllib.parse.urlencode(query)}" if query else f"{base}{path}"
    with urllib.request.urlopen(url, timeout=5) as r:
        body = json.loads(r.read())
    assert body["status"] == "success", body
    return body["data"]


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Any]:
    """Start Prometheus on a config whose file SD reads ``targets``; stopped by pid."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(targets: Path) -> str:
        port = free_base(1)
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            "scrape_configs:\n  - job_name: pearl\n    honor_labels: true\n"
            "    file_sd_configs:\n      - refresh_interval: 1s\n"
            f"        files: [{json.dumps(str(targets))}]\n"
        )
        assert PROMETHEUS is not None
        log = (tmp_path / "prometheus.log").open("wb")
        procs.append(
            subprocess.Popen(
                [
                    PROMETHEUS,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
        base = f"http://127.0.0.1:{port}"

        def ready() -> bool:
            try:
                with urllib.request.urlopen(f"{base}/-/ready", timeout=2) as r:
                    return r.status == 200
            except OSError:
                return False

        wait_until(ready, 30, "prometheus to be ready", every=0.2)
        return base

    yield start
    for p in procs:
        if p.poll() is None:
            os.kill(p.pid, signal.SIGTERM)
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(p.pid, signal.SIGKILL)
                p.wait(5)


@needs_prometheus
def test_prometheus_scrapes_pearld_and_the_hosts_through_targets_json(
    pearld_factory: Any, prometheus: Any
) -> None:
    d: Pearld = pearld_factory(f"daemon.metrics=127.0.0.1:{free_base(1)}")
    s = wait_until(lambda: listed(d), 30, "targets.json to list every worker host", every=0.2)
    base = prometheus(d.state / "targets.json")
    jobs_wanted = {"pearld": 1, "pearl-worker": len(s["worker_metrics"])}

    def all_up() -> dict[str, int] | None:
        active = api(base, "/api/v1/targets")["activeTargets"]
        up: dict[str, int] = {}
        for t in active:
            if t["health"] == "up":
                up[t["labels"]["job"]] = up.get(t["labels"]["job"], 0) + 1
        return up if up == jobs_wanted else None

    wait_until(all_up, 40, f"prometheus to scrape {jobs_wanted} up", every=0.5)

    def workers() -> float | None:
        result = api(base, "/api/v1/query", query='sum(pearl_workers{job="pearld"})')["result"]
        return float(result[0]["value"][1]) if result else None

    got = wait_until(workers, 20, "a pearl_workers sample", every=0.5)
    assert got == len(d.settled()["workers"])
    info = api(base, "/api/v1/query", query="count(pearl_worker_info)")["result"]
    assert float(info[0]["value"][1]) == len(s["worker_metrics"])


@needs_promtool
def test_promtool_accepts_pearld_and_host_expositions(pearld_factory: Any) -> None:
    port = free_base(1)
    d: Pearld = pearld_factory(f"daemon.metrics=127.0.0.1:{port}")
    s = wait_until(lambda: listed(d), 30, "targets.json to list every worker host", every=0.2)
    host = next(iter(s["worker_metrics"].values()))
    for url in (f"http://127.0.0.1:{port}/metrics", f"http://{host}/metrics"):
        with urllib.request.urlopen(url, timeout=5) as r:
            text = r.read()
        assert PROMTOOL is not None
        out = subprocess.run(
            [PROMTOOL, "check", "metrics"], input=text, capture_output=True, timeout=30
        )
        assert out.returncode == 0, (url, out.stdout.decode(), out.stderr.decode())
