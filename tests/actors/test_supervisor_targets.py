"""The RoleSupervisor keeps targets.json when pearld serves metrics: pearld at once, a host once
it says hello with a metrics address (labelled with its role in the table), rewritten when a role
changes, a host crashes or a plan removes it, untouched when nothing changed; the API hears when
hosts come and go. Hosts are launched with --metrics only when pearld serves metrics."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from actors import names
from actors.base import Directory
from actors.messages import Supervise, WorkerHello
from actors.supervisor import HOST_METRICS, Host, HostsChanged, Liveboard, RoleSupervisor
from pearl.core.state import Activity, Role, Worker, Zone
from tests.actors.test_heart import Now, Recorder
from tests.actors.test_supervision import CFG, CountingLauncher

PEARLD = {"targets": ["127.0.0.1:9440"], "labels": {"job": "pearld"}}


def rows(**roles: Role) -> Any:
    """A StateChanged whose table has rollout workers ``w1=Role.DECODE, ...`` (incarnation 1)."""
    workers = tuple(
        Worker(
            id=int(w[1:]),
            gpus=(int(w[1:]),),
            role=role,
            activity=Activity.ACTIVE,
            zone=Zone.DEDICATED,
            incarnation=1,
        )
        for w, role in roles.items()
    )
    return SimpleNamespace(view=SimpleNamespace(rollout=workers, weights_version=0))


def worker(wid: int, role: str, port: int) -> dict[str, Any]:
    labels = {"job": "pearl-worker", "worker": str(wid), "role": role}
    return {"targets": [f"127.0.0.1:{port}"], "labels": labels}


def hello(wid: int, pid: int, metrics: str) -> WorkerHello:
    return WorkerHello(
        worker=wid,
        incarnation=1,
        pid=pid,
        address="tcp://127.0.0.1:1",
        engine_ready=True,
        metrics_address=metrics,
    )


Made = tuple[RoleSupervisor, CountingLauncher, list[Any], Path]


@pytest.fixture
def made(tmp_path: Path) -> Iterator[Any]:
    sups: list[RoleSupervisor] = []

    def make(metrics: str) -> Made:
        d, got = Directory(), list[Any]()
        for name in (names.ROUTER, names.ORCHESTRATOR, names.API):
            d.register(Recorder(name, got))
        launcher = CountingLauncher()
        sup = RoleSupervisor(
            directory=d,
            launcher=launcher,
            config=CFG,
            endpoint=lambda: "tcp://x",
            state_dir=str(tmp_path),
            boot_id="boot",
            board=Liveboard(0.5, clock=Now()),
            initial=rows(w1=Role.DECODE, w2=Role.PREFILL),
            metrics=metrics,
        )  # type: ignore[arg-type]
        sups.append(sup)
        return sup, launcher, got, tmp_path / "targets.json"

    yield make
    for sup in sups:
        sup.on_stop()  # closes the couriers


def test_targets_follow_hellos_roles_crashes_and_removals(made: Any) -> None:
    sup, launcher, got, path = made("127.0.0.1:9440")

    def targets() -> Any:
        return json.loads(path.read_text())

    def told() -> int:
        return sum(isinstance(m, HostsChanged) for m in got)

    assert targets() == [PEARLD]  # at once, before any host
    got.clear()
    sup._launch(Host(1, 1, (1,)))
    assert launcher.launched[-1].metrics == HOST_METRICS == "127.0.0.1:0"

    sup.hello(hello(1, 501, "127.0.0.1:41001"))
    assert targets() == [PEARLD, worker(1, "decode", 41001)]
    assert told() == 1
    assert sup.board.metrics() == {1: "127.0.0.1:41001"}

    stamp = path.stat().st_ino, path.stat().st_mtime_ns
    sup.hello(hello(2, 502, ""))  # an older host, serving no metrics: not a target
    sup.state_changed(rows(w1=Role.DECODE, w2=Role.PREFILL))  # nothing changed
    assert (path.stat().st_ino, path.stat().st_mtime_ns) == stamp and told() == 1

    sup.state_changed(rows(w1=Role.PREFILL, w2=Role.PREFILL))  # a role switch
    assert targets() == [PEARLD, worker(1, "prefill", 41001)]
    assert told() == 1  # the same hosts: status --json is unchanged

    launcher.killed.append(sup.hosts[1].handle)  # the host exits
    sup.supervise(Supervise())
    # told twice: its host went, and status shows why (worker_faults)
    assert targets() == [PEARLD] and told() == 3 and 1 in sup.board.faults()
    sup.hello(hello(1, 503, "127.0.0.1:41003"))  # its restart says hello
    assert targets() == [PEARLD, worker(1, "prefill", 41003)] and told() == 4

    sup.state_changed(rows(w2=Role.PREFILL))  # a plan removed worker 1
    assert targets() == [PEARLD] and told() == 5
    assert 503 in launcher.killed


def test_without_metrics_no_host_serves_and_no_targets_are_kept(made: Any) -> None:
    sup, launcher, got, path = made("")
    sup._launch(Host(1, 1, (1,)))
    assert launcher.launched[-1].metrics == ""
    sup.hello(hello(1, 501, ""))
    sup.state_changed(rows(w1=Role.PREFILL))
    assert not path.exists() and not any(isinstance(m, HostsChanged) for m in got)
    assert sup.board.metrics() == {}
