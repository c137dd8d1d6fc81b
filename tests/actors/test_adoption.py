"""After a pearld restart the RoleSupervisor adopts running worker hosts and brings each engine to
the role and activity the table holds: recovery re-sends a plan's started steps before the hosts
have said hello again, so the table can be ahead of an engine (a rebalance logged as done while
the host was unreachable). Found as decode engines serving as prefill after a restart, each KV
transfer waiting out its 30 s timeout."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import actors.supervisor as supervisor
from actors import names
from actors.base import Directory
from actors.messages import RestoreWorker, WorkerHello
from actors.supervisor import Deliver, Liveboard, RoleSupervisor, Spawn
from pearl.core import commands as cmd
from pearl.core.state import Role, Zone
from tests.actors.test_heart import Now, Recorder
from tests.actors.test_supervision import CFG, CountingLauncher
from tests.actors.test_supervisor_targets import rows


class Courier:
    """Stands in for the courier to a host: records what pearld tells it."""

    def __init__(self, name: str, client: Any, on_error: Any) -> None:
        self.name, self.told = name, list[Any]()
        client.close()

    def tell(self, msg: Any) -> None:
        self.told.append(msg)

    def close(self) -> None:
        pass


@pytest.fixture
def adopted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setattr(supervisor, "CourierRef", Courier)
    d, got = Directory(), list[Any]()
    for name in (names.ROUTER, names.ORCHESTRATOR, names.API):
        d.register(Recorder(name, got))
    # The restarted pearld's table: worker 1 was switched to prefill while pearld was down.
    sup = RoleSupervisor(
        directory=d,
        launcher=CountingLauncher(),
        config=CFG,
        endpoint=lambda: "tcp://x",
        state_dir=str(tmp_path),
        boot_id="boot-2",
        board=Liveboard(0.5, clock=Now()),
        initial=rows(w1=Role.PREFILL, w2=Role.DECODE),
    )  # type: ignore[arg-type]
    yield sup, got
    sup.on_stop()


def hello(wid: int, role: Role) -> WorkerHello:
    return WorkerHello(
        worker=wid,
        incarnation=1,
        pid=500 + wid,
        address="tcp://127.0.0.1:1",
        engine_ready=True,
        role=role,
    )


def test_an_adopted_engine_is_brought_to_the_tables_role(adopted: Any) -> None:
    sup, got = adopted
    sup.hello(hello(1, Role.DECODE))  # its engine still decodes
    (told,) = sup.hosts[1].ref.told
    assert isinstance(told, RestoreWorker)
    assert (told.worker, told.incarnation, told.role, told.active) == (1, 1, Role.PREFILL, True)
    # Routable only once restored: the host itself reports WorkerUp after the switch.
    assert not any(isinstance(m, cmd.WorkerUp) for m in got)


def test_an_adopted_engine_in_the_right_role_is_restored_in_place(adopted: Any) -> None:
    sup, _ = adopted
    sup.hello(hello(2, Role.DECODE))
    (told,) = sup.hosts[2].ref.told
    assert isinstance(told, RestoreWorker) and told.role is Role.DECODE


def test_a_step_for_a_host_still_starting_is_given_after_its_start(adopted: Any) -> None:
    """A joiner in the background may be re-roled before its host says hello (a mode switch
    right after an expansion): the switch waits in line behind the start instead of failing,
    and the host comes up in the role the table gives it."""
    sup, got = adopted
    start = cmd.StartWorker(
        worker=3,
        incarnation=1,
        gpus=(3,),
        role=Role.DECODE,
        zone=Zone.DEDICATED,
        weights_version=0,
        plan=5,
        step=0,
        background=True,
    )
    sup.state_changed(rows(w1=Role.PREFILL, w2=Role.DECODE, w3=Role.DECODE))
    sup.spawn(Spawn(start))
    switch = cmd.SetRole(worker=3, role=Role.COLOCATED, plan=6, step=0)
    sup.deliver(Deliver(switch))
    assert not any(isinstance(m, cmd.StepResult) for m in got)
    sup.hello(
        WorkerHello(worker=3, incarnation=1, pid=sup.hosts[3].handle, address="tcp://127.0.0.1:1")
    )  # the launched one
    assert sup.hosts[3].ref.told == [start, switch]


def test_a_step_for_a_host_nobody_started_fails_at_once(adopted: Any) -> None:
    sup, got = adopted
    sup.deliver(
        Deliver(cmd.SetRole(worker=1, role=Role.DECODE, plan=6, step=0))
    )  # after a restart, before its hello
    (result,) = [m for m in got if isinstance(m, cmd.StepResult)]
    assert (result.plan, result.step, result.ok) == (6, 0, False)


def test_a_second_host_of_one_incarnation_is_stopped_before_it_serves(adopted: Any) -> None:
    """A host of an earlier pearld that comes back after ``reconcile_grace_s``, when its worker
    was relaunched as the same incarnation: two processes would serve one worker on one set of
    GPUs. The host pearld holds stays; the late one is told it is unknown and killed."""
    sup, _ = adopted
    launcher = sup.launcher
    sup.awaited = {1}
    sup.booted -= 60.0  # past the grace: worker 1 never came back, so it is relaunched
    sup.supervise(supervisor.Supervise())
    h = sup.hosts[1]
    while h.restart_at is not None:  # its back-off
        h.restart_at = 0.0
        sup.supervise(supervisor.Supervise())
    relaunched = h.handle
    assert relaunched and [s.worker for s in launcher.launched] == [1]
    late = WorkerHello(
        worker=1,
        incarnation=1,
        pid=999,
        address="tcp://127.0.0.1:1",
        engine_ready=True,
        role=Role.DECODE,
    )
    assert not sup.hello(late).known
    assert launcher.killed == [999] and sup.hosts[1].handle == relaunched
    ours = WorkerHello(
        worker=1,
        incarnation=1,
        pid=relaunched,
        address="tcp://127.0.0.1:1",
        engine_ready=True,
        role=Role.DECODE,
    )
    assert sup.hello(ours).known and sup.hosts[1].ref is not None
    # Its own hello again (a lost reply) is the same process: still welcome.
    assert sup.hello(ours).known and launcher.killed == [999]


def test_a_restarted_host_with_steps_waiting_is_restored_first(adopted: Any) -> None:
    """A host that died is out of routing (``failed``) until its WorkerUp, which only a restore
    or a background start sends. A step delivered while its relaunch started (an activation at
    a borrow) used to take the restore's place: the worker stayed failed for good."""
    sup, _ = adopted
    sup.hello(hello(1, Role.PREFILL))
    h = sup.hosts[1]
    sup.launcher.killed.append(h.handle)  # the process exits
    sup.supervise(supervisor.Supervise())
    while h.restart_at is not None:  # its back-off
        h.restart_at = 0.0
        sup.supervise(supervisor.Supervise())
    activate = cmd.ActivateWorker(worker=1, role=Role.PREFILL, weights_version=0, plan=9, step=0)
    sup.deliver(Deliver(activate))
    sup.hello(WorkerHello(worker=1, incarnation=1, pid=h.handle, address="tcp://127.0.0.1:1"))
    restore, then = sup.hosts[1].ref.told
    assert isinstance(restore, RestoreWorker) and restore.role is Role.PREFILL
    assert then == activate
