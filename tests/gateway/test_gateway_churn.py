"""The `openai` SDK through pearld's gateway while the pool changes under it: agents stream
multi-turn sessions (sync and async clients) while preemptible GPUs join and are reclaimed with
turns in flight, and a borrow cycle lends and returns the training GPUs, every event sent over
the gateway's own ``/pearl/v1`` routes. No request fails, each stream's token ids are whole, and
the status the gateway serves equals the replay of the log."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

import pearl
from actors import names
from pearl.core.status import status_plain
from pearl.gateway.app import PROCESS_HEADER
from pearl.log import FileLog
from pearl.runtime import wait_training_may_proceed
from pearl.testing.wait import poll, wait_until
from tests.gateway.test_pool import SETS, routable

openai = pytest.importorskip("openai")

ROOT = Path(__file__).resolve().parents[2]
AGENTS, TURNS, NEW = 8, 3, 48
MODEL = "pearl-sim"


class Agents:
    """Async agents on an event loop of their own, each with a client (and connections) of its
    own, streaming every turn, until stopped. ``processes`` counts the gateway processes that
    answered (``X-PEARL-Gateway-Process``; "" from pearld's own gateway)."""

    def __init__(self, url: str, count: int = AGENTS) -> None:
        self.url, self.count, self.stop = url, count, threading.Event()
        self.completed = self.migrations = 0
        self.processes: Counter[str] = Counter()
        self.failures: list[str] = []
        self.thread = threading.Thread(target=lambda: asyncio.run(self.run()))

    async def turn(self, client: Any, session: str, messages: list[dict[str, str]]) -> str:
        raw = await client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=messages,
            max_tokens=NEW,
            stream=True,
            stream_options={"include_usage": True},
            extra_headers={"X-Session-ID": session},
            extra_body={"return_token_ids": True},
        )
        self.processes[raw.headers.get(PROCESS_HEADER, "")] += 1
        stream = raw.parse()  # the SDK's stream itself, for a streamed response
        ids: list[int] = []
        text, usage = "", None
        async for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            for c in chunk.choices:
                ids += (c.model_extra or {}).get("token_ids") or []
                text += c.delta.content or ""
        assert usage is not None and usage.completion_tokens == len(ids) > 0, (usage, ids)
        self.migrations += (usage.model_extra or {}).get("migrations", 0)
        return text

    async def agent(self, i: int) -> None:
        client = openai.AsyncOpenAI(base_url=self.url, api_key="none", max_retries=0, timeout=120)
        n = 0
        while not self.stop.is_set():
            session, messages = f"agent{i}-{n}", [{"role": "user", "content": f"task {i}.{n}"}]
            for t in range(TURNS):
                try:
                    reply = await self.turn(client, session, messages)
                except Exception as e:  # noqa: BLE001 - every failure is the finding
                    self.failures.append(f"{session} turn {t}: {type(e).__name__}: {e}")
                    return
                self.completed += 1
                messages += [
                    {"role": "assistant", "content": reply},
                    {"role": "user", "content": f"tool output {t}"},
                ]
            n += 1
        await client.close()

    async def run(self) -> None:
        await asyncio.gather(*(self.agent(i) for i in range(self.count)))


def control(url: str) -> Callable[..., None]:
    """``event(kind, **fields)``: POST the elastic event to the gateway's ``/pearl/v1/events``
    (``url`` is its ``/v1`` base); asserts it was logged."""
    client = httpx.Client(base_url=f"{url.removesuffix('/v1')}/pearl/v1", timeout=60)

    def event(kind: str, **body: Any) -> None:
        r = client.post(f"/events/{kind}", json=body)
        assert r.status_code == 200, (kind, r.status_code, r.text)

    return event


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_openai_agents_stream_through_joins_reclaims_and_a_borrow_cycle(tmp_path: Path) -> None:
    rt = pearl.Runtime.from_config(
        ROOT / "configs" / "local-cpu.toml",
        state_dir=tmp_path / "state",
        overrides=(*SETS, "gateway.listen=127.0.0.1:0", f"gateway.model={MODEL}"),
    )
    rt.start()
    agents: Agents | None = None
    try:
        url = rt.gateway_url
        assert url is not None
        event = control(url)
        wait_until(lambda: routable(rt), 60, "a worker serving", every=0.1)
        agents = Agents(url)
        agents.thread.start()
        sync = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=120)
        router = rt.daemon.directory.get(names.ROUTER).ref.proxy()

        def busy() -> bool:  # an added worker holds turns: the reclaim moves them
            on = {w for p in router.pending.get().values() for w in p.workers}
            return any(set(w.gpus) & {3, 4} and w.id in on for w in routable(rt))

        # Join and reclaim until a reclaim caught a stream mid-turn: a turn seen on a joiner may
        # still end before the reclaim lands (the migration is reported with the stream's end).
        for _ in range(5):
            event("gpus-added", gpus=[3, 4])
            wait_until(lambda: len(routable(rt)) >= 3, 60, "the added workers serving", every=0.1)
            wait_until(busy, 60, "an added worker with turns in flight", every=0.01)
            event("gpus-reclaimed", gpus=[3, 4])
            if poll(lambda: agents.migrations > 0, 30, 0.05):
                break
        # a sync, non-streaming request meanwhile
        out = sync.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=8
        )
        assert out.choices[0].finish_reason in ("stop", "length")
        for step in (1, 2):  # the trainer's steps: the lent GPUs come back at each begin
            event("training-begin", step=step)
            wait_training_may_proceed(rt.status, step, timeout_s=60)
            event("training-finished", step=step)
        wait_until(lambda: agents.completed >= 2 * AGENTS * TURNS, 120, "turns after the churn")
        agents.stop.set()
        agents.thread.join(180)
        assert not agents.thread.is_alive()
        served = httpx.get(f"{url.removesuffix('/v1')}/pearl/v1/status", timeout=60).json()
        final = rt.status()
    finally:
        if agents is not None:
            agents.stop.set()
            agents.thread.join(180)
        rt.stop()

    assert agents.failures == []
    assert agents.migrations > 0  # the reclaim moved streams, and they kept flowing
    with FileLog(tmp_path / "state" / "log", readonly=True) as log:
        table = log.load(final.seq).state.to_json()
    assert (table["seq"], table["workers"]) == (final.seq, status_plain(final)["workers"])
    assert served["seq"] <= final.seq and served.keys() == status_plain(final).keys()
