"""A refused event is one warning line with its reason: no pykka traceback per actor it crossed."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from actors import base, names
from actors.control import ElasticScheduler
from pearl.core import events as ev
from pearl.core.errors import InvalidEvent


class Refuser(base.PearlActor):
    """An orchestrator that refuses every event, as the controller does with bad input."""

    name = names.ORCHESTRATOR

    def event(self, record: Any) -> None:
        raise InvalidEvent(f"GPU {record.gpus[0]} is not present, so it cannot be reclaimed")

    def bug(self, _: str) -> None:
        raise KeyError("a bug")

    handles = {ev.GpusReclaimed: event, str: bug}


def test_a_refused_event_is_one_warning_line(caplog: pytest.LogCaptureFixture) -> None:
    d = base.Directory()
    base.start(d, Refuser)
    scheduler = base.start(d, ElasticScheduler, d)
    caplog.set_level(logging.DEBUG)
    for _ in range(3):
        with pytest.raises(InvalidEvent, match="GPU 30 is not present"):
            scheduler.ask(ev.GpusReclaimed(gpus=(30,)), 5.0)
    lines = [r for r in caplog.records if r.levelno >= logging.INFO]
    assert [(r.levelname, r.getMessage()) for r in lines] == 3 * [
        ("WARNING", "gpus-reclaimed refused: GPU 30 is not present, so it cannot be reclaimed")
    ]
    assert not any(r.exc_info for r in caplog.records)


def test_an_unexpected_exception_keeps_its_traceback(caplog: pytest.LogCaptureFixture) -> None:
    d = base.Directory()
    ref = base.start(d, Refuser)
    caplog.set_level(logging.INFO)
    with pytest.raises(KeyError):
        ref.ask("boom", 5.0)
    assert [r for r in caplog.records if r.exc_info and isinstance(r.exc_info[1], KeyError)]
