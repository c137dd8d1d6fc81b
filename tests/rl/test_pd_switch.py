"""A live PD mode switch on torch-engine workers under pearld: colocated -> disaggregated ->
colocated while trajectories are generating. Every trajectory completes, each equals the same
trajectory generated alone on one engine (greedy decoding), and the log replays to the final
table."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import pearl
from pearl import config
from pearl.core import events as ev
from pearl.core.status import ClusterStatus, status_plain
from pearl.log import FileLog
from pearl.testing.wait import wait_until

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "local-cpu.toml"
SETS = (
    "cluster.training_gpus=0",
    "cluster.reserved_gpus=1-2",
    "cluster.preemptible_gpus=3",
    "daemon.borrow=never",
    "daemon.pd=adaptive",
    "daemon.heartbeat_s=1.0",
    "daemon.tick_s=0.1",
    # Priors (no batch is taken before the switches, so no telemetry replaces them): with 2
    # workers no split keeps up with prefill (1P1D's pool 91% busy: colocated); with 3, 2P1D is
    # predicted ~37% faster than colocation, and no hysteresis holds it back.
    "decision.mode_switch_threshold=0.0",
    "workload.batch=16",
    "workload.group_size=4",
    "workload.new_tokens_per_turn=60",
    "workload.generated_tokens_per_turn=8",
    "workload.turn_overhead_s=0.05",
    "workload.max_trajectory_tokens=1024",
    "rl.env=tool_use_counts",
    "rl.max_turns=2",
    # Long generations on slow devices keep the trajectories generating through both plans (a
    # worker host starts in seconds; 32 trajectories of 48 tokens a turn finish in about three).
    "rl.max_new_tokens=256",
    "engine.torch.device_share=0.15",
    "rl.temperature=0",  # greedy: a trajectory is a function of its task
)


def wait_for(rt: Any, pred: Any, timeout: float, what: str) -> ClusterStatus:
    def ready() -> ClusterStatus | None:
        s: ClusterStatus = rt.status()
        return s if s.plan is None and pred(s) else None

    got: ClusterStatus = wait_until(ready, timeout, what)
    return got


def serving(s: ClusterStatus) -> str:
    return f"{s.N_C}C" if s.mode == "colocated" else f"{s.N_P}P{s.N_D}D"


def generating(rt: Any, timeout: float = 60.0) -> int:
    """Wait until requests are in flight on the workers; how many."""
    p = rt.daemon.batches()
    return int(wait_until(lambda: p.generating, timeout, "generation in flight", every=0.01))


def alone(cfg: Any, trajectories: list[Any]) -> dict[str, Any]:
    """Each trajectory's task rolled out again on one engine of the same weights, greedily."""
    from pearl.engines.base import SamplingParams
    from pearl.engines.torch import TorchEngine
    from pearl.engines.torch.engine import TorchEngineConfig
    from pearl.rl.env import make_env, make_tasks
    from pearl.rl.prompt import PromptBuilder
    from pearl.rl.rollout import engine_generate, run_trajectory
    from pearl.tokenizer import load_tokenizer

    tasks = {t.id: t for t in make_tasks(cfg.rl.env, n=cfg.rl.tasks, seed=cfg.rl.seed)}
    builder = PromptBuilder(load_tokenizer(None), max_len=cfg.workload.max_trajectory_tokens)
    engine = TorchEngine(TorchEngineConfig(preset="tiny", seed=cfg.engine.torch.seed))
    engine.start()
    try:
        generate = engine_generate(engine)
        sp = SamplingParams(max_new_tokens=cfg.rl.max_new_tokens, temperature=0.0)

        async def one(t: Any) -> Any:
            env = make_env(cfg.rl.env, max_turns=cfg.rl.max_turns)
            traj = await run_trajectory(
                env=env,
                task=tasks[t.task_id],
                generate=generate,
                builder=builder,
                trajectory_id=t.id,
                group_id=t.group_id,
                sampling=sp,
            )
            return traj.tokens()

        async def every() -> list[Any]:
            return list(await asyncio.gather(*(one(t) for t in trajectories)))

        return dict(zip((t.id for t in trajectories), asyncio.run(every()), strict=True))
    finally:
        engine.stop()


def test_colocated_disaggregated_colocated_with_requests_in_flight(tmp_path: Path) -> None:
    state = tmp_path / "state"
    rt = pearl.Runtime.from_config(CONFIG, state_dir=state, overrides=SETS)
    rt.start()
    modes = []
    try:
        s = wait_for(rt=rt, pred=lambda s: s.N_C == 2, timeout=120, what="2 colocated workers")
        modes.append(serving(s))
        in_flight = [generating(rt)]
        rt.event(ev.GpusAdded(gpus=(3,)))
        s = wait_for(rt=rt, pred=lambda s: s.mode == "disaggregated", timeout=120, what="the split")
        modes.append(serving(s))
        in_flight.append(generating(rt))
        rt.event(ev.GpusReclaimed(gpus=(3,)))
        s = wait_for(
            rt=rt,
            pred=lambda s: s.mode == "colocated" and s.N_C == 2,
            timeout=120,
            what="colocation",
        )
        modes.append(serving(s))
        batches = [rt.next_batch(timeout_s=240) for _ in range(2)]
        stats = rt.stats()
        switches = stats.switches
        assert stats.pipeline is not None
        migrated = len(stats.pipeline.migrations)
        final = rt.status()
    finally:
        rt.stop()

    assert modes[0] == "2C" and modes[1] in ("1P2D", "2P1D") and modes[2] == "2C", modes
    assert all(in_flight), in_flight
    assert migrated > 0  # the switches moved generations in flight, with their prefixes
    # The reclaim's return plan removes the leaving worker first (2P1D -> 1P1D, say); the plan
    # that follows switches what is left back to colocation.
    assert [str(p.target) for p in switches] == [modes[1], "2C"], switches
    assert str(switches[0].before) == "2C" and switches[1].before is not None
    assert switches[1].before.mode.value == "disaggregated"
    assert all(p.end is not None and p.end >= p.begin for p in switches)

    trajectories = [t for b in batches for t in b]
    assert len(trajectories) == 32 and all(t.done for t in trajectories)
    cfg = config.load(CONFIG, list(SETS))
    reference = alone(cfg, trajectories)
    differ = [t.id for t in trajectories if t.tokens() != reference[t.id]]
    assert not differ, (
        f"{len(differ)} trajectories differ from their unswitched rollout "
        f"({migrated} generations migrated)"
    )

    with FileLog(state / "log", readonly=True) as log:
        table = log.load(final.seq).state.to_json()
    assert (table["seq"], table["workers"]) == (final.seq, status_plain(final)["workers"])
