"""The training context reports the version this runtime published, even when the status view
has not caught up with the log yet (the race CI hit against a pearld subprocess)."""

from __future__ import annotations

from typing import Any

import msgspec

from pearl.core import events as ev
from pearl.core.status import ClusterStatus
from pearl.core.view import ClusterView, cluster_status
from pearl.runtime import _Base


class LaggingRuntime(_Base):
    """Status answers from a view that never sees the publish; events are recorded."""

    def __init__(self) -> None:
        self.events: list[Any] = []

    def _event(self, record: Any) -> int:
        self.events.append(record)
        return len(self.events)

    def status(self) -> ClusterStatus:
        s = cluster_status(ClusterView())
        return msgspec.structs.replace(s, training_may_proceed=10**9)

    def _next_batch(self, timeout_s: float) -> Any | None:
        return None

    def _publish(self, version: int, weights: Any) -> str:
        return f"/weights/{version}"

    def stop(self) -> None:
        pass


def test_training_finished_names_the_version_just_published() -> None:
    rt = LaggingRuntime()
    with rt.training(1):
        rt.publish_weights({}, 1)
    finished = [r for r in rt.events if isinstance(r, ev.TrainingFinished)]
    assert [r.weights_version for r in finished] == [1]


def test_an_explicit_version_wins_and_no_publish_keeps_the_status_version() -> None:
    rt = LaggingRuntime()
    with rt.training(1):
        pass
    with rt.training(2, weights_version=0):
        pass
    assert [r.weights_version for r in rt.events if isinstance(r, ev.TrainingFinished)] == [0, 0]
