"""The Orchestrator keeps serving when the controller trips over its own invariant: the event
that caused it is logged as an error, and the controller's view is rebuilt from the log."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from actors.base import Directory, start
from actors.orchestrator import Orchestrator
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
        return super().handle(s, event, now, wall)


def test_an_invariant_violation_is_logged_and_recovered_in_place(
    caplog: pytest.LogCaptureFixture,
) -> None:
    c = CFG.cluster
    log = MemoryLog()
    log.append([ev.ClusterInit(c.tp, c.training_gpus, c.reserved_gpus, c.preemptible_gpus)])
    ctl = Tripping(Policy(CFG.decision))
    recovered = ctl.recover(replay(r for _, r in log.read()), prior_profile(CFG), 0.0)
    ref = start(Directory(), Orchestrator, Directory(), log, ctl, recovered)
    try:
        with caplog.at_level(logging.ERROR):
            ref.ask(cmd.Tick(), timeout_s=5)
        assert ref.ref.is_alive()
        assert "no worker in slot 99" in caplog.text and "Tick" in caplog.text
        assert ref.ask(ev.GpusAdded((20, 21)), timeout_s=5).seq > 0
        assert ref.ref.proxy().recoveries.get() == 1
        with pytest.raises(InvalidEvent):  # bad client input still answers with its error
            ref.ask(ev.GpusAdded((999,)), timeout_s=5)
        assert ref.ref.is_alive()
    finally:
        ref.ref.stop()
