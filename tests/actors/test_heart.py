"""Worker-host liveness: host names, any message counts, the host's heart (hello, beats from its
own thread, hello again after a pearld restart), and a silent host that is computing is busy, not
dead, while a stopped or idle silent one is dead after 3 missed intervals."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from actors import names
from actors.base import Directory
from actors.heart import HostHeart, host_name, host_of
from actors.messages import Supervise, Welcome, WorkerBeat, WorkerHello
from actors.router import WorkerGone
from actors.supervisor import Host, Liveboard, RoleSupervisor
from pearl.config import load
from pearl.core import commands as cmd
from pearl.testing.wait import wait_until
from transports.protocol import Status, StatusRequest
from transports.rpc import Client, Server, dispatch


def test_host_names_say_which_host_and_incarnation() -> None:
    assert host_name(3, 12) == "worker-3.12" and host_name(3, 12, "r") == "worker-3.12-r"
    assert host_of("worker-3.12") == (3, 12) and host_of("worker-3.12-beat") == (3, 12)
    assert host_of("worker-3") is None and host_of("pearl-cli") is None
    assert host_of("worker-3.12-r-x") is None


class Now:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_any_message_from_a_registered_host_is_a_heartbeat() -> None:
    now = Now()
    board = Liveboard(0.5, clock=now)
    board.add(3, 12)
    now.t += 1.0
    board.ear.beat("worker-3.12-r")  # a report, not a beat
    board.ear.beat("worker-3.11-r")  # an earlier incarnation of the slot: not this host
    board.ear.beat("pearl-cli")
    now.t += 1.0
    assert board.dead() == set()
    now.t += 0.6
    assert board.dead() == {3}
    board.ear.behind()  # the API is behind: nobody is judged past that moment
    board.ear.beat("worker-3.12")
    now.t += 10.0
    assert board.dead() == set()
    board.ear.caught_up()
    assert board.dead() == {3}


class FakePearld:
    """Answers hellos and beats like pearld's API; ``boot`` and ``known`` can change."""

    def __init__(self) -> None:
        self.boot, self.known = "boot-1", True
        self.hellos: list[WorkerHello] = []
        self.beats = 0
        self.status = 0
        self.server = Server(
            "tcp://127.0.0.1:*",
            dispatch({WorkerHello: self.hello, WorkerBeat: self.beat, StatusRequest: self.st}),
        )

    def hello(self, env: Any) -> Welcome:
        self.hellos.append(env.msg)
        return Welcome(boot_id=self.boot, known=self.known)

    def beat(self, env: Any) -> Welcome:
        self.beats += 1
        return Welcome(boot_id=self.boot, known=True)

    def st(self, env: Any) -> Status:
        self.status += 1
        return Status()


@pytest.fixture
def pearld() -> Iterator[FakePearld]:
    p = FakePearld()
    yield p
    p.server.close()


def wait_for(cond: Any, timeout: float = 5.0) -> None:
    wait_until(cond, timeout, "the condition", every=0.02)


def test_the_heart_beats_while_the_process_computes_and_says_hello_again(
    pearld: FakePearld,
) -> None:
    ready = threading.Event()
    beats: list[float] = []
    welcomes: list[str] = []  # the host rewrites its pid file on each
    heart = HostHeart(
        pearld.server.address,
        WorkerHello(worker=3, incarnation=12, pid=1, address="tcp://x"),
        interval_s=0.1,
        orphan_s=30.0,
        ready=ready.is_set,
        on_beat=lambda: beats.append(time.monotonic()),
        on_welcome=lambda: welcomes.append(pearld.boot),
    )
    stop = threading.Event()
    why: list[str] = []
    t = threading.Thread(target=lambda: why.append(heart.run(stop)))
    t.start()
    try:
        wait_for(lambda: len(beats) >= 3)
        assert pearld.hellos[0].engine_ready is False
        # Python-level compute on another thread does not stretch the beat interval.
        n0, t0 = len(beats), time.monotonic()
        while time.monotonic() - t0 < 1.0:
            sum(i * i for i in range(10_000))
        assert len(beats) - n0 >= 7
        # pearld restarted: a new boot id means hello again, with the engine's state.
        ready.set()
        pearld.boot = "boot-2"
        wait_for(lambda: len(pearld.hellos) == 2)
        assert pearld.hellos[1].engine_ready is True
        assert welcomes == ["boot-1", "boot-2"]
        n = len(beats)
        wait_for(lambda: len(beats) >= n + 3)
        assert len(pearld.hellos) == 2  # late answers to beats of the old boot change nothing
        # A pearld whose log does not know the host: it exits.
        pearld.known = False
        pearld.boot = "boot-3"
        t.join(5.0)
        assert why == ["unknown"] and welcomes == ["boot-1", "boot-2"]
    finally:
        stop.set()
        t.join(5.0)


# -- busy or dead: the supervisor's judgement ---------------------------------------------------


class Recorder:
    def __init__(self, name: str, got: list[Any]) -> None:
        self.name, self.got = name, got

    def tell(self, msg: Any) -> None:
        self.got.append(msg)

    def ask(self, msg: Any, timeout_s: float = 10.0) -> Any:
        return None


class FakeLauncher:
    def __init__(self) -> None:
        self.cpu: float | None = 1.0
        self.killed: list[int] = []

    def launch(self, spec: Any) -> int:
        return 4242

    def alive(self, pid: int) -> bool:
        return pid not in self.killed

    def kill(self, pid: int, force: bool = False) -> None:
        self.killed.append(pid)

    def cpu_s(self, pid: int) -> float | None:
        return self.cpu

    def handle_of(self, hello: Any) -> int:
        return int(hello.pid)

    def adopt(self, pid: int) -> None:
        pass

    def reap_all(self, timeout_s: float = 3.0) -> None:
        pass

    def close(self) -> None:
        pass


class DummyRef:
    name = names.worker_name(3)

    def close(self) -> None:
        pass


@pytest.fixture
def supervised() -> Iterator[tuple[RoleSupervisor, FakeLauncher, Now, list[Any]]]:
    now = Now()
    cfg = load(None, ["daemon.heartbeat_s=0.5"])
    d = Directory()
    got: list[Any] = []
    for name in (names.ROUTER, names.ORCHESTRATOR):
        d.register(Recorder(name, got))
    launcher = FakeLauncher()
    board = Liveboard(0.5, clock=now)
    sup = RoleSupervisor(
        directory=d,
        launcher=launcher,
        config=cfg,
        endpoint=lambda: "tcp://x",
        state_dir="",
        boot_id="boot",
        board=board,
    )  # type: ignore[arg-type]
    sup.hosts[3] = Host(3, 12, (3,), handle=101, ref=DummyRef())  # type: ignore[arg-type]
    board.add(3, 12)
    yield sup, launcher, now, got


def test_a_silent_host_that_computes_is_busy_then_dead_once_it_stops(
    supervised: Any, monkeypatch: Any
) -> None:
    sup, launcher, now, got = supervised
    clock = [1000.0]
    monkeypatch.setattr("actors.supervisor.time.monotonic", lambda: clock[0])
    sup.supervise(Supervise())  # heard from: fine; the supervisor notes its CPU
    now.t += 2.0  # 4 intervals of silence...
    clock[0] += 2.0
    launcher.cpu = 1.5  # ...while the process computed (an import holding the interpreter)
    sup.supervise(Supervise())
    assert 3 in sup.hosts and not launcher.killed
    assert sup.board.report() == {"silent but busy": 1}
    stopped = clock[0]
    while not launcher.killed:  # no CPU used from here: dead once a heartbeat timeout shows none
        assert clock[0] - stopped < 3.0, "an idle, silent host was never declared dead"
        now.t += 0.2
        clock[0] += 0.2
        sup.supervise(Supervise())
    assert 1.5 <= clock[0] - stopped <= 1.7 + 1e-9  # LIVENESS x heartbeat_s, and one tick
    assert launcher.killed == [101]
    assert sup.board.report() == {"missed heartbeats": 1, "silent but busy": 1}
    gone = [m for m in got if isinstance(m, WorkerGone)]
    assert gone == [WorkerGone(3, 12, "missed heartbeats")]
    assert any(isinstance(m, cmd.WorkerDown) for m in got)


def test_a_starved_host_that_gains_a_little_cpu_is_spared(
    supervised: Any, monkeypatch: Any
) -> None:
    """A process the machine's load starves gains less than a clock tick of CPU between most
    supervise ticks; over a heartbeat timeout it still shows work, so it is not declared dead."""
    sup, launcher, now, got = supervised
    clock = [1000.0]
    monkeypatch.setattr("actors.supervisor.time.monotonic", lambda: clock[0])
    sup.supervise(Supervise())
    for i in range(30):  # 6 s of silence; 10 ms of CPU once a second
        now.t += 0.2
        clock[0] += 0.2
        if i % 5 == 4:
            launcher.cpu = (launcher.cpu or 0) + 0.01
        sup.supervise(Supervise())
    assert not launcher.killed and 3 in sup.hosts
    assert "missed heartbeats" not in sup.board.report()


def test_a_stopped_host_is_dead_after_three_missed_intervals(supervised: Any) -> None:
    sup, launcher, now, got = supervised
    sup.supervise(Supervise())
    now.t += 1.6
    launcher.cpu = None  # SIGSTOPped (or gone): never "busy"
    sup.supervise(Supervise())
    assert launcher.killed == [101] and sup.board.report()["missed heartbeats"] == 1


def test_a_busy_host_is_spared_only_so_long(supervised: Any, monkeypatch: Any) -> None:
    sup, launcher, now, got = supervised
    clock = [1000.0]
    monkeypatch.setattr("actors.supervisor.time.monotonic", lambda: clock[0])
    sup.supervise(Supervise())
    now.t += 2.0
    for _ in range(100):  # silent, always computing, for 20 s: past 10 heartbeat timeouts
        launcher.cpu = (launcher.cpu or 0) + 0.1
        clock[0] += 0.2
        sup.supervise(Supervise())
        if launcher.killed:
            break
    assert launcher.killed == [101]
    assert 15.0 <= clock[0] - 1000.0 <= 15.6


def test_the_api_counts_a_hosts_reports_as_heartbeats() -> None:
    """End to end over a socket: a report (not a beat) from a host keeps it alive."""
    now = Now()
    board = Liveboard(0.5, clock=now)
    board.add(5, 2)
    with (
        Server(
            "tcp://127.0.0.1:*",
            dispatch({StatusRequest: lambda env: Status()}),
            liveness=board.ear,
        ) as s,
        Client(s.address, name=host_name(5, 2, "r")) as c,
    ):
        now.t += 1.4
        c.request(StatusRequest())
        now.t += 1.4
        assert board.dead() == set()


def test_an_undeliverable_request_is_routed_again_not_queued_for_the_restart(
    supervised: Any,
) -> None:
    from actors.messages import Generate
    from actors.supervisor import Undeliverable
    from pearl.engines.base import GenerateRequest

    sup, launcher, now, got = supervised
    stop = cmd.StopWorker(worker=3)
    sup.undeliverable(
        Undeliverable(3, Generate(request=GenerateRequest(rid="r", input_ids=(1,))), "no reply")
    )
    sup.undeliverable(Undeliverable(3, stop, "no reply"))
    h = sup.hosts[3]
    assert h.pending == [stop]  # commands wait for the restarted host; the request does not
    assert [m for m in got if isinstance(m, WorkerGone)] == [
        WorkerGone(3, 12, "unreachable (no reply)")
    ]


def test_a_death_is_counted_by_its_category_and_told_with_its_detail(supervised: Any) -> None:
    from actors.messages import Generate
    from actors.supervisor import Death, Undeliverable
    from pearl.engines.base import GenerateRequest

    sup, _, _, got = supervised
    sup.undeliverable(
        Undeliverable(
            3, Generate(request=GenerateRequest(rid="r", input_ids=(1,))), "no reply (ZMQ)"
        )
    )
    down = [m for m in got if isinstance(m, cmd.WorkerDown)]
    assert [d.reason for d in down] == ["unreachable (no reply (ZMQ))"]
    assert sup.board.deaths == {Death.UNREACHABLE: 1}
    assert sup.board.report() == {"unreachable": 1, "silent but busy": 0}
