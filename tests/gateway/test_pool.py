"""PoolBackend: the gateway's backend over the elastic pool.

First on a scripted Router (streams across a migration, a failure, events in and out), then on a
Runtime of sim engines while GPUs come and go and a training step happens."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from actors import names
from actors.base import Directory
from actors.messages import RolloutStep
from pearl import config
from pearl.core import events as ev
from pearl.core.errors import PearlError
from pearl.gateway.backend import Delta, GatewayError, Sampling
from pearl.gateway.pool import PoolBackend, load_chat_template, served_model
from tests.actors.test_rollout_client import ScriptedRouter


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
    deltas = asyncio.run(collect(backend, "r1", (100, 101), 6, "chat-1"))
    assert [(d.token_ids, d.weight_version, d.finish_reason) for d in deltas] == [
        ((2, 3, 4), 4, None), ((5, 6, 7), 5, "length")
    ]  # fmt: skip
    assert [(d.migrations, d.recomputed_tokens) for d in deltas] == [(0, 0), (1, 5 - 2)]
    assert all(len(d.logprobs) == len(d.token_ids) for d in deltas)
    # the session is the trajectory (the Router's affinity); eos stops it too
    assert {r.trajectory for r in router.seen} == {"chat-1"}
    assert backend.tokenizer.eos_id in router.seen[0].sampling.stop_ids
    assert router.seen[1].input_ids == (100, 101, 2, 3, 4)
    assert tracker.steps == []  # the session is still open: its next turn may come


def test_the_pool_giving_up_fails_the_request_and_its_turn_is_measured() -> None:
    backend, _, _, tracker = scripted([("error",)] * 4)

    with pytest.raises(GatewayError) as e:
        asyncio.run(collect(backend, "r1", (1, 2), 4, ""))
    assert e.value.status == 503 and "worker 1 is gone" in e.value.message
    assert len(tracker.steps) == 1 and tracker.steps[0].trajectories[0].turns == 1


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
    asyncio.run(collect(backend, "r1", (1,), 2, "s"))
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
    asyncio.run(backend.event("training-begin", {"step": 1}))  # a step boundary: "s" ends
    assert len(tracker.steps) == 1 and tracker.steps[0].trajectories[0].turns == 1


def test_model_id_and_chat_template_come_from_the_config_and_model_directory(tmp_path: Any) -> None:
    assert served_model(config.load(None, [])) == "tiny"
    assert served_model(config.load(None, ["gateway.model=my-model"])) == "my-model"
    templates = [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": templates}))
    assert load_chat_template(tmp_path) == "D"
    assert load_chat_template(tmp_path / "nowhere") is None
