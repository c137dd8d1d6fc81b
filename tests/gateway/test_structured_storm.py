"""Structured outputs through a migration storm: 200 constrained requests (``response_format``
json_schema and ``tool_choice="required"``) through the ``openai`` client, against the torch
engine with random weights, while preemptible workers join and are reclaimed with requests in
flight and a borrow cycle lends and returns the trainer's GPUs. None fails, every output parses
into its schema or tool call, and at least one request migrated (``usage.migrations``): a moved
request finishes under its grammar from the state its kept prefix leaves."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import BaseModel, Field

from actors import names
from pearl.runtime import wait_training_may_proceed
from pearl.testing.wait import wait_until
from tests.gateway.conftest import local_runtime
from tests.gateway.test_pool import routable

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.slow
MODEL = "tiny"
REQUESTS, CONCURRENT, NEW = 200, 8, 128  # NEW: a ceiling; the grammar ends each output
SETS = (
    "rl.env=",  # gateway-only traffic: no rollout pipeline
    "daemon.borrow=always",  # the training GPUs are lent between steps and come back
    "daemon.pd=colocated",
    "daemon.tick_s=0.1",
    "daemon.heartbeat_s=0.5",
    "workload.max_trajectory_tokens=2048",
    "gateway.listen=127.0.0.1:0",
    f"gateway.model={MODEL}",
)


class City(BaseModel):  # short enough to finish in NEW byte-level tokens, wrapped as a tool call
    name: str = Field(pattern="^[a-z]{1,6}$")
    population: int = Field(ge=0, le=9999)
    capital: bool


SCHEMA = {
    "type": "json_schema",
    "json_schema": {"name": "city", "schema": City.model_json_schema()},
}
TOOLS = [{"type": "function",
          "function": {"name": "record_city", "parameters": City.model_json_schema()}}]  # fmt: skip


class Storm:
    """``CONCURRENT`` clients sending ``REQUESTS`` structured requests in all, on a loop of their
    own; even requests ask for json_schema content, odd ones for a required tool call."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.sent = self.completed = self.migrations = 0
        self.failures: list[str] = []
        self.thread = threading.Thread(target=lambda: asyncio.run(self.run()))

    async def one(self, client: Any, i: int) -> None:
        messages = [{"role": "user", "content": f"city {i}, please"}]
        kw: dict[str, Any] = (
            {"response_format": SCHEMA} if i % 2 == 0 else
            {"tools": TOOLS, "tool_choice": "required"}
        )  # fmt: skip
        r = await client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=NEW, **kw
        )
        msg = r.choices[0].message
        if i % 2 == 0:
            City.model_validate_json(msg.content)
        else:
            (call,) = msg.tool_calls
            assert call.function.name == "record_city", call
            City.model_validate(json.loads(call.function.arguments))
        self.migrations += (r.usage.model_extra or {}).get("migrations", 0)

    async def client(self) -> None:
        client = openai.AsyncOpenAI(base_url=self.url, api_key="none", max_retries=0, timeout=120)
        while self.sent < REQUESTS:
            i, self.sent = self.sent, self.sent + 1
            try:
                await self.one(client, i)
            except Exception as e:  # noqa: BLE001 - every failure is the finding
                self.failures.append(f"request {i}: {type(e).__name__}: {e}")
            self.completed += 1
        await client.close()

    async def run(self) -> None:
        await asyncio.gather(*(self.client() for _ in range(CONCURRENT)))


@pytest.mark.timeout(300)
def test_200_structured_requests_parse_through_reclaims_and_a_borrow_cycle(
    tmp_path: Path,
) -> None:
    with local_runtime(tmp_path, SETS) as rt:
        url = rt.gateway_url
        assert url is not None
        control = httpx.Client(base_url=f"{url.removesuffix('/v1')}/pearl/v1", timeout=60)

        def event(kind: str, **body: Any) -> None:
            r = control.post(f"/events/{kind}", json=body)
            assert r.status_code == 200, (kind, r.status_code, r.text)

        wait_until(lambda: routable(rt), 120, "a torch worker serving", every=0.1)
        router = rt.daemon.directory.get(names.ROUTER).ref.proxy()
        storm = Storm(url)
        storm.thread.start()
        try:
            for gpus in ([3, 4], [5]):  # two waves: each reclaim catches requests mid-decode
                event("gpus-added", gpus=gpus)

                def busy(gpus: list[int] = gpus) -> bool:  # a joiner holds requests
                    on = {w for p in router.pending.get().values() for w in p.workers}
                    return any(set(w.gpus) & set(gpus) and w.id in on for w in routable(rt))

                wait_until(busy, 120, f"a worker on {gpus} with requests in flight", every=0.01)
                event("gpus-reclaimed", gpus=gpus)
            for step in (1, 2):  # the trainer's steps: the lent GPUs come back at each begin
                event("training-begin", step=step)
                wait_training_may_proceed(rt.status, step, timeout_s=60)
                event("training-finished", step=step)
        finally:
            storm.thread.join(240)
        control.close()

    assert not storm.thread.is_alive()
    assert storm.failures == []
    assert storm.completed == REQUESTS
    assert storm.migrations > 0  # the reclaims moved constrained requests, which still parse
