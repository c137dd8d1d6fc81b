"""Real clients against the gateway served by uvicorn: the `openai` SDK (sync, async, streaming)
and httpx for the stream bound."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator

import httpx
import openai
import pytest

from pearl.gateway.app import build_app
from pearl.testing.wait import wait_until
from tests.gateway.scripted import EOS, ScriptedBackend, ScriptedTokenizer
from tests.gateway.serving import serve

MODEL = "scripted-model"
KEY = "test-key"
TOK = ScriptedTokenizer()
HI = [{"role": "user", "content": "Hi"}]
ADD = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": ADD}}]


@pytest.fixture
def backend() -> ScriptedBackend:
    return ScriptedBackend()


@pytest.fixture
def base_url(backend: ScriptedBackend) -> Iterator[str]:
    with serve(build_app(backend, api_key=KEY)) as url:
        yield url


def sync_client(base_url: str, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key=key, max_retries=0, timeout=30)


def test_openai_sync_chat_completions_models_and_token_ids(
    base_url: str, backend: ScriptedBackend
) -> None:
    with sync_client(base_url) as client:
        assert [m.id for m in client.models.list()] == [MODEL]
        r = client.chat.completions.create(
            model=MODEL, messages=HI, max_tokens=64, logprobs=True,
            extra_body={"return_token_ids": True}, extra_headers={"X-Session-ID": "agent-7"},
        )  # fmt: skip
        choice = r.choices[0]
        assert choice.message.content == "Hello, world!" and choice.finish_reason == "stop"
        extra = choice.model_extra or {}
        assert extra["token_ids"] == [*TOK.encode("Hello, world!"), EOS]
        assert extra["weight_versions"] == [[0, 7], [5, 8]] and extra["weight_version"] == 8
        assert (r.model_extra or {})["prompt_token_ids"] == backend.calls[0].prompt_ids
        assert choice.logprobs is not None and choice.logprobs.content is not None
        assert [t.token for t in choice.logprobs.content][:5] == list("Hello")
        assert r.usage is not None and r.usage.completion_tokens == 14
        assert backend.calls[0].session == "agent-7"

        c = client.completions.create(model=MODEL, prompt=[1, 2, 3], max_tokens=5)
        assert (c.choices[0].text, c.choices[0].finish_reason) == ("Hello", "length")
        assert backend.calls[1].prompt_ids == [1, 2, 3]


def test_openai_sync_tool_calls(base_url: str, backend: ScriptedBackend) -> None:
    backend.replies = ['<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>',
                       "It is 5."]  # fmt: skip
    with sync_client(base_url) as client:
        messages: list = [{"role": "user", "content": "2+3?"}]
        r = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS)
        assert r.choices[0].finish_reason == "tool_calls"
        (call,) = r.choices[0].message.tool_calls or []
        assert call.function.name == "add" and json.loads(call.function.arguments) == {
            "a": 2,
            "b": 3,
        }
        messages += [r.choices[0].message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": "5"}]  # fmt: skip
        r = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS)
        assert r.choices[0].message.content == "It is 5." and not r.choices[0].message.tool_calls
    second = TOK.decode(backend.calls[1].prompt_ids)
    assert '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>' in second
    assert "<tool_response>\n5\n</tool_response>" in second


def test_openai_sync_streaming(base_url: str) -> None:
    with sync_client(base_url) as client:
        stream = client.chat.completions.create(
            model=MODEL, messages=HI, stream=True,
            stream_options={"include_usage": True},
        )  # fmt: skip
        chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Hello, world!"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 14


def test_openai_async_concurrent_and_streaming(base_url: str, backend: ScriptedBackend) -> None:
    async def main() -> tuple[list[str], str]:
        async with openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key=KEY, max_retries=0,
                                      timeout=30) as client:  # fmt: skip

            async def one(k: int) -> str:
                r = await client.chat.completions.create(model=MODEL, messages=HI, user=f"u{k}")
                return r.choices[0].message.content or ""

            texts = await asyncio.gather(*(one(k) for k in range(8)))
            stream = await client.completions.create(model=MODEL, prompt="Say", stream=True)
            streamed = "".join([c.choices[0].text async for c in stream if c.choices])
            return list(texts), streamed

    texts, streamed = asyncio.run(main())
    assert texts == ["Hello, world!"] * 8 and streamed == "Hello, world!"
    assert sorted(c.session for c in backend.calls[:8]) == sorted(f"u{k}" for k in range(8))


def test_openai_errors_are_typed(base_url: str, backend: ScriptedBackend) -> None:
    with sync_client(base_url, key="wrong") as client, pytest.raises(openai.AuthenticationError):
        client.models.list()
    with sync_client(base_url) as client:
        with pytest.raises(openai.NotFoundError, match="the model 'gpt-4o' does not exist"):
            client.chat.completions.create(model="gpt-4o", messages=HI)
        with pytest.raises(openai.BadRequestError, match="n must be an integer"):
            client.chat.completions.create(model=MODEL, messages=HI, n=0)
        backend.fail_after = 1
        backend.failure = RuntimeError("kaput")
        with pytest.raises(openai.InternalServerError, match="kaput"):
            client.chat.completions.create(model=MODEL, messages=HI)
        backend.fail_after = None
        r = client.chat.completions.create(model=MODEL, messages=HI)
        assert r.choices[0].message.content == "Hello, world!"


def test_requests_beyond_the_bound_get_429_streamed_or_not_and_slots_come_back() -> None:
    gate = threading.Event()
    backend = ScriptedBackend(gate=gate)
    body = {"model": MODEL, "messages": HI, "stream": True}
    with serve(build_app(backend, max_streams=1)) as url, httpx.Client(base_url=url) as http:
        # A stream held open (the backend waits on the gate after its first delta) fills the
        # bound; the client then leaves, and the slot and the backend's generator are freed.
        with http.stream("POST", "/v1/chat/completions", json=body) as held:
            assert held.status_code == 200
            lines = held.iter_lines()  # kept: a dropped iterator closes the stream
            assert next(lines).startswith("data: ")
            r = http.post("/v1/chat/completions", json=body)
            assert r.status_code == 429 and "limit 1" in r.json()["error"]["message"]
            assert r.json()["error"]["type"] == "rate_limit_error"
            assert r.headers["retry-after"] == "1"
            # A request that does not stream is bounded the same way.
            r = http.post("/v1/completions", json={"model": MODEL, "prompt": "hi"})
            assert r.status_code == 429 and r.headers["retry-after"] == "1"
            assert http.get("/v1/models").status_code == 200  # only generation is counted
            assert len(backend.calls) == 1
        wait_until(lambda: backend.calls[0].rid in backend.closed, 10, "the left stream to close")
        gate.set()
        r = http.post("/v1/chat/completions", json=body)
        assert r.status_code == 200 and r.text.endswith("data: [DONE]\n\n")
        r = http.post("/generate", json={"input_ids": [1], "stream": True})
        assert r.status_code == 200 and r.text.endswith("data: [DONE]\n\n")
