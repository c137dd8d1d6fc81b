"""A real pearld subprocess with sim worker hosts (pearl.testing.pearld), cleaned up by pid."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pearl.core.events import RECORDS
from pearl.core.fold import replay
from pearl.testing.pearld import CONFIG, ROOT, Pearld
from pearl.testing.wait import wait_until

# A small cluster: 2 overlap workers on training GPUs 0-3, 2 reserved workers on 4-7, up to 4
# preemptible workers on 8-15. Sim engines run 1000x faster than real time.
SMALL = [
    "cluster.training_gpus=0-3",
    "cluster.reserved_gpus=4-7",
    "cluster.preemptible_gpus=8-15",
    "engine.sim.time_scale=0.001",
    "daemon.heartbeat_s=0.2",
    "daemon.tick_s=0.1",
    "daemon.reconcile_grace_s=2.0",
    "daemon.restart_backoff_s=0.2",
    "daemon.worker_orphan_s=20",
]


@pytest.fixture
def pearld_factory(tmp_path: Path) -> Iterator[Callable[..., Pearld]]:
    made: list[Pearld] = []

    def make(*extra: str, start: bool = True) -> Pearld:
        p = Pearld(tmp_path / f"d{len(made)}", [*SMALL, *extra])
        p.tmp.mkdir(parents=True)
        made.append(p)
        if start:
            p.start()
        return p

    yield make
    for p in made:
        p.cleanup()


__all__ = ["CONFIG", "RECORDS", "ROOT", "SMALL", "Pearld", "replay", "wait_until"]
