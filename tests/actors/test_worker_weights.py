"""The WorkerActor's weights: a joiner takes the newest stored version, whatever it was told."""

from __future__ import annotations

from typing import Any

import pytest

from actors.base import Directory
from actors.messages import LoadWeights
from actors.worker import WorkerActor, sync_weights
from pearl.core.errors import EngineError
from pearl.metrics import HostMetrics


class Engine:
    def __init__(self, fail: int = 0) -> None:
        self.weights_version, self.fail = 0, fail
        self.loads: list[tuple[int, Any]] = []

    def load_weights(self, version: int, source: Any) -> None:
        if self.fail:
            self.fail -= 1
            raise EngineError(f"weights file {source} does not exist")
        self.loads.append((version, source))
        self.weights_version = version


def weights(engine: Engine, version: int, store: list[tuple[int, str] | None]) -> None:
    """``sync_weights`` with a store that answers ``store`` in turn."""
    answers = iter(store)
    sync_weights(engine, version, lambda v: next(answers))  # type: ignore[arg-type]


def worker(engine: Engine, metrics: HostMetrics | None = None) -> WorkerActor:
    """A WorkerActor (not started) whose engine is up and released (lent), and whose store
    holds version 6."""
    actor = WorkerActor(
        directory=Directory(),
        worker=2,
        incarnation=1,
        make_engine=lambda role: engine,
        weights_source=lambda v: (6, "v6"),
        on_exit=lambda: None,
        metrics=metrics,
    )
    actor.engine, actor.released = engine, True  # type: ignore[assignment]
    return actor


def test_before_the_first_publish_the_initial_weights_stay() -> None:
    e = Engine()
    weights(e, 0, [])
    weights(e, 3, [None])  # the table names 3, nothing is stored: no NoneType, version 0
    assert e.loads == [] and e.weights_version == 0


def test_a_version_not_stored_yet_gives_the_newest_below_it() -> None:
    e = Engine()
    weights(e, 2, [(1, "v1")])
    assert e.loads == [(1, "v1")]
    weights(e, 2, [(1, "v1")])  # asked again: nothing newer to load
    assert e.loads == [(1, "v1")]


def test_a_pruned_version_gives_the_newest_and_a_race_with_pruning_is_retried() -> None:
    e = Engine()
    weights(e, 2, [(6, "v6")])  # 2 was pruned while the host booted
    assert e.loads == [(6, "v6")]
    e = Engine(fail=1)
    weights(e, 2, [(5, "v5"), (6, "v6")])  # v5 pruned between the look-up and the load
    assert e.loads == [(6, "v6")]
    e = Engine(fail=2)
    with pytest.raises(EngineError):
        weights(e, 2, [(5, "v5"), (6, "v6")])


def test_a_released_worker_loads_the_newest_when_activated_not_what_it_was_synced_to() -> None:
    e = Engine()
    actor = worker(e)
    actor.on_load_weights(LoadWeights(version=3))
    assert e.loads == []  # v3 will be pruned by the time it is activated
    actor.released = False
    actor.on_load_weights(LoadWeights(version=3))
    assert e.loads == [(6, "v6")]


class Released(Engine):
    """A lent worker's engine: records the order of weight loads and the resume."""

    def __init__(self) -> None:
        super().__init__()
        from pearl.core.state import Role

        self.role, self.calls = Role.COLOCATED, list[str]()

    def load_weights(self, version: int, source: Any) -> None:
        self.calls.append(f"load {version}")
        super().load_weights(version, source)

    def resume_memory(self) -> None:
        self.calls.append("resume")


def test_an_activated_worker_is_given_the_newest_weights_before_it_resumes() -> None:
    from pearl.core.state import Role

    e = Released()
    actor = worker(e, HostMetrics(2, 1, "sim"))
    actor.bring_up(Role.COLOCATED, 5)
    assert e.calls == ["load 6", "resume"] and not actor.released
