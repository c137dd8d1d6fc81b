"""Fixtures for the log tests: one factory per store, so one suite runs against both."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pearl.log import EventLog, FileLog, MemoryLog, MemoryStorage


class Store:
    """Opens (and reopens, as after a restart) one log of a given kind."""

    def __init__(self, kind: str, tmp_path: Path) -> None:
        self.kind = kind
        self.dir = tmp_path / "log"
        self.storage = MemoryStorage()
        self.opened: list[EventLog] = []

    def open(self, **kw: object) -> EventLog:
        memory = self.kind == "memory"
        log = MemoryLog(self.storage, **kw) if memory else FileLog(self.dir, **kw)  # type: ignore[arg-type]
        self.opened.append(log)
        return log

    def reopen(self, log: EventLog, **kw: object) -> EventLog:
        log.close()
        return self.open(**kw)

    def close_all(self) -> None:
        for log in self.opened:
            log.close()


@pytest.fixture(params=["memory", "file"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    s = Store(request.param, tmp_path)
    yield s
    s.close_all()


@pytest.fixture
def open_file_log(tmp_path: Path) -> Iterator[Callable[..., FileLog]]:
    """``open_file_log(**kw)`` opens ``tmp_path/log``; every log opened is closed afterwards."""
    opened: list[FileLog] = []

    def open_(path: Path | None = None, **kw: object) -> FileLog:
        log = FileLog(path or tmp_path / "log", **kw)  # type: ignore[arg-type]
        opened.append(log)
        return log

    yield open_
    for log in opened:
        log.close()
