"""A whole asynchronous RL run through the real runtime, with elastic events at random moments.

Tiny Qwen3 workers on the torch engine, the tool-use environment, real GRPO steps. Every batch
must hold complete, consistent trajectories within the staleness bound; none is lost or handed
out twice; and borrowed workers are always back before a training step starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import random
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

import pearl
from pearl.core import events as ev
from pearl.core.status import ClusterStatus
from pearl.rl.trajectory import Batch
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
    "daemon.borrow=always",  # borrow whenever training is idle: every step returns GPUs
    "daemon.heartbeat_s=1.0",
    "daemon.tick_s=0.1",
)


def check_batch(
    batch: Batch, B: int, group_size: int, trainer_version: int, staleness: int
) -> None:
    assert len(batch) == B
    groups = batch.groups()
    assert all(len(g) == group_size for g in groups.values())
    for t in batch:
        assert t.done and t.turns
        tokens, mask, lps = t.tokens(), t.loss_mask(), t.rollout_logprobs()
        assert len(mask) == len(tokens) and sum(mask) == t.n_generated
        assert len(lps) == len(tokens)  # aligned to the tokens; 0 outside generated ones
        assert all(math.isfinite(x) and x <= 1e-4 for x in lps)
        assert all(x == 0.0 for x, m in zip(lps, mask, strict=True) if not m)
        assert math.isfinite(t.reward)
        for turn in t.turns:
            assert len(turn.logprobs) == len(turn.output_ids)
        assert t.min_version >= trainer_version - staleness, (t.min_version, trainer_version)


def returned(status: ClusterStatus) -> bool:
    trainer = [w for w in status.workers if w.role == "training"]
    overlap = [w for w in status.workers if w.zone == "overlap" and w.role != "training"]
    return all(w.activity == "active" for w in trainer) and all(
        w.activity == "inactive" for w in overlap
    )


def test_rl_run_with_elastic_events(tmp_path: Path) -> None:
    from pearl.rl.grpo import GRPOTrainer

    rt = pearl.Runtime.from_config(CONFIG, state_dir=tmp_path / "state", overrides=FAST)
    rng = random.Random(11)
    stop = threading.Event()
    injected: list[Any] = []

    def chaos() -> None:
        present: list[int] = []
        while not stop.wait(rng.uniform(0.3, 1.5)):
            try:
                if present and rng.random() < 0.5:
                    gone = rng.choice(present)
                    rt.event(ev.GpusReclaimed(gpus=(gone,)))
                    present.remove(gone)
                    injected.append(("reclaimed", gone))
                else:
                    free = [g for g in (3, 4, 5) if g not in present]
                    if free:
                        g = rng.choice(free)
                        rt.event(ev.GpusAdded(gpus=(g,)))
                        present.append(g)
                        injected.append(("added", g))
            except pearl.PearlError:
                pass  # refused against the logged state (e.g. still being returned)

    rt.start()
    trainer = GRPOTrainer(preset="tiny", seed=0, lr=3e-4, device="cpu")
    seen: set[str] = set()
    chaos_thread = threading.Thread(target=chaos, daemon=True)
    try:
        chaos_thread.start()
        for step in range(1, 4):
            batch = rt.next_batch(timeout_s=240)
            check_batch(
                batch=batch, B=8, group_size=4, trainer_version=trainer.version, staleness=1
            )
            ids = {t.id for t in batch}
            assert not ids & seen, "a trajectory was handed out twice"
            seen |= ids
            with rt.training(step):
                assert returned(rt.status()), "training started with borrowed workers out"
                trainer.step(batch)
                rt.publish_weights(trainer.state_dict(), step)
        assert injected, "no elastic event was injected"
        # The async variants drive the same runtime.
        batch = asyncio.run(rt.anext_batch(timeout_s=240))
        check_batch(batch=batch, B=8, group_size=4, trainer_version=trainer.version, staleness=1)
    finally:
        stop.set()
        chaos_thread.join(5)
        pipeline = rt.daemon.batches()
        rt.stop()
    c = pipeline.counts
    assert c["delivered"] == 2 * 4  # 4 batches of 2 groups
    assert c["started"] >= c["delivered"] + c["stale"] + c["failed"]
    status_log = list(FileLogView(tmp_path / "state"))
    assert any(isinstance(r, ev.WeightsPublished) and r.version == 3 for r in status_log)


def FileLogView(state: Path) -> Any:  # noqa: N802 - reads like a value
    from pearl.log import FileLog

    with FileLog(state / "log", readonly=True) as log:
        return [r for _, r in log.read()]


def test_embedding_api_against_a_pearld_subprocess(tmp_path: Path) -> None:
    from pearl.rl.grpo import GRPOTrainer

    endpoint = f"ipc://{tmp_path}/pearld.sock"
    args = [
        sys.executable,
        "-m",
        "pearl.daemon",
        "--config",
        str(CONFIG),
        "--state-dir",
        str(tmp_path / "state"),
        "--endpoint",
        endpoint,
    ]
    for s in FAST:
        args += ["--set", s]
    stderr_file = open(tmp_path / "pearld.log", "wb")  # noqa: SIM115 (the child owns it)
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=stderr_file, cwd=ROOT)
    try:

        def connected() -> Any:
            try:
                return pearl.connect(endpoint, timeout_s=2.0)
            except pearl.PearlError:
                return None

        rt = wait_until(connected, 60, "pearld to accept a client", every=0.2)
        trainer = GRPOTrainer(preset="tiny", seed=0, lr=3e-4, device="cpu")
        batch = rt.next_batch(timeout_s=240)
        check_batch(batch=batch, B=8, group_size=4, trainer_version=0, staleness=1)
        with rt.training(1) as step:
            assert step == 1 and returned(rt.status())
            trainer.step(batch)
            path = rt.publish_weights(trainer.state_dict(), 1)  # uploaded as one bulk frame
        assert path.endswith(".safetensors") and Path(path).exists()
        status = rt.status()
        assert status.weights_version == 1 and status.phase == "idle"
        batch = rt.next_batch(timeout_s=240)
        check_batch(batch=batch, B=8, group_size=4, trainer_version=1, staleness=1)
        rt.stop()
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(5)
        for pid_file in (tmp_path / "state" / "workers").glob("*.pid"):
            with contextlib.suppress(ProcessLookupError, ValueError, OSError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
