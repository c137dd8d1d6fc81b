"""A preemptible worker joins at any phase of a training step and gets the newest weights.

Torch-engine worker hosts are added and reclaimed before the first publish, during training,
between Training Finished and the publish of its version (the table names a version the store does
not hold yet), right after a publish, and while versions are published faster than a host boots
(the version its StartWorker names is pruned before it loads). Every expansion commits: no plan is
aborted, no joiner is removed as a cancelled expansion.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import pearl
from pearl.core import events as ev
from pearl.core.status import ClusterStatus, WorkerRow
from pearl.rl.weights import latest_snapshot
from pearl.testing.wait import wait_until

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "local-cpu.toml"
FAST = (
    "workload.batch=8",
    "workload.group_size=4",
    "workload.max_trajectory_tokens=512",
    "rl.max_turns=2",
    "rl.max_new_tokens=16",
    "daemon.borrow=never",  # lending plans are another story (they end at training-begin)
    "daemon.heartbeat_s=1.0",
    "daemon.tick_s=0.1",
)
JOIN_S = 120.0


def on(status: ClusterStatus, gpu: int) -> list[WorkerRow]:
    return [w for w in status.workers if gpu in w.gpus and w.role != "training"]


def settle(rt: Any, gpu: int, present: bool) -> None:
    """Until the worker on ``gpu`` serves (or is gone) and no plan is in flight."""

    def settled() -> bool:
        s = rt.status()
        rows = on(s, gpu)
        done = [w.activity for w in rows] == ["active"] if present else not rows
        return bool(done and s.plan is None)

    wait_until(settled, JOIN_S, f"GPU {gpu} {'joining' if present else 'leaving'}", every=0.1)


def join_and_leave(rt: Any, gpu: int, during: Any = None) -> None:
    rt.event(ev.GpusAdded(gpus=(gpu,)))
    if during is not None:
        during()  # while the host boots and its StartWorker is on its way
    settle(rt, gpu, present=True)
    rt.event(ev.GpusReclaimed(gpus=(gpu,)))
    settle(rt, gpu, present=False)


def newest(state: Path) -> int | None:
    found = latest_snapshot(state / "weights")
    return None if found is None else found[0]


def records(state: Path) -> list[Any]:
    from pearl.log import FileLog

    with FileLog(state / "log", readonly=True) as log:
        return [r for _, r in log.read()]


def test_workers_join_and_leave_at_every_phase_of_a_step(tmp_path: Path) -> None:
    from pearl.rl.grpo import GRPOTrainer

    state = tmp_path / "state"
    rt = pearl.Runtime.from_config(CONFIG, state_dir=state, overrides=FAST)
    rt.start()
    try:
        trainer = GRPOTrainer(preset="tiny", seed=0, lr=3e-4, device="cpu")
        join_and_leave(rt, 3)  # before the first version exists: the initial weights
        batch = rt.next_batch(timeout_s=240)
        with rt.training(1, weights_version=1):
            join_and_leave(rt, 4)  # while training runs (the table is still at version 0)
            trainer.step(batch)
            rt.publish_weights(trainer.state_dict(), 1)
        join_and_leave(rt, 5)  # right after a publish
        batch = rt.next_batch(timeout_s=240)
        with rt.training(2, weights_version=2):
            trainer.step(batch)
        # Training Finished named version 2; its snapshot is still being written: a joiner takes
        # the newest stored version (1) and moves on when told.
        assert rt.status().weights_version == 2 and newest(state) == 1
        join_and_leave(rt, 3)
        rt.publish_weights(trainer.state_dict(), 2)

        def publish_burst() -> None:  # keep=3: version 2, which StartWorker names, is pruned
            for v in range(3, 7):
                rt.publish_weights(trainer.state_dict(), v)

        join_and_leave(rt, 4, during=publish_burst)
        assert newest(state) == 6
    finally:
        rt.stop()
    log = records(state)
    aborted = [r for r in log if isinstance(r, ev.PlanAbort)]
    cancelled = [r for r in log if isinstance(r, ev.WorkerRemoved) and "cancel" in r.reason]
    assert not aborted and not cancelled, (aborted, cancelled)
    joined = [r for r in log if isinstance(r, ev.WorkerAdded)]
    assert len(joined) >= 1 + 5  # the reserved worker and the five joiners
