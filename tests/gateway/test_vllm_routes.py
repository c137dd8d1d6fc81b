"""Issue 43 item 6: vLLM's routes and shapes. ``/health`` (200 once a worker serves, 503 with
why before), ``/ping``, ``/version`` (no API key, as vLLM; Host and Origin still checked),
``/tokenize`` and ``/detokenize``, 404 ``model_not_found``, and completions with a list of
prompts (one choice per prompt, usage summed)."""

from __future__ import annotations

import asyncio

import pytest
from fastapi.testclient import TestClient

import pearl
from pearl.gateway.app import build_app
from pearl.gateway.fields import IGNORED_HEADER
from tests.gateway.conftest import sse
from tests.gateway.scripted import EOS, ScriptedBackend, ScriptedTokenizer

MODEL = "scripted-model"
TOK = ScriptedTokenizer()
HI = [{"role": "user", "content": "Hi"}]
CHATML_HI = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def test_health_is_200_once_a_worker_serves_and_503_with_why_before(
    client: TestClient, backend: ScriptedBackend
) -> None:
    backend.not_serving = "no rollout worker is active yet (2 transitioning)"
    for method, path in [("GET", "/health"), ("GET", "/ping"), ("POST", "/ping")]:
        r = client.request(method, path)
        assert r.status_code == 503, (path, r.text)
        assert "2 transitioning" in r.json()["error"]["message"]
        assert r.headers["retry-after"] == "1"
    backend.not_serving = None
    for method, path in [("GET", "/health"), ("GET", "/ping"), ("POST", "/ping")]:
        r = client.request(method, path)
        assert r.status_code == 200 and r.content == b"", (path, r.text)
    assert client.get("/version").json() == {"version": pearl.__version__}


def test_a_backend_that_cannot_answer_is_unhealthy(backend: ScriptedBackend) -> None:
    async def broken() -> str | None:
        raise RuntimeError("orchestrator gone")

    backend.serving = broken  # type: ignore[method-assign]
    with TestClient(build_app(backend)) as c:
        r = c.get("/health")
    assert r.status_code == 503 and "orchestrator gone" in r.json()["error"]["message"]


def test_health_routes_need_no_key_but_obey_host_and_origin(backend: ScriptedBackend) -> None:
    with TestClient(build_app(backend, api_key="s3cret")) as c:
        for path in ("/health", "/ping", "/version"):
            assert c.get(path).status_code == 200, path
        assert c.post("/ping").status_code == 200
        for path in ("/tokenize", "/detokenize"):  # the other routes keep the key
            assert c.post(path, json={}).status_code == 401
        assert c.get("/v1/models").status_code == 401
        assert c.get("/health", headers={"Origin": "https://evil.example"}).status_code == 403
    app = build_app(backend)

    async def call(host: bytes) -> int:
        sent: list[dict] = []

        async def receive() -> dict:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(msg: dict) -> None:
            sent.append(msg)

        scope = {"type": "http", "method": "GET", "path": "/health", "raw_path": b"/health",
                 "query_string": b"", "headers": [(b"host", host)], "http_version": "1.1",
                 "scheme": "http", "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 5),
                 "root_path": ""}  # fmt: skip
        await app(scope, receive, send)
        return int(sent[0]["status"])

    assert asyncio.run(call(b"127.0.0.1:8000")) == 200
    assert asyncio.run(call(b"rebound.example:8000")) == 421


def test_an_unknown_model_is_404_model_not_found(client: TestClient) -> None:
    for path, body in [
        ("/v1/chat/completions", {"model": "gpt-4", "messages": HI}),
        ("/v1/completions", {"model": "gpt-4", "prompt": "x"}),
        ("/tokenize", {"model": "gpt-4", "prompt": "x"}),
        ("/detokenize", {"model": "gpt-4", "tokens": [1]}),
    ]:
        r = client.post(path, json=body)
        assert r.status_code == 404, (path, r.text)
        err = r.json()["error"]
        assert err["code"] == "model_not_found" and err["param"] == "model"
        assert "'gpt-4' does not exist" in err["message"]
    r = client.get("/v1/models/gpt-4")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def test_tokenize_a_prompt_and_a_chat_in_vllms_shape(client: TestClient) -> None:
    r = client.post("/tokenize", json={"model": MODEL, "prompt": "Hi!"})
    assert r.json() == {"count": 3, "max_model_len": 4096, "tokens": TOK.encode("Hi!")}
    r = client.post("/tokenize", json={"prompt": "Hé", "return_token_strs": True,
                                       "add_special_tokens": True})  # fmt: skip
    assert r.json()["tokens"] == TOK.encode("Hé") and len(r.json()["token_strs"]) == 3
    r = client.post("/tokenize", json={"messages": HI})
    assert r.json()["tokens"] == TOK.encode(CHATML_HI)  # as chat renders it for the model
    assert r.json()["count"] == len(CHATML_HI)
    r = client.post("/tokenize", json={"messages": HI, "add_generation_prompt": False})
    assert r.json()["tokens"] == TOK.encode("<|im_start|>user\nHi<|im_end|>\n")
    r = client.post("/tokenize", json={"messages": HI, "continue_final_message": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "continue_final_message"
    r = client.post("/tokenize", json={"prompt": "x", "cache_salt": "s"})
    assert r.status_code == 200 and r.headers[IGNORED_HEADER] == "cache_salt"
    assert client.post("/tokenize", json={}).status_code == 400


def test_a_chat_tokenized_is_the_prompt_chat_sends(
    client: TestClient, backend: ScriptedBackend
) -> None:
    tools = [{"type": "function", "function": {"name": "add", "parameters": {}}}]
    body = {"messages": HI, "tools": tools, "chat_template_kwargs": {"enable_thinking": False}}
    tokens = client.post("/tokenize", json=body).json()["tokens"]
    r = client.post("/v1/chat/completions", json={"model": MODEL, **body})
    assert r.status_code == 200
    assert backend.calls[0].prompt_ids == tokens


def test_detokenize_in_vllms_shape(client: TestClient) -> None:
    r = client.post("/detokenize", json={"model": MODEL, "tokens": TOK.encode("Hello")})
    assert r.json() == {"prompt": "Hello"}
    r = client.post("/detokenize", json={"tokens": [1, 999]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tokens"


def test_completions_take_a_list_of_prompts_one_choice_each(
    client: TestClient, backend: ScriptedBackend
) -> None:
    backend.replies = ["one", "two", "three"]
    body = {"model": MODEL, "prompt": ["a", "bb", "cde"], "max_tokens": 10,
            "return_token_ids": True, "logprobs": 0}  # fmt: skip
    r = client.post("/v1/completions", json={**body, "prompt": [[97], [98, 98], [99, 100, 101]]})
    assert [c["index"] for c in r.json()["choices"]] == [0, 1, 2]
    backend.calls.clear()
    r = client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert [c["index"] for c in out["choices"]] == [0, 1, 2]
    prompts = sorted(tuple(c.prompt_ids) for c in backend.calls)
    assert prompts == sorted([(97,), (98, 98), (99, 100, 101)])
    by_prompt = {tuple(c.prompt_ids): c for c in backend.calls}
    assert len({c.rid for c in backend.calls}) == 3
    for choice in out["choices"]:
        assert tuple(choice["prompt_token_ids"]) in by_prompt
        assert choice["token_ids"] == [*TOK.encode(choice["text"]), EOS]
        assert len(choice["logprobs"]["tokens"]) == len(choice["token_ids"])
    assert out["prompt_token_ids"] is None  # one per choice
    generated = sum(len(c["token_ids"]) for c in out["choices"])
    assert out["usage"]["prompt_tokens"] == 6 and out["usage"]["completion_tokens"] == generated
    assert out["usage"]["total_tokens"] == 6 + generated


def test_completions_stream_a_list_of_prompts_by_index(
    client: TestClient, backend: ScriptedBackend
) -> None:
    backend.replies = ["first reply", "second reply"]
    backend.chunk = 3
    body = {"model": MODEL, "prompt": ["a", "b"], "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    events = sse(client.post("/v1/completions", json=body).text)
    assert events[-1] == "[DONE]"
    *chunks, usage = events[:-1]
    texts: dict[int, str] = {0: "", 1: ""}
    finishes = {}
    for c in chunks:
        (choice,) = c["choices"]
        texts[choice["index"]] += choice["text"]
        if choice["finish_reason"]:
            finishes[choice["index"]] = choice["finish_reason"]
    assert sorted(texts.values()) == ["first reply", "second reply"]
    assert finishes == {0: "stop", 1: "stop"}
    assert usage["choices"] == [] and usage["usage"]["prompt_tokens"] == 2
    assert usage["usage"]["completion_tokens"] == len("first reply") + len("second reply") + 2


def test_a_list_of_prompts_fails_as_one_and_aborts_the_rest(backend: ScriptedBackend) -> None:
    backend.fail_after = 1
    with TestClient(build_app(backend)) as c:
        r = c.post("/v1/completions", json={"model": MODEL, "prompt": ["abcdefgh", "ijklmnop"]})
    assert r.status_code == 503 and "pool gave up" in r.text
    assert sorted(backend.closed) == sorted(call.rid for call in backend.calls)


@pytest.mark.parametrize(
    ("prompt", "param"),
    [(["a", ""], "prompt.1"), ([[1], [999]], "prompt.1"), (["x"] * 257, "prompt")],
)
def test_a_bad_prompt_in_a_list_is_named(client: TestClient, prompt: list, param: str) -> None:
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": prompt})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
