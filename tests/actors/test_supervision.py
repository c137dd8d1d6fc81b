"""The RoleSupervisor's restart budget and the launcher's failures: a crashed host is restarted
on its GPUs with a doubling back-off, one that keeps crashing (or cannot be launched at all) is
reported lost, and the controller then quarantines its GPUs."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from actors import names
from actors.base import Directory, PearlActor, start
from actors.launcher import LaunchError, LocalProcessLauncher, WorkerSpec
from actors.messages import StateChanged, Supervise
from actors.supervisor import Host, Liveboard, RoleSupervisor, Spawn
from pearl.config import load
from pearl.core import commands as cmd
from pearl.core.state import Activity, Role, Worker, Zone
from pearl.core.view import ClusterView, TableSnapshot
from tests.actors.test_heart import DummyRef, FakeLauncher, Now, Recorder

CFG = load(
    None, ["daemon.heartbeat_s=0.5", "daemon.restart_budget=2", "daemon.restart_backoff_s=1.0"]
)


class CountingLauncher(FakeLauncher):
    def __init__(self, fail: bool = False) -> None:
        super().__init__()
        self.launched: list[Any] = []
        self.fail = fail
        self.next_pid = 500

    def launch(self, spec: Any) -> int:
        if self.fail:
            raise LaunchError(f"worker host {spec.worker} could not be started: no such file")
        self.launched.append(spec)
        self.next_pid += 1
        return self.next_pid


def supervisor(
    launcher: FakeLauncher, clock: list[float], monkeypatch: pytest.MonkeyPatch
) -> tuple[RoleSupervisor, list[Any]]:
    monkeypatch.setattr("actors.supervisor.time.monotonic", lambda: clock[0])
    d = Directory()
    got: list[Any] = []
    for name in (names.ROUTER, names.ORCHESTRATOR):
        d.register(Recorder(name, got))
    board = Liveboard(0.5, clock=Now())
    sup = RoleSupervisor(
        directory=d,
        launcher=launcher,
        config=CFG,
        endpoint=lambda: "tcp://x",
        state_dir="",
        boot_id="boot",
        board=board,
    )  # type: ignore[arg-type]
    return sup, got


def test_a_crashed_host_is_restarted_with_back_off_until_its_budget_is_spent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    launcher, clock = CountingLauncher(), [1000.0]
    sup, got = supervisor(launcher, clock, monkeypatch)
    sup.hosts[3] = Host(3, 12, (6, 7), handle=101, ref=DummyRef())  # type: ignore[arg-type]
    delays = []
    for _ in range(CFG.daemon.restart_budget):
        launcher.killed.append(sup.hosts[3].handle)  # the process exits
        sup.supervise(Supervise())
        assert sup.hosts[3].restart_at is not None, "a crash within budget is restarted"
        delays.append(sup.hosts[3].restart_at - clock[0])
        n = len(launcher.launched)
        clock[0] += delays[-1] - 0.01
        sup.supervise(Supervise())
        assert len(launcher.launched) == n, "not before its back-off"
        clock[0] += 0.02
        sup.supervise(Supervise())
        assert len(launcher.launched) == n + 1
        assert launcher.launched[-1].gpus == (6, 7) and launcher.launched[-1].incarnation == 12
    assert delays == [1.0, 2.0]  # doubling
    downs = [m for m in got if isinstance(m, cmd.WorkerDown)]
    assert len(downs) == 2 and not any(isinstance(m, cmd.WorkerLost) for m in got)
    launcher.killed.append(sup.hosts[3].handle)  # one crash more than the budget
    sup.supervise(Supervise())
    lost = [m for m in got if isinstance(m, cmd.WorkerLost)]
    assert lost == [cmd.WorkerLost(worker=3, reason="exited; gave up after 2 restarts")]
    assert 3 not in sup.hosts
    assert sup.board.outcomes() == {"restarts": 2, "lost": 1}  # what pearld's metrics show
    assert sup.board.report()["exited"] == 3


def test_a_host_that_cannot_be_launched_is_retried_then_lost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    launcher, clock = CountingLauncher(fail=True), [1000.0]
    sup, got = supervisor(launcher, clock, monkeypatch)
    sup.spawn(
        Spawn(
            cmd.StartWorker(
                worker=3,
                incarnation=12,
                gpus=(6, 7),
                role=Role.COLOCATED,
                zone=Zone.DEDICATED,
                weights_version=0,
                plan=1,
                step=0,
            )
        )
    )
    for _ in range(10):  # past every back-off
        clock[0] += 10.0
        sup.supervise(Supervise())
    assert sum(isinstance(m, cmd.WorkerDown) for m in got) == 1 + CFG.daemon.restart_budget
    lost = [m for m in got if isinstance(m, cmd.WorkerLost)]
    assert lost == [
        cmd.WorkerLost(worker=3, reason="could not be launched; gave up after 2 restarts")
    ]
    assert sup.board.report()["could not be launched"] == 3


class SayingLauncher(CountingLauncher):
    """Its hosts log why they could not start their engine."""

    def last_error(self, worker: int, incarnation: int) -> str:
        return f"worker/{worker} could not start: unknown model preset 'nonexistent'"


def test_a_host_that_cannot_start_says_why_in_status_and_log_and_is_retried_with_back_off(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 41: the reason was only in workers/*.log, and the worker stayed transitioning."""
    launcher, clock = SayingLauncher(), [1000.0]
    sup, got = supervisor(launcher, clock, monkeypatch)
    api: list[Any] = []
    sup.directory.register(Recorder(names.API, api))  # type: ignore[arg-type]
    sup.hosts[3] = Host(3, 12, (6, 7), handle=101, ref=DummyRef())  # type: ignore[arg-type]
    why = "exited (worker/3 could not start: unknown model preset 'nonexistent')"
    with caplog.at_level(logging.WARNING, "actors.supervisor"):
        for k in range(CFG.daemon.restart_budget + 1):
            launcher.killed.append(sup.hosts[3].handle)
            sup.supervise(Supervise())
            if k < CFG.daemon.restart_budget:
                wait = 2.0**k
                assert sup.board.faults() == {3: f"{why}; restart {k + 1} of 2 in {wait:g} s"}
                clock[0] += wait
                sup.supervise(Supervise())  # relaunched after its back-off
    assert [m.reason for m in got if isinstance(m, cmd.WorkerDown)] == [why] * 3
    assert sup.board.faults() == {3: f"{why}; gave up after 2 restarts"}
    assert why in caplog.text and api  # the log says why; the status is rendered again
    # It serves again (a later incarnation on these GPUs): the fault is over.
    row = Worker(
        id=3,
        gpus=(6, 7),
        role=Role.COLOCATED,
        activity=Activity.ACTIVE,
        zone=Zone.DEDICATED,
        incarnation=13,
    )
    sup.state_changed(StateChanged(view=ClusterView(table=TableSnapshot(seq=9, workers=(row,)))))
    assert sup.board.faults() == {}


def test_a_hosts_last_error_is_the_one_since_its_last_launch(tmp_path: Path) -> None:
    from actors.launcher import last_error

    log = tmp_path / "worker-1-2.log"
    log.write_text(
        "python -m actors.worker_host --worker 1\n"
        "2026-12-05 22:12:30,464 worker-1 ERROR worker/1 could not start: no preset 'x'\n"
        "python -m actors.worker_host --worker 1\n"
        "2026-12-05 22:12:31,001 worker-1 INFO serving\n"
    )
    assert last_error(log) == ""  # the error was the previous launch's
    with log.open("a") as f:
        f.write("2026-12-05 22:12:32,155 worker-1 ERROR worker/1 could not be restored: boom\n")
        f.write("2026-12-05 22:12:32,156 worker-1 INFO bye\n")
    assert last_error(log) == "worker/1 could not be restored: boom"
    with log.open("a") as f:
        f.write("python -m actors.worker_host --worker 1\nTraceback (most recent call last):\n")
        f.write("  File \"x.py\", line 1\nModuleNotFoundError: No module named 'torch'\n")
    assert last_error(log) == "ModuleNotFoundError: No module named 'torch'"
    assert last_error(tmp_path / "missing.log") == ""


def test_the_local_launcher_says_which_host_could_not_start(tmp_path: Path) -> None:
    blocker = tmp_path / "logs"
    blocker.write_text("a file where the log directory should be")
    spec = WorkerSpec(
        worker=3,
        incarnation=12,
        gpus=(6, 7),
        endpoint="tcp://127.0.0.1:1",
        engine=CFG.engine,
        model=CFG.model.name,
        gpu=CFG.cluster.gpu,
        tp=CFG.cluster.tp,
        heartbeat_s=0.5,
        orphan_s=5.0,
        state_dir=str(tmp_path),
    )
    launcher = LocalProcessLauncher(blocker)
    with pytest.raises(LaunchError, match="worker host 3 .incarnation 12. could not be started"):
        launcher.launch(spec)
    assert launcher.subprocesses() == {} and launcher.launched() == []
    with pytest.raises(LaunchError):
        launcher.launch(replace(spec, worker=4))


def test_a_tell_to_a_stopped_actor_is_dropped_quietly_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """pearld stops the orchestrator first at shutdown; a late report to it is dropped by design,
    not a warning (``make demo`` printed one). Any other failure still warns."""

    class Quiet(PearlActor):
        name = "quiet"

    d = Directory()
    ref = start(d, Quiet)
    assert d.tell("quiet", "hello") is True
    ref.ref.stop()
    caplog.clear()  # (the live actor logged that it does not handle a str)
    with caplog.at_level(logging.DEBUG, logger="actors.base"):
        assert d.tell("quiet", "hello") is False
    assert [r.levelno for r in caplog.records if "dropped" in r.message] == [logging.DEBUG]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert d.tell("missing", "hello") is False
