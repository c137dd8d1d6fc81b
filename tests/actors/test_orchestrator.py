"""The Orchestrator keeps serving when the controller trips over its own invariant: the event
that caused it is logged as an error, and the controller's view is rebuilt from the log."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from actors.base import Directory, start
from actors.orchestrator import Boot, Orchestrator
from pearl import config
from pearl.core import commands as cmd
from pearl.core import events as ev
from pearl.core.controller import Controller, ControllerState, Output
from pearl.core.errors import InvalidEvent, InvariantViolation
from pearl.core.fold import replay
from pearl.core.policy import Policy
from pearl.core.profile import prior_profile
from pearl.log.memory import MemoryLog

CFG = config.load("configs/sim-32.toml")


class Tripping(Controller):
    """A controller with a bug: the first Tick it sees violates an invariant."""

    tripped = 0

    def handle(
        self, s: ControllerState, event: Any, now: float, wall: float | None = None
    ) -> Output:
        if isinstance(event, cmd.Tick) and not self.tripped:
            self.tripped += 1
            raise InvariantViolation("no worker in slot 99")
        return super().handle(s=s, event=event, now=now, wall=wall)


def test_an_invariant_violation_is_logged_and_recovered_in_place(
    caplog: pytest.LogCaptureFixture,
) -> None:
    c = CFG.cluster
    log = MemoryLog()
    log.append(
        [
            ev.ClusterInit(
                tp=c.tp,
                training_gpus=c.training_gpus,
                reserved_gpus=c.reserved_gpus,
                preemptible_gpus=c.preemptible_gpus,
            )
        ]
    )
    ctl = Tripping(Policy(CFG.decision))
    recovered = ctl.recover(replay(r for _, r in log.read()), prior_profile(CFG), 0.0)
    ref = start(
        Directory(),
        Orchestrator,
        directory=Directory(),
        event_log=log,
        controller=ctl,
        recovered=recovered,
    )
    try:
        with caplog.at_level(logging.ERROR):
            ref.ask(cmd.Tick(), timeout_s=5)
        assert ref.ref.is_alive()
        assert "no worker in slot 99" in caplog.text and "Tick" in caplog.text
        assert ref.ask(ev.GpusAdded(gpus=(20, 21)), timeout_s=5).seq > 0
        assert ref.ref.proxy().recoveries.get() == 1
        with pytest.raises(InvalidEvent):  # bad client input still answers with its error
            ref.ask(ev.GpusAdded(gpus=(999,)), timeout_s=5)
        assert ref.ref.is_alive()
    finally:
        ref.ref.stop()


def telemetry(step: int) -> ev.Telemetry:
    return ev.Telemetry(
        step=step, batch=1, S=1.0, delta_L=1.0, r=1.0, theta=0.0, A=0.0, b=0.0,
        t_prefill=0.0, T_env=0.0, makespan_s=1.0,
    )  # fmt: skip


def test_a_full_disk_refuses_events_keeps_reports_and_heals_with_no_restart(tmp_path) -> None:
    """While the disk is full: client events are refused with the reason, reports from inside
    pearld wait in order, status answers, the actor lives. Once space returns, the reports are
    logged first and client events are taken again."""
    from pearl.core.errors import LogWriteFailed
    from pearl.log import FileLog, failpoints
    from transports.protocol import StatusRequest

    c = CFG.cluster
    path = tmp_path / "log"
    log = FileLog(path)
    log.append(
        [
            ev.ClusterInit(
                tp=c.tp,
                training_gpus=c.training_gpus,
                reserved_gpus=c.reserved_gpus,
                preemptible_gpus=c.preemptible_gpus,
            )
        ]
    )
    ctl = Controller(Policy(CFG.decision))
    recovered = ctl.recover(replay(r for _, r in log.read()), prior_profile(CFG), 0.0)
    ref = start(
        Directory(),
        Orchestrator,
        directory=Directory(),
        event_log=log,
        controller=ctl,
        recovered=recovered,
    )
    try:
        ref.ask(Boot(), timeout_s=5)
        before = log.last_seq
        failpoints.disk(space=7)  # part of a frame fits, then ENOSPC
        ref.tell(telemetry(1))
        ref.tell(cmd.Tick())  # a tick is not kept, and does not jump the queue
        ref.tell(telemetry(2))
        with pytest.raises(
            LogWriteFailed, match=r"2 earlier record\(s\) .* wait for the disk first"
        ):
            ref.ask(ev.GpusAdded(gpus=(20, 21)), timeout_s=5)
        assert ref.ask(StatusRequest(), timeout_s=5).seq == before
        assert ref.ref.is_alive() and log.last_seq == before
        failpoints.disk()
        ack = ref.ask(ev.GpusAdded(gpus=(20, 21)), timeout_s=5)
        assert ack.seq == before + 3
        assert not ref.ref.proxy().backlog.get()
    finally:
        failpoints.disk()
        ref.ref.stop()
        log.close()
    with FileLog(path, readonly=True) as after:
        kinds = [(type(r).__name__, getattr(r, "step", None)) for _, r in after.read(before + 1)]
    assert kinds[:3] == [("Telemetry", 1), ("Telemetry", 2), ("GpusAdded", None)]
