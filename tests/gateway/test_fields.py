"""Issue 43 item 5: what agent frameworks pass along is accepted, ignored and named; explicit
nulls mean the default; what would change the output and is not implemented yet is a 400 naming
the field (pearl.gateway.fields.REFUSED), unless it has its no-op value."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from pearl.gateway.fields import IGNORED_HEADER, REFUSED, header_value
from tests.gateway.scripted import ScriptedBackend

MODEL = "scripted-model"
HI = [{"role": "user", "content": "Hi"}]
CHAT = {"model": MODEL, "messages": HI}
CMPL = {"model": MODEL, "prompt": "Hi"}

# What the OpenAI SDK and its wrappers (litellm, langchain, pydantic-ai, openai-agents) send.
PASS_ALONG = {
    "service_tier": "auto",
    "prompt_cache_key": "agent-1",
    "safety_identifier": "user-hash",
    "parallel_tool_calls": False,
    "reasoning_effort": "low",
    "verbosity": "low",
    "store": False,
    "metadata": {"run": "7"},
    "modalities": ["text"],
    "prediction": {"type": "content", "content": "x"},
    "audio": {"voice": "alloy", "format": "wav"},
    "web_search_options": {},
    "function_call": "auto",
    "functions": [],
    "frobnicate": 1,
}


@pytest.mark.parametrize(("path", "body"), [("/v1/chat/completions", CHAT),
                                           ("/v1/completions", CMPL)])  # fmt: skip
def test_pass_along_fields_are_accepted_ignored_and_named(
    client: TestClient, backend: ScriptedBackend, path: str, body: dict
) -> None:
    r = client.post(path, json={**body, **PASS_ALONG, "user": "u1"})
    assert r.status_code == 200, r.text
    assert r.headers[IGNORED_HEADER].split(",") == list(PASS_ALONG)
    assert backend.calls[0].session == "u1"  # user is read, not ignored
    plain = client.post(path, json=body)
    assert plain.status_code == 200 and IGNORED_HEADER.lower() not in plain.headers
    # The same fields change nothing: the same reply, the same sampling.
    assert backend.calls[0].sampling == backend.calls[1].sampling


def test_a_stream_names_the_ignored_fields_too(client: TestClient) -> None:
    body = {**CHAT, "stream": True, "service_tier": "auto",
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}  # fmt: skip
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200
    assert r.headers[IGNORED_HEADER] == "service_tier,stream_options.continuous_usage_stats"
    assert r.text.rstrip().endswith("data: [DONE]")


def test_explicit_nulls_mean_the_default(client: TestClient, backend: ScriptedBackend) -> None:
    nulls = dict.fromkeys(
        ["stream", "stream_options", "max_tokens", "temperature", "top_p", "seed", "n", "stop",
         "presence_penalty", "frequency_penalty", "logit_bias", "user", "logprobs",
         "top_logprobs", "tools", "tool_choice", "parallel_tool_calls", "response_format",
         "service_tier", "top_k", "guided_json", "store", "metadata", "return_token_ids"]
    )  # fmt: skip
    r = client.post("/v1/chat/completions", json={**CHAT, **nulls})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == "Hello, world!"
    assert IGNORED_HEADER.lower() not in r.headers  # a null is no field at all
    r = client.post("/v1/completions", json={**CMPL, "echo": None, "suffix": None, "logprobs":
                                             None, "best_of": None, "stream": None})  # fmt: skip
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == "Hello, world!"
    client.post("/v1/chat/completions", json=CHAT)
    assert backend.calls[0].sampling == backend.calls[-1].sampling  # nulls: the defaults


NOOPS = {"n": 1, "best_of": 1, "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0,
         "presence_penalty": 0, "frequency_penalty": 0.0, "logit_bias": {}, "min_tokens": 0,
         "skip_special_tokens": True, "include_stop_str_in_output": False, "echo": False,
         "spaces_between_special_tokens": True, "use_beam_search": False}  # fmt: skip


@pytest.mark.parametrize(("path", "body"), [("/v1/chat/completions", CHAT),
                                           ("/v1/completions", CMPL)])  # fmt: skip
def test_unimplemented_fields_at_their_no_op_values_are_accepted(
    client: TestClient, path: str, body: dict
) -> None:
    extra = (
        {
            "top_logprobs": 0,
            "tool_choice": "auto",
            "response_format": {"type": "text"},
            "add_generation_prompt": True,
        }
        if "chat" in path
        else {"logprobs": 0, "suffix": ""}
    )
    r = client.post(path, json={**body, **NOOPS, **extra})  # fmt: skip
    assert r.status_code == 200, r.text
    assert IGNORED_HEADER.lower() not in r.headers  # known fields, not ignored ones


# vLLM's sampling fields that PEARL implements (issue 43): accepted, and they reach the pool.
IMPLEMENTED = [
    ("top_k", 5, 5), ("min_p", 0.1, 0.1), ("repetition_penalty", 1.1, 1.1),
    ("min_tokens", 3, 3), ("presence_penalty", 0.5, 0.5), ("frequency_penalty", -0.5, -0.5),
    ("logit_bias", {"1": 5}, ((1, 5.0),)),
]  # fmt: skip


@pytest.mark.parametrize(("name", "value", "sampled"), IMPLEMENTED)
@pytest.mark.parametrize(("path", "body"), [("/v1/chat/completions", CHAT),
                                           ("/v1/completions", CMPL)])  # fmt: skip
def test_implemented_sampling_fields_reach_the_pool(
    client: TestClient, backend: ScriptedBackend, path: str, body: dict, name: str,
    value: object, sampled: object
) -> None:  # fmt: skip
    assert name not in REFUSED
    r = client.post(path, json={**body, name: value})
    assert r.status_code == 200, r.text
    assert IGNORED_HEADER.lower() not in r.headers
    assert getattr(backend.calls[0].sampling, name) == sampled


CHANGES = [
    ("bad_words", ["x"]), ("allowed_token_ids", [1]), ("prompt_logprobs", 0), ("best_of", 3),
    ("echo", True), ("truncate_prompt_tokens", 5),
]  # fmt: skip


@pytest.mark.parametrize(("name", "value"), CHANGES)
@pytest.mark.parametrize(("path", "body"), [("/v1/chat/completions", CHAT),
                                           ("/v1/completions", CMPL)])  # fmt: skip
def test_unimplemented_fields_that_would_change_the_output_get_a_400_naming_them(
    client: TestClient, backend: ScriptedBackend, path: str, body: dict, name: str, value: object
) -> None:
    assert name in REFUSED
    r = client.post(path, json={**body, name: value})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == name
    assert backend.calls == []


OUT_OF_RANGE = [("top_k", True), ("n", "2"), ("min_p", 2.0), ("top_k", -2), ("n", 0),
                ("min_tokens", -1)]  # fmt: skip


@pytest.mark.parametrize(("name", "value"), OUT_OF_RANGE)
@pytest.mark.parametrize(("path", "body"), [("/v1/chat/completions", CHAT),
                                           ("/v1/completions", CMPL)])  # fmt: skip
def test_sampling_fields_out_of_vllms_ranges_get_a_400_naming_them(
    client: TestClient, backend: ScriptedBackend, path: str, body: dict, name: str, value: object
) -> None:
    r = client.post(path, json={**body, name: value})
    assert r.status_code == 400 and r.json()["error"]["param"] == name, r.text
    assert backend.calls == []


@pytest.mark.parametrize(
    ("path", "body", "name", "value"),
    [
        ("/v1/chat/completions", CHAT, "top_logprobs", 2),
        ("/v1/chat/completions", CHAT, "continue_final_message", True),
        ("/v1/chat/completions", CHAT, "chat_template", "{{ messages }}"),
        ("/v1/chat/completions", CHAT, "return_tokens_as_token_ids", True),
        ("/v1/completions", CMPL, "logprobs", 21),
        ("/v1/completions", CMPL, "suffix", "end"),
    ],
)  # fmt: skip
def test_route_specific_refusals(
    client: TestClient, path: str, body: dict, name: str, value: object
) -> None:
    r = client.post(path, json={**body, name: value})
    assert r.status_code == 400 and r.json()["error"]["param"] == name, r.text


def test_the_header_stays_printable_ascii_and_bounded() -> None:
    assert header_value(["a", "b.c"]) == "a,b.c"
    odd = header_value(["caf\u00e9,\u4e2d\n"])
    assert odd.isascii() and odd.isprintable() and "," not in odd
    many = header_value([f"f{k}" for k in range(40)])
    assert many.endswith(",+8 more") and many.count(",") == 32


def test_non_ascii_field_names_do_not_break_the_response(client: TestClient) -> None:
    r = client.post("/v1/chat/completions", json={**CHAT, "\u00fcber": 1, "\u4e2d": 2})
    assert r.status_code == 200, r.text
    assert r.headers[IGNORED_HEADER].isascii()


def test_generate_keeps_sglangs_strict_sampling_params(client: TestClient) -> None:
    r = client.post("/generate", json={"input_ids": [1], "sampling_params": {"min_q": 0.1}})
    assert r.status_code == 400 and "sampling_params.min_q" in r.text
