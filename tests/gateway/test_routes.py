"""The gateway's routes over a scripted backend, through FastAPI's TestClient."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from pearl.gateway.app import EVENT_KINDS, build_app
from pearl.gateway.backend import GatewayError
from tests.gateway.conftest import sse
from tests.gateway.scripted import EOS, ScriptedBackend, ScriptedTokenizer, logprob_of

MODEL = "scripted-model"
TOK = ScriptedTokenizer()
HI = [{"role": "user", "content": "Hi"}]
CHATML_HI = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def chat(client: TestClient, **body: object) -> dict:
    r = client.post("/v1/chat/completions", json={"model": MODEL, "messages": HI, **body})
    assert r.status_code == 200, r.text
    return r.json()


def test_models_lists_the_backends_one_model(client: TestClient) -> None:
    body = client.get("/v1/models").json()
    assert body["object"] == "list"
    assert [(m["id"], m["object"], m["max_model_len"]) for m in body["data"]] == [
        (MODEL, "model", 4096)
    ]
    assert client.get(f"/v1/models/{MODEL}").json()["id"] == MODEL
    assert client.get("/v1/models/other").status_code == 404


def test_chat_returns_text_token_ids_logprobs_and_weight_versions(
    client: TestClient, backend: ScriptedBackend
) -> None:
    body = chat(client, return_token_ids=True, logprobs=True, max_tokens=50)
    choice = body["choices"][0]
    assert body["object"] == "chat.completion" and body["model"] == MODEL
    assert choice["message"] == {"role": "assistant", "content": "Hello, world!",
                                 "tool_calls": None}  # fmt: skip
    assert choice["finish_reason"] == "stop"
    reply = [*TOK.encode("Hello, world!"), EOS]
    assert choice["token_ids"] == reply
    assert body["prompt_token_ids"] == TOK.encode(CHATML_HI)
    assert backend.calls[0].prompt_ids == TOK.encode(CHATML_HI)
    assert choice["weight_version"] == 8
    assert choice["weight_versions"] == [[0, 7], [5, 8]]
    lps = choice["logprobs"]["content"]
    assert [x["logprob"] for x in lps] == [logprob_of(i) for i in range(len(reply))]
    assert [x["token"] for x in lps[:2]] == ["H", "e"]
    assert lps[0]["bytes"] == [ord("H")]
    assert body["usage"] == {"prompt_tokens": len(CHATML_HI), "completion_tokens": len(reply),
                             "total_tokens": len(CHATML_HI) + len(reply),
                             "recomputed_tokens": 0, "migrations": 0}  # fmt: skip
    sampling = backend.calls[0].sampling
    assert sampling.max_new_tokens == 50 and EOS in sampling.stop_ids


def test_chat_without_extensions_leaves_them_out_and_defaults_max_tokens(
    client: TestClient, backend: ScriptedBackend
) -> None:
    choice = chat(client)["choices"][0]
    assert choice["token_ids"] is None and choice["logprobs"] is None
    assert backend.calls[0].sampling.max_new_tokens == 4096 - len(CHATML_HI)


def test_chat_stops_at_the_limit_with_length(client: TestClient) -> None:
    choice = chat(client, max_tokens=3, return_token_ids=True)["choices"][0]
    assert (choice["message"]["content"], choice["finish_reason"]) == ("Hel", "length")
    assert choice["weight_versions"] == [[0, 7]]


def test_the_session_is_the_header_then_user_then_empty(
    client: TestClient, backend: ScriptedBackend
) -> None:
    body = {"model": MODEL, "messages": HI, "user": "u1"}
    client.post("/v1/chat/completions", json=body, headers={"X-Session-ID": "s1"})
    client.post("/v1/chat/completions", json=body)
    client.post("/v1/chat/completions", json={"model": MODEL, "messages": HI})
    client.post("/generate", json={"input_ids": [1, 2]}, headers={"X-Session-ID": "g"})
    assert [c.session for c in backend.calls] == ["s1", "u1", "", "g"]


def test_chat_stream_chunks_add_up_to_the_response(backend: ScriptedBackend) -> None:
    backend.replies = ["Grüße, 世界!"]  # multi-byte characters split across deltas
    backend.chunk = 3
    with TestClient(build_app(backend)) as client:
        r = client.post(
            "/v1/chat/completions",
            json={"model": MODEL, "messages": HI, "stream": True, "return_token_ids": True,
                  "logprobs": True, "stream_options": {"include_usage": True}},
        )  # fmt: skip
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = sse(r.text)
    assert events[-1] == "[DONE]"
    chunks, usage = events[:-2], events[-2]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[0]["prompt_token_ids"] == TOK.encode(CHATML_HI)
    text = "".join(c["choices"][0]["delta"]["content"] or "" for c in chunks)
    assert text == "Grüße, 世界!" and "\ufffd" not in text
    ids = [i for c in chunks for i in c["choices"][0]["token_ids"] or []]
    assert ids == [*TOK.encode("Grüße, 世界!"), EOS]
    lps = [x["logprob"] for c in chunks if c["choices"][0]["logprobs"]
           for x in c["choices"][0]["logprobs"]["content"]]  # fmt: skip
    assert lps == [logprob_of(i) for i in range(len(ids))]
    versions = [c["choices"][0]["weight_version"] for c in chunks[1:]]
    assert versions[0] == 7 and versions[-1] == 8
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "stop"
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == len(ids)


def test_chat_tool_calls_come_back_as_openai_tool_calls(backend: ScriptedBackend) -> None:
    backend.replies = [
        'Checking.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
        "</tool_call>"
    ]
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    with TestClient(build_app(backend)) as client:
        body = chat(client, tools=tools, return_token_ids=True)
        choice = body["choices"][0]
        assert choice["finish_reason"] == "tool_calls"
        assert choice["message"]["content"] == "Checking."
        (call,) = choice["message"]["tool_calls"]
        assert call["type"] == "function" and call["id"].startswith("call_")
        assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
        # The tokens stay exact: the parsed text is still in token_ids.
        assert TOK.decode(choice["token_ids"]) == backend.replies[0]
        prompt = TOK.decode(backend.calls[0].prompt_ids)
        assert "# Tools" in prompt and '"name": "get_weather"' in prompt

        r = client.post("/v1/chat/completions", json={
            "model": MODEL, "messages": HI, "tools": tools, "stream": True})  # fmt: skip
        chunks = sse(r.text)[:-1]
        content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
        assert content == "Checking."
        calls = [tc for c in chunks for tc in c["choices"][0]["delta"].get("tool_calls") or []]
        assert [(tc["index"], tc["function"]["name"], tc["function"]["arguments"])
                for tc in calls] == [(0, "get_weather", '{"city": "Paris"}')]  # fmt: skip
        assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"

        plain = chat(client, tools=tools, tool_choice="none")["choices"][0]
        assert plain["finish_reason"] == "stop" and plain["message"]["tool_calls"] is None
        assert plain["message"]["content"] == backend.replies[0]


def test_the_backends_chat_template_is_used(backend: ScriptedBackend) -> None:
    backend.chat_template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}#"
    with TestClient(build_app(backend)) as client:
        chat(client)
    assert TOK.decode(backend.calls[0].prompt_ids) == "<user>Hi#"


def test_completions_take_text_or_token_ids(client: TestClient, backend: ScriptedBackend) -> None:
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": "Say", "max_tokens": 20,
                                             "logprobs": 0, "return_token_ids": True})  # fmt: skip
    body = r.json()
    choice = body["choices"][0]
    assert body["object"] == "text_completion"
    assert choice["text"] == "Hello, world!" and choice["finish_reason"] == "stop"
    assert body["prompt_token_ids"] == choice["prompt_token_ids"] == TOK.encode("Say")
    assert choice["token_ids"][-1] == EOS
    lp = choice["logprobs"]
    assert lp["tokens"][:3] == ["H", "e", "l"] and lp["text_offset"][:3] == [0, 1, 2]
    assert lp["token_logprobs"][:2] == [logprob_of(0), logprob_of(1)]
    assert choice["weight_versions"] == [[0, 7], [5, 8]]

    client.post("/v1/completions", json={"model": MODEL, "prompt": [5, 6, 7]})
    assert backend.calls[1].prompt_ids == [5, 6, 7]

    r = client.post("/v1/completions", json={"model": MODEL, "prompt": [5], "stream": True,
                                             "return_token_ids": True})  # fmt: skip
    chunks = sse(r.text)[:-1]
    assert "".join(c["choices"][0]["text"] for c in chunks) == "Hello, world!"
    assert chunks[0]["choices"][0]["prompt_token_ids"] == [5]
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "stop"


def test_generate_speaks_sglangs_dialect(client: TestClient, backend: ScriptedBackend) -> None:
    r = client.post("/generate", json={
        "input_ids": [1, 2, 3], "return_logprob": True,
        "sampling_params": {"max_new_tokens": 64, "temperature": 0, "top_p": 0.9,
                            "sampling_seed": 11, "stop_token_ids": [300]},
    })  # fmt: skip
    body = r.json()
    reply = [*TOK.encode("Hello, world!"), EOS]
    assert body["text"] == "Hello, world!" and body["output_ids"] == reply
    meta = body["meta_info"]
    assert meta["finish_reason"] == {"type": "stop", "matched": EOS}
    assert (meta["prompt_tokens"], meta["completion_tokens"]) == (3, len(reply))
    assert meta["output_token_logprobs"] == [[logprob_of(k), i, None] for k, i in enumerate(reply)]
    assert meta["weight_version"] == 8 and meta["weight_versions"] == [[0, 7], [5, 8]]
    assert meta["id"] == backend.calls[0].rid
    s = backend.calls[0].sampling
    assert (s.max_new_tokens, s.temperature, s.top_p, s.seed) == (64, 0.0, 0.9, 11)
    assert s.stop_ids == (EOS, 300)

    body = client.post(
        "/generate", json={"text": "Say", "rid": "r-1", "sampling_params": {"max_new_tokens": 4}}
    ).json()
    assert body["meta_info"]["finish_reason"] == {"type": "length", "length": 4}
    assert body["meta_info"]["output_token_logprobs"] is None and body["text"] == "Hell"
    assert backend.calls[1].rid == "r-1" and backend.calls[1].prompt_ids == TOK.encode("Say")

    body = client.post("/generate", json={"input_ids": [1], "sampling_params": {
        "ignore_eos": True, "max_new_tokens": 99}}).json()  # fmt: skip
    assert EOS not in backend.calls[2].sampling.stop_ids
    assert body["meta_info"]["finish_reason"] == {"type": "stop"}


def test_generate_streams_cumulative_outputs(client: TestClient) -> None:
    r = client.post("/generate", json={"input_ids": [1], "stream": True, "return_logprob": True})
    events = sse(r.text)
    assert events[-1] == "[DONE]"
    outs = events[:-1]
    assert [len(o["output_ids"]) for o in outs] == sorted(len(o["output_ids"]) for o in outs)
    assert all(o["meta_info"]["finish_reason"] is None for o in outs[:-1])
    last = outs[-1]
    assert last["text"] == "Hello, world!" and last["meta_info"]["finish_reason"]["type"] == "stop"
    assert [x[1] for x in last["meta_info"]["output_token_logprobs"]] == last["output_ids"]


def test_status_and_events_map_to_the_backend(client: TestClient, backend: ScriptedBackend) -> None:
    assert client.get("/pearl/v1/status").json()["status"] == "replay"
    for kind in EVENT_KINDS:
        r = client.post(f"/pearl/v1/events/{kind}", json={"gpus": [0, 1]})
        assert r.status_code == 200 and r.json()["kind"] == kind
    assert backend.events == [(k, {"gpus": [0, 1]}) for k in EVENT_KINDS]
    as_json = {"Content-Type": "application/json"}  # control routes take JSON only
    assert client.post("/pearl/v1/events/training-begin", headers=as_json).status_code == 200
    assert backend.events[-1] == ("training-begin", {}) and backend.waits[-1] is True
    r = client.post("/pearl/v1/events/training-begin?wait=false", headers=as_json)
    assert r.status_code == 200 and backend.waits[-1] is False  # answers once logged

    r = client.post("/pearl/v1/events/reboot", json={})
    assert r.status_code == 404 and "gpus-added" in r.json()["error"]["message"]
    r = client.post("/pearl/v1/events/gpus-added", json=[1])
    assert r.status_code == 400 and "JSON object" in r.json()["error"]["message"]
    r = client.post("/pearl/v1/events/gpus-added", content=b"{nope", headers=as_json)
    assert r.status_code == 400 and "malformed JSON" in r.json()["error"]["message"]
    r = client.post("/pearl/v1/events/gpus-reclaimed", json={"refuse": "unknown gpu"})
    assert r.status_code == 409 and "unknown gpu" in r.json()["error"]["message"]


def assert_error(r, status: int, words: str, param: str | None = "-") -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert words in err["message"], err
    if param != "-":
        assert err["param"] == param
    return err


@pytest.mark.parametrize(
    ("body", "words", "param"),
    [
        ({"model": MODEL, "messages": HI, "n": 0}, "n must be an integer in [1, 128]", "n"),
        ({"model": MODEL, "messages": HI, "stop": ["\n", ""]}, "must not be empty", "stop"),
        ({"model": MODEL, "messages": HI, "top_logprobs": 3}, "top_logprobs", "top_logprobs"),
        ({"model": MODEL, "messages": HI, "presence_penalty": 2.5}, "must be in [-2, 2]",
         "presence_penalty"),
        ({"model": MODEL, "messages": HI, "tool_choice": "required"}, "tool_choice",
         "tool_choice"),
        ({"model": MODEL, "messages": HI, "max_tokens": 5000}, "beyond the context", "max_tokens"),
        ({"model": MODEL, "messages": HI, "temperature": 9}, "invalid temperature",
         "temperature"),
        ({"model": MODEL, "messages": []}, "invalid messages", "messages"),
        ({"messages": HI}, "missing required parameter: 'model'", "model"),
        ({"model": MODEL, "messages": [{"role": "robot", "content": "x"}]}, "invalid messages",
         None),
    ],
)  # fmt: skip
def test_bad_chat_requests_get_400_with_a_clear_message(
    client: TestClient, backend: ScriptedBackend, body: dict, words: str, param: str | None
) -> None:
    err = assert_error(r=client.post("/v1/chat/completions", json=body), status=400, words=words,
                       param=param if param is not None else "-")  # fmt: skip
    assert err["type"] == "invalid_request_error"
    assert backend.calls == []


def test_malformed_json_and_too_long_prompts_get_400(
    client: TestClient, backend: ScriptedBackend
) -> None:
    r = client.post("/v1/chat/completions", content=b'{"model": ', headers={
        "content-type": "application/json"})  # fmt: skip
    assert_error(r, 400, "malformed JSON")
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": "x" * 4096})
    assert_error(r, 400, "the prompt is 4096 tokens; the context holds 4096")
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": ["a", [1]]})
    assert_error(r=r, status=400, words="invalid prompt: ", param="prompt")
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": [1], "logprobs": 21})
    assert_error(r=r, status=400, words="logprobs must be in [0, 20]", param="logprobs")
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": [-1]})
    assert_error(r=r, status=400, words="token id -1 is outside the vocabulary", param="prompt")
    r = client.post("/generate", json={"text": "a", "input_ids": [1]})
    assert_error(r, 400, "exactly one of text and input_ids")
    r = client.post("/generate", json={"input_ids": [1], "sampling_params": {"json_schema": 0.1}})
    assert_error(r, 400, "unsupported parameter: 'sampling_params.json_schema'")
    r = client.post("/generate", json={"input_ids": [1] * 10, "sampling_params": {
        "max_new_tokens": 4090}})  # fmt: skip
    assert_error(
        r=r, status=400, words="beyond the context", param="sampling_params.max_new_tokens"
    )
    assert client.post("/v1/nowhere").status_code == 404
    assert client.get("/v1/chat/completions").json()["error"]["message"] == "Method Not Allowed"
    assert backend.calls == []


def test_a_backend_error_keeps_its_status_and_the_app_keeps_serving(
    backend: ScriptedBackend,
) -> None:
    backend.fail_after = 0
    with TestClient(build_app(backend)) as client:
        r = client.post("/v1/chat/completions", json={"model": MODEL, "messages": HI})
        err = assert_error(r, 503, "pool gave up")
        assert err["type"] == "invalid_request_error"

        backend.failure = RuntimeError("boom")
        r = client.post("/generate", json={"input_ids": [1]})
        assert_error(r, 500, "internal error: RuntimeError: boom")

        # Mid-stream: the error is the last event before [DONE]; the generator was closed.
        backend.fail_after = 2
        r = client.post("/v1/chat/completions", json={"model": MODEL, "messages": HI,
                                                      "stream": True})  # fmt: skip
        events = sse(r.text)
        assert events[-1] == "[DONE]" and "boom" in events[-2]["error"]["message"]
        assert backend.closed == [c.rid for c in backend.calls]

        backend.fail_after = None
        assert chat(client)["choices"][0]["message"]["content"] == "Hello, world!"


def test_a_backend_that_never_finishes_is_a_500(backend: ScriptedBackend) -> None:
    async def endless(*_: object):
        return
        yield  # an async generator that yields nothing

    backend.generate = endless
    with TestClient(build_app(backend)) as client:
        r = client.post("/v1/completions", json={"model": MODEL, "prompt": [1]})
    assert_error(r, 500, "without a finish reason")


def test_the_api_key_guards_every_route(backend: ScriptedBackend) -> None:
    with TestClient(build_app(backend, api_key="s3cret")) as client:
        routes = [("GET", "/v1/models"), ("GET", "/pearl/v1/status"),
                  ("POST", "/v1/chat/completions"), ("POST", "/generate"),
                  ("POST", "/pearl/v1/events/gpus-added"), ("GET", "/nowhere")]  # fmt: skip
        for method, path in routes:
            for headers in [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}]:
                r = client.request(method, path, headers=headers, json={})
                err = assert_error(r, 401, "API key")
                assert err["type"] == "authentication_error"
                assert r.headers["www-authenticate"] == "Bearer"
        ok = {"Authorization": "Bearer s3cret"}
        assert client.get("/v1/models", headers=ok).status_code == 200
        assert (
            client.get("/v1/models", headers={"Authorization": "bearer s3cret"}).status_code == 200
        )
        assert (
            client.get("/v1/models", headers={"Authorization": "Basic s3cret"}).status_code == 401
        )
        r = client.post("/v1/chat/completions", headers=ok, json={"model": MODEL, "messages": HI})
        assert r.status_code == 200
    assert len(backend.calls) == 1 and backend.events == []


def test_bodies_over_the_bound_get_413(backend: ScriptedBackend) -> None:
    with TestClient(build_app(backend, max_body_bytes=1000)) as client:
        big = {"model": MODEL, "messages": [{"role": "user", "content": "x" * 2000}]}
        assert_error(client.post("/v1/chat/completions", json=big), 413, "over 1000 bytes")

        def chunks():
            yield json.dumps(big).encode()  # no content-length: counted as it arrives

        r = client.post("/v1/chat/completions", content=chunks(),
                        headers={"content-type": "application/json"})  # fmt: skip
        assert_error(r, 413, "over 1000 bytes")
        small = {"model": MODEL, "messages": HI}
        assert client.post("/v1/chat/completions", json=small).status_code == 200
    assert len(backend.calls) == 1


def test_migrations_and_recomputation_add_up_in_usage(backend: ScriptedBackend) -> None:
    backend.moves_per_delta = 1
    with TestClient(build_app(backend)) as client:
        usage = chat(client)["usage"]
        meta = client.post("/generate", json={"input_ids": [1, 2]}).json()["meta_info"]
    # "Hello, world!" + EOS: 4-token deltas, one split where the version changes.
    assert (usage["migrations"], usage["recomputed_tokens"]) == (5, 5 * len(CHATML_HI))
    assert (meta["migrations"], meta["recomputed_tokens"]) == (5, 10)


def test_a_tokenizer_without_eos_stops_only_where_asked(backend: ScriptedBackend) -> None:
    backend.tokenizer.eos_id = -1
    with TestClient(build_app(backend)) as client:
        chat(client, stop_token_ids=[7])
        r = client.post("/v1/completions", json={"model": MODEL, "prompt": [1],
                                                 "stop_token_ids": [-3]})  # fmt: skip
        assert_error(
            r=r, status=400, words="token id -3 is outside the vocabulary", param="stop_token_ids"
        )
    assert backend.calls[0].sampling.stop_ids == (7,)


def test_a_gateway_error_carries_its_kind(backend: ScriptedBackend) -> None:
    backend.fail_after = 0
    backend.failure = GatewayError(
        message="slow down", status=429, kind="rate_limit_error", param="messages"
    )
    with TestClient(build_app(backend)) as client:
        err = assert_error(client.post("/generate", json={"input_ids": [1]}), 429, "slow down")
    assert (err["type"], err["param"]) == ("rate_limit_error", "messages")


# -- stop strings ----------------------------------------------------------------------------


def test_stop_strings_cut_text_and_end_the_token_ids_at_the_token_that_completed_them(
    backend: ScriptedBackend,
) -> None:
    """Text leaves the stop string out; token ids end with the token that completed it (what
    the model generated, for the trainer); generation ends there (the backend is closed)."""
    backend.replies = ["Thought: add. Action: calc Observation: 7 and more text"]
    backend.chunk = 64  # one delta holding the stop and what came after it
    with TestClient(build_app(backend)) as c:
        r = c.post("/v1/completions", json={"model": MODEL, "prompt": "Q", "max_tokens": 80,
                                            "stop": ["Observation:", "zzz"],
                                            "return_token_ids": True})  # fmt: skip
        choice = r.json()["choices"][0]
        assert choice["text"] == "Thought: add. Action: calc "
        assert choice["finish_reason"] == "stop"
        want = list(b"Thought: add. Action: calc Observation:")
        assert choice["token_ids"] == want
        assert r.json()["usage"]["completion_tokens"] == len(want)
        assert backend.closed == [backend.calls[-1].rid]  # the rest is aborted in the pool

        # SGLang's dialect: the same cut, the matched string named, no_stop_trim keeps it
        for trim, text in ((False, "Thought: add. Action: calc "),
                           (True, "Thought: add. Action: calc Observation:")):  # fmt: skip
            g = c.post(
                "/generate",
                json={
                    "text": "Q",
                    "sampling_params": {
                        "max_new_tokens": 80,
                        "stop": "Observation:",
                        "no_stop_trim": trim,
                    },
                },
            ).json()
            assert g["text"] == text and g["output_ids"] == want
            assert g["meta_info"]["finish_reason"] == {"type": "stop", "matched": "Observation:"}


def test_a_stream_holds_back_what_may_become_a_stop_string(backend: ScriptedBackend) -> None:
    """Deltas of 4 bytes split the stop string across them: no chunk shows any of it."""
    backend.replies = ["abc END, then more"]
    backend.chunk = 4
    with TestClient(build_app(backend)) as c:
        body = {"model": MODEL, "messages": HI, "stream": True, "stop": "END",
                "return_token_ids": True}  # fmt: skip
        r = c.post("/v1/chat/completions", json=body)
        chunks = [e for e in sse(r.text) if e != "[DONE]" and e["choices"]]
        texts = [e["choices"][0]["delta"].get("content") or "" for e in chunks]
        assert "".join(texts) == "abc "
        assert not any("E" in t for t in texts)
        ids = [i for e in chunks for i in e["choices"][0].get("token_ids") or []]
        assert ids == list(b"abc END")
        assert chunks[-1]["choices"][0]["finish_reason"] == "stop"

        # a stop string that never comes: every character arrives, nothing is held for good
        r = c.post("/v1/completions", json={"model": MODEL, "prompt": "Q", "stream": True,
                                            "stop": ["then more!"]})  # fmt: skip
        chunks = [e for e in sse(r.text) if e != "[DONE]" and e["choices"]]
        assert "".join(e["choices"][0]["text"] for e in chunks) == "abc END, then more"


BIG = 2**64  # what msgpack cannot carry to a worker host
CMPL = {"model": MODEL, "prompt": [1, 2]}
GEN: dict = {"input_ids": [1, 2]}


def raw_json(client: TestClient, path: str, body: dict):
    """POST ``body`` as JSON the way Python writes it: ASCII, lone surrogates as ``\\ud800``
    escapes, NaN and Infinity as bare words."""
    return client.post(path, content=json.dumps(body).encode(),
                       headers={"content-type": "application/json"})  # fmt: skip


@pytest.mark.parametrize(
    ("path", "body", "words", "param"),
    [
        ("/v1/completions", {**CMPL, "prompt": [600, 5]}, "token id 600 is outside the vocabulary",
         "prompt"),
        ("/v1/completions", {**CMPL, "prompt": [5, BIG]}, f"token id {BIG}", "prompt"),
        ("/v1/completions", {**CMPL, "stop_token_ids": [BIG]}, f"token id {BIG}",
         "stop_token_ids"),
        ("/v1/completions", {**CMPL, "seed": BIG}, "invalid seed", "seed"),
        ("/v1/chat/completions", {"model": MODEL, "messages": HI, "seed": -(2**63) - 1},
         "invalid seed", "seed"),
        ("/v1/chat/completions", {"model": MODEL, "messages": HI, "stop_token_ids": [512]},
         "token ids are 0 to 511", "stop_token_ids"),
        ("/generate", {"input_ids": [BIG]}, f"token id {BIG}", "input_ids"),
        ("/generate", {"input_ids": [9707, 11]}, "token id 9707", "input_ids"),
        ("/generate", {**GEN, "sampling_params": {"seed": BIG}}, "invalid sampling_params.seed",
         "sampling_params.seed"),
        ("/generate", {**GEN, "sampling_params": {"sampling_seed": BIG}}, "invalid",
         "sampling_params.sampling_seed"),
        ("/generate", {**GEN, "sampling_params": {"stop_token_ids": [1, BIG]}}, f"token id {BIG}",
         "sampling_params.stop_token_ids"),
        ("/generate", {**GEN, "rid": "r" * 257}, "invalid rid", "rid"),
        ("/v1/chat/completions", {"model": MODEL, "messages": HI, "temperature": float("nan")},
         "invalid temperature", "temperature"),
        ("/generate", {**GEN, "sampling_params": {"temperature": float("inf")}},
         "invalid sampling_params.temperature", "sampling_params.temperature"),
        ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user",
         "content": "a\ud800"}]}, "not valid Unicode text", "messages.0.content"),
        ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": [
         {"type": "text", "text": "\udfff"}]}]}, "lone surrogate", "messages.0.content.0.text"),
        ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "hi",
         "reasoning_content": "\ud800"}]}, "not valid", "messages.0.reasoning_content"),
        ("/v1/chat/completions", {"model": MODEL, "messages": HI, "user": "\ud800"},
         "not valid", "user"),
        ("/v1/chat/completions", {"model": MODEL, "messages": HI, "stop": ["\ud800"]},
         "not valid", "stop.0"),
        ("/v1/chat/completions", {"model": MODEL, "messages": HI,
         "chat_template_kwargs": {"x\ud800": 1}}, "not valid", "chat_template_kwargs"),
        ("/v1/completions", {**CMPL, "prompt": "\ud800"}, "not valid", "prompt"),
        ("/generate", {"text": "hi\ud800"}, "not valid", "text"),
        ("/generate", {**GEN, "rid": "\ud800"}, "invalid rid", "rid"),
    ],
)  # fmt: skip
def test_a_request_a_worker_could_not_take_gets_400_naming_it_and_reaches_no_backend(
    client: TestClient, backend: ScriptedBackend, path: str, body: dict, words: str, param: str
) -> None:
    """Token ids beyond the model's vocabulary, integers beyond what a worker host is sent (the
    seed: 64 bits), numbers that are not finite and text that is not text: each a 400 that names
    its field, before anything reaches the backend (once, such a request killed pearld)."""
    err = assert_error(r=raw_json(client, path, body), status=400, words=words, param=param)
    assert err["type"] == "invalid_request_error"
    assert backend.calls == []
    assert chat(client)["choices"][0]["message"]["content"] == "Hello, world!"  # still serving


def test_the_edges_of_the_ranges_are_served(client: TestClient, backend: ScriptedBackend) -> None:
    for path, body in [
        ("/v1/completions", {**CMPL, "prompt": [0, 511], "seed": 2**63 - 1,
                             "stop_token_ids": [511]}),
        ("/v1/chat/completions", {"model": MODEL, "messages": HI, "seed": -(2**63)}),
        ("/generate", {"input_ids": [511], "rid": "r" * 256, "sampling_params": {
            "sampling_seed": 0, "stop_token_ids": [0]}}),
    ]:  # fmt: skip
        assert client.post(path, json=body).status_code == 200, body
    assert [c.sampling.seed for c in backend.calls] == [2**63 - 1, -(2**63), 0]


def test_a_parameter_named_with_a_lone_surrogate_is_a_400(
    client: TestClient,
) -> None:
    r = raw_json(client, "/v1/chat/completions", {"model": MODEL, "messages": HI, "a\ud800": 1})
    assert_error(r, 400, "should be a valid string")  # pydantic refuses such a key itself


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_ignore_eos_leaves_eos_out_of_the_stop_ids(
    client: TestClient, backend: ScriptedBackend, path: str
) -> None:
    """vLLM's ``ignore_eos``: EOS does not end the response; the request's own stop ids do."""
    body = {"model": MODEL, "max_tokens": 40, "stop_token_ids": [300],
            **({"messages": HI} if "chat" in path else {"prompt": "Hi"})}  # fmt: skip
    r = client.post(path, json={**body, "ignore_eos": True, "return_token_ids": True})
    assert r.status_code == 200, r.text
    assert backend.calls[0].sampling.stop_ids == (300,)
    assert r.json()["choices"][0]["token_ids"] == TOK.encode("Hello, world!")  # no EOS added
    client.post(path, json=body)
    client.post(path, json={**body, "ignore_eos": False})
    assert [c.sampling.stop_ids for c in backend.calls[1:]] == [(EOS, 300), (EOS, 300)]


def test_include_stop_str_in_output_and_skip_special_tokens_false_keep_them_in_the_text(
    backend: ScriptedBackend,
) -> None:
    """vLLM's two text fields: the stop string (or stop token) that ended the response stays in
    its text, and special tokens are written out; in a body and in a stream alike."""
    backend.replies = ["abc END, then more"]
    backend.chunk = 4
    with TestClient(build_app(backend)) as c:
        for stream in (False, True):
            body = {"model": MODEL, "prompt": "Q", "stop": "END", "stream": stream,
                    "include_stop_str_in_output": True}  # fmt: skip
            r = c.post("/v1/completions", json=body)
            if stream:
                chunks = [e for e in sse(r.text) if e != "[DONE]" and e["choices"]]
                text = "".join(e["choices"][0]["text"] for e in chunks)
            else:
                text = r.json()["choices"][0]["text"]
            assert text == "abc END", stream
        backend.replies = ["done"]  # the scripted backend ends it with EOS
        for skip, text in ((True, "done"), (False, "done<|eos|>")):
            body = {"model": MODEL, "messages": HI, "skip_special_tokens": skip,
                    "include_stop_str_in_output": True}  # fmt: skip
            r = c.post("/v1/chat/completions", json=body)
            assert r.json()["choices"][0]["message"]["content"] == text
