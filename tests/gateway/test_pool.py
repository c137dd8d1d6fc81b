"""PoolBackend: the gateway's backend over the elastic pool.

First on a scripted Router (streams across a migration, a failure, events in and out), then on a
Runtime of sim engines while GPUs come and go and a training step happens."""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from actors import names
from actors.base import Directory
from actors.messages import RolloutStep, StateChanged
from pearl import config
from pearl.core import events as ev
from pearl.core.errors import PearlError
from pearl.core.state import TrainingPhase
from pearl.core.status import status_plain
from pearl.core.view import ClusterView, TableSnapshot
from pearl.gateway.backend import Delta, GatewayError, Sampling
from pearl.gateway.pool import PoolBackend, load_chat_template, model_dir, served_model
from pearl.log import FileLog
from pearl.testing.wait import wait_until
from tests.actors.test_rollout_client import ScriptedRouter
from tests.gateway.conftest import local_runtime


class Scheduler:
    """Acks each event with the next sequence number, refusing gpus-reclaimed of unknown GPUs."""

    name = names.SCHEDULER

    def __init__(self) -> None:
        self.seen: list[Any] = []

    def tell(self, msg: Any) -> None:
        self.ask(msg)

    def ask(self, msg: Any, timeout_s: float = 10.0) -> Any:
        if isinstance(msg, ev.GpusReclaimed) and 99 in msg.gpus:
            raise PearlError("gpus-reclaimed: GPU 99 is not in the cluster")
        self.seen.append(msg)
        return type("Ack", (), {"seq": len(self.seen)})()


class Tracker:
    name = names.TRACKER

    def __init__(self) -> None:
        self.steps: list[RolloutStep] = []

    def tell(self, msg: Any) -> None:
        self.steps.append(msg)

    def ask(self, msg: Any, timeout_s: float = 10.0) -> Any:
        self.tell(msg)


def scripted(
    script: list[tuple[Any, ...]],
) -> tuple[PoolBackend, ScriptedRouter, Scheduler, Tracker]:
    d = Directory()
    router, scheduler, tracker = ScriptedRouter(d, script), Scheduler(), Tracker()
    for ref in (router, scheduler, tracker):
        d.register(ref)  # type: ignore[arg-type]
    cfg = config.load(None, [])
    return PoolBackend(d, cfg, sessions_per_step=1), router, scheduler, tracker


async def collect(
    backend: PoolBackend, rid: str, prompt: tuple[int, ...], n: int, session: str
) -> list[Delta]:
    return [d async for d in backend.generate(rid, prompt, Sampling(n), session)]


def test_a_stream_flows_across_a_migration_one_delta_per_attempt() -> None:
    backend, router, _, tracker = scripted([("abort", 3, 4), ("done", 5)])
    deltas = asyncio.run(
        collect(backend=backend, rid="r1", prompt=(100, 101), n=6, session="chat-1")
    )
    assert [(d.token_ids, d.weight_version, d.finish_reason) for d in deltas] == [
        ((2, 3, 4), 4, None), ((5, 6, 7), 5, "length")
    ]  # fmt: skip
    assert [(d.migrations, d.recomputed_tokens) for d in deltas] == [(0, 0), (1, 5 - 2)]
    assert all(len(d.logprobs) == len(d.token_ids) for d in deltas)
    # the session is the trajectory (the Router's affinity); the stop ids are the request's
    # alone (the gateway adds eos unless the request ignores it)
    assert {r.trajectory for r in router.seen} == {"chat-1"}
    assert router.seen[0].sampling.stop_ids == ()
    assert router.seen[1].input_ids == (100, 101, 2, 3, 4)
    assert tracker.steps == []  # the session is still open: its next turn may come


def test_the_pool_giving_up_fails_the_request_and_its_turn_is_measured() -> None:
    backend, _, _, tracker = scripted([("error",)] * 4)

    with pytest.raises(GatewayError) as e:
        asyncio.run(collect(backend=backend, rid="r1", prompt=(1, 2), n=4, session=""))
    assert e.value.status == 503 and "worker 1 is gone" in e.value.message
    assert len(tracker.steps) == 1 and tracker.steps[0].trajectories[0].turns == 1


def test_a_refusal_is_a_400_with_the_servers_reason_tried_once() -> None:
    backend, router, _, _ = scripted([("refused",), ("done", 1)])
    with pytest.raises(GatewayError) as e:
        asyncio.run(collect(backend=backend, rid="r1", prompt=(600, 5), n=4, session=""))
    assert e.value.status == 400 and e.value.kind == "invalid_request_error"
    assert "Token id 600 is out of vocabulary" in e.value.message and len(router.seen) == 1


def test_no_worker_in_time_is_a_503_with_retry_after() -> None:
    backend, router, _, _ = scripted([("expired",), ("done", 1)])
    with pytest.raises(GatewayError) as e:
        asyncio.run(collect(backend=backend, rid="r1", prompt=(1, 2), n=4, session=""))
    assert e.value.status == 503 and e.value.retry_after_s == 7.0 and len(router.seen) == 1
    # the Router is told the gateway's time: its waiting spends the request's one clock
    wait = backend.cfg.gateway.request_timeout_s
    assert 0 <= wait - router.routes[0].wait_s < 5.0


def test_a_stream_closed_early_aborts_the_request_in_the_pool() -> None:
    backend, router, _, _ = scripted([("abort", 2, 1), ("hold",)])

    async def first() -> Delta:
        stream = backend.generate("r1", (1, 2), Sampling(8), "s")
        delta = await anext(stream)  # type: ignore[arg-type]
        await stream.aclose()  # type: ignore[attr-defined]
        return delta

    delta = asyncio.run(first())
    assert delta.token_ids == (2, 3)
    assert router.aborted == ["r1"] and backend.sessions.open["s"].running == 0


def test_events_are_built_from_their_kind_and_refusals_are_409() -> None:
    backend, _, scheduler, tracker = scripted([("done", 1)])
    asyncio.run(collect(backend=backend, rid="r1", prompt=(1,), n=2, session="s"))
    out = asyncio.run(backend.event("gpus-added", {"gpus": [8, 9]}))
    assert out == {"kind": "gpus-added", "seq": 1} and scheduler.seen == [ev.GpusAdded(gpus=(8, 9))]
    for kind, body, match in [
        ("gpus-stolen", {}, "unknown event kind"),
        ("gpus-added", {"gpus": "eight"}, "Expected `array`"),
        ("training-begin", {"step": -1}, "step"),
        ("gpus-added", {"kind": "training-begin", "gpus": [1]}, "another kind"),
    ]:
        with pytest.raises(GatewayError, match=match) as e:
            asyncio.run(backend.event(kind, body))
        assert e.value.status == 400
    with pytest.raises(GatewayError, match="GPU 99") as e:
        asyncio.run(backend.event("gpus-reclaimed", {"gpus": [99]}))
    assert e.value.status == 409
    assert tracker.steps == []
    # The Orchestrator tells its listeners each change: step 1 begins, a boundary, "s" ends.
    begun = TableSnapshot(phase=TrainingPhase.TRAINING, training_step=1)
    for _ in range(2):  # told again (another change during the step): still one boundary
        backend.directory.tell(names.GATEWAY, StateChanged(view=ClusterView(table=begun)))
    assert len(tracker.steps) == 1 and tracker.steps[0].trajectories[0].turns == 1


def test_model_id_and_chat_template_come_from_the_config_and_model_directory(tmp_path: Any) -> None:
    assert served_model(config.load(None, [])) == "tiny"
    assert served_model(config.load(None, ["gateway.model=my-model"])) == "my-model"
    templates = [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": templates}))
    assert load_chat_template(tmp_path) == "D"
    assert load_chat_template(tmp_path / "nowhere") is None


def test_the_tokenizer_is_the_served_models(tmp_path: Path) -> None:
    """The gateway and the prompt builder tokenize with what the workers serve: a vLLM
    server's tokenizer or model directory, an SGLang server's model, else the torch preset's."""
    model, tok = tmp_path / "model", tmp_path / "tok"
    model.mkdir(), tok.mkdir()
    assert model_dir(config.load(None, [])) is None  # the tiny preset: byte-level
    vllm = ["engine.kind=vllm", f"engine.vllm.model_path={model}"]
    assert model_dir(config.load(None, vllm)) == model
    assert model_dir(config.load(None, [*vllm, f"engine.vllm.tokenizer={tok}"])) == tok
    sglang = ["engine.kind=sglang", f"engine.sglang.model_path={model}"]
    assert model_dir(config.load(None, sglang)) == model
    assert (
        model_dir(config.load(None, ["engine.kind=sglang", "engine.sglang.model_path=sim"])) is None
    )
    assert model_dir(config.load(None, [f"engine.torch.preset={model}"])) == model


# -- on a Runtime of sim engines ---------------------------------------------------------------

SETS = (
    "engine.kind=sim",
    "engine.sim.time_scale=0.5",  # a turn takes a few hundred ms: events land mid-turn
    "engine.sim.start_s=1",
    "rl.env=",  # gateway-only traffic: no rollout pipeline
    "daemon.borrow=always",  # the training GPUs are lent between steps and come back
    "daemon.pd=colocated",  # a turn's worker is the one that generated it
    "daemon.tick_s=0.1",
    "daemon.heartbeat_s=0.5",
    "workload.max_trajectory_tokens=4096",
)
AGENTS, TURNS, NEW = 10, 3, 64


def routable(rt: Any) -> list[Any]:
    return [w for w in rt.status().workers if w.activity == "active" and w.role != "training"]


class Agents:
    """``AGENTS`` clients, each running sessions of ``TURNS`` turns back to back until stopped,
    on an event loop of their own; every request's deltas are checked as they come."""

    def __init__(self, backend: PoolBackend) -> None:
        self.backend, self.stop = backend, threading.Event()
        self.started = self.completed = self.migrations = self.recomputed = 0
        self.failures: list[str] = []
        self.sessions: list[str] = []
        self.ids = itertools.count(1)
        self.thread = threading.Thread(target=lambda: asyncio.run(self.run(AGENTS, True)))

    async def session(self, name: str, rng: random.Random) -> None:
        prompt = [rng.randrange(256) for _ in range(40)]
        for _ in range(TURNS):
            self.started += 1
            rid = f"{name}#{next(self.ids)}"
            try:
                deltas = [d async for d in self.backend.generate(rid, prompt, Sampling(NEW), name)]
            except GatewayError as e:
                self.failures.append(f"{rid}: {e.message}")
                return
            ids = [i for d in deltas for i in d.token_ids]
            ends = [d.finish_reason for d in deltas if d.finish_reason]
            if ends != [deltas[-1].finish_reason] or not 0 < len(ids) <= NEW:
                self.failures.append(f"{rid}: {len(ids)} tokens, finish {ends}")
            self.completed += 1
            self.migrations += sum(d.migrations for d in deltas)
            self.recomputed += sum(d.recomputed_tokens for d in deltas)
            # the environment's turn (a tool call): the gap the sessions measure
            await asyncio.sleep(rng.uniform(0.01, 0.05))
            prompt = [*prompt, *ids, *(rng.randrange(256) for _ in range(16))]

    async def run(self, agents: int, until_stopped: bool) -> None:
        async def agent(i: int) -> None:
            rng = random.Random(i)
            n = 0
            while True:
                name = f"a{i}-{n}" if until_stopped else f"steady-{i}"
                self.sessions.append(name)
                await self.session(name, rng)
                n += 1
                if not until_stopped or self.stop.is_set():
                    return

        await asyncio.gather(*(agent(i) for i in range(agents)))


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[Any]:
    with local_runtime(tmp_path, SETS) as rt:
        yield rt


@pytest.mark.slow
def test_every_request_completes_while_the_pool_changes_under_it(
    runtime: Any, tmp_path: Path
) -> None:
    rt = runtime
    wait_until(lambda: routable(rt), 60, "a worker serving", every=0.1)
    backend = PoolBackend(rt.daemon.directory, rt.cfg, sessions_per_step=6)
    router = rt.daemon.directory.get(names.ROUTER).ref.proxy()
    agents = Agents(backend)
    agents.thread.start()
    try:
        asyncio.run(backend.event("gpus-added", {"gpus": [3, 4]}))
        wait_until(lambda: len(routable(rt)) >= 3, 60, "the added workers serving", every=0.1)

        # the added GPUs are reclaimed while one has turns in flight: they move, with prefixes
        def busy() -> bool:
            on = {w for p in router.pending.get().values() for w in p.workers}
            return any(set(w.gpus) & {3, 4} and w.id in on for w in routable(rt))

        wait_until(busy, 60, "an added worker with turns in flight", every=0.01)
        asyncio.run(backend.event("gpus-reclaimed", {"gpus": [3, 4]}))
        wait_until(lambda: agents.migrations, 60, "a migrated request", every=0.05)

        for step in (1, 2):  # the trainer's steps: lent GPUs come back at each begin
            out = asyncio.run(backend.event("training-begin", {"step": step}))
            assert rt.status().training_may_proceed >= step and out["may_proceed_s"] >= 0
            if step == 1:
                asyncio.run(backend.event("training-finished", {"step": step}))
        agents.stop.set()
        agents.thread.join(120)
        assert not agents.thread.is_alive()

        # steady state: the preemptible GPUs are back, no event meanwhile, two sessions per
        # worker; each session stays on its worker
        asyncio.run(backend.event("gpus-added", {"gpus": [3, 4]}))
        wait_until(lambda: len(routable(rt)) >= 3, 60, "the added workers serving", every=0.1)
        steady = Agents(backend)
        n = len(routable(rt))
        asyncio.run(steady.run(2 * n, until_stopped=False))
        homes = {s: set(backend.sessions.open[s].workers) for s in steady.sessions}
        asyncio.run(backend.event("training-finished", {"step": 2}))
        final = rt.status()
        via = asyncio.run(backend.status())  # pearl status --json, as the gateway serves it
    finally:
        agents.stop.set()
        agents.thread.join(120)
        backend.close()

    assert agents.failures == [] and steady.failures == []
    assert agents.completed == agents.started > AGENTS * TURNS
    assert agents.migrations > 0 and agents.recomputed > 0
    assert agents.migrations + steady.migrations == backend.client.migrated
    assert len(homes) >= 6 and all(len(h) == 1 for h in homes.values()), homes

    # the tracker got the sessions' measured turns: one telemetry record per rollout step
    stepped = backend.sessions.stepped
    rt.stop()
    with FileLog(tmp_path / "state" / "log", readonly=True) as log:
        records = [r for _, r in log.read()]
        table = log.load(final.seq).state.to_json()
    telemetry = [r for r in records if isinstance(r, ev.Telemetry)]
    assert stepped >= 2 and len(telemetry) == stepped
    # sessions ended at a boundary between their turns count the turns they had
    assert max(t.S for t in telemetry) == TURNS and all(1 <= t.S <= TURNS for t in telemetry)
    assert all(0 < t.r <= NEW and (t.T_env > 0) == (t.S > 1) for t in telemetry), telemetry
    assert (table["seq"], table["workers"]) == (final.seq, status_plain(final)["workers"])
    assert via.keys() == status_plain(final).keys() and via["seq"] >= final.seq


class Orchestrator:
    """Answers status with its ``workers`` (role, activity) and ``training_step``."""

    name = names.ORCHESTRATOR

    def __init__(self) -> None:
        self.workers: list[Any] = []
        self.training_step = 4
        self.asked = 0
        self.seq = 0

    def tell(self, msg: Any) -> None:
        self.ask(msg)

    def ask(self, msg: Any, timeout_s: float = 10.0) -> Any:
        self.asked += 1
        return SimpleNamespace(
            workers=list(self.workers), training_step=self.training_step, seq=self.seq
        )


def row(role: str, activity: str) -> Any:
    return SimpleNamespace(role=role, activity=activity)


def test_serving_says_why_no_worker_serves_and_reads_the_tables_changes() -> None:
    """/health's answer: from the Orchestrator's status until a change is heard, then from the
    changes alone while a worker is routable."""
    backend, *_ = scripted([])
    orch = Orchestrator()
    backend.directory.register(orch)  # type: ignore[arg-type]
    assert asyncio.run(backend.serving()) == (
        "the pool has no rollout worker (no GPUs for rollout yet)"
    )
    orch.workers = [row("training", "active"), row("colocated", "transitioning"),
                    row("colocated", "transitioning"), row("decode", "inactive")]  # fmt: skip
    why = asyncio.run(backend.serving())
    assert why == "no rollout worker is active yet (1 inactive, 2 transitioning)"
    orch.workers[1] = row("colocated", "active")
    assert asyncio.run(backend.serving()) is None
    asked = orch.asked
    for _ in range(3):  # a worker serves: answered without asking
        assert asyncio.run(backend.serving()) is None
    assert orch.asked == asked
    changed = StateChanged(view=ClusterView(table=TableSnapshot(seq=3)))
    backend.directory.tell(names.GATEWAY, changed)
    # The change said no worker is routable: ask why; a status older than it changes nothing.
    orch.workers[1] = row("colocated", "transitioning")
    why = asyncio.run(backend.serving())
    assert why == "no rollout worker is active yet (1 inactive, 2 transitioning)"
    assert orch.asked == asked + 1 and backend._routable == 0


def test_a_training_event_without_a_step_takes_the_one_pearl_event_sends() -> None:
    backend, _, scheduler, _ = scripted([])
    backend.directory.register(Orchestrator())  # type: ignore[arg-type]
    asyncio.run(backend.event("training-begin", {}, wait=False))  # a scripted status: no wait
    asyncio.run(backend.event("training-finished", {"weights_version": 4}))
    asyncio.run(backend.event("training-begin", {"step": 9}, wait=False))
    assert scheduler.seen == [
        ev.TrainingBegin(step=5), ev.TrainingFinished(step=4, weights_version=4),
        ev.TrainingBegin(step=9),
    ]  # fmt: skip
