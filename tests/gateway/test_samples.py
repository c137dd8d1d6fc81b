"""Issue 43 items 2-4 at the gateway: ``n`` samples (one choice each, ``index`` in streams,
seeds ``s .. s+n-1``, one group), chat ``top_logprobs`` and completions ``logprobs=k`` in
vLLM's shapes, and vLLM's sampling fields on their way to the pool.

The backend is scripted (tests/gateway/scripted.py): that the engines sample what these fields
ask is tests/engines/test_sampling_fields.py's.
"""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from pearl.gateway.sampling import seed_of
from tests.gateway.conftest import sse
from tests.gateway.scripted import ScriptedBackend, logprob_of

MODEL = "scripted-model"
HI = [{"role": "user", "content": "Hi"}]
CHAT = {"model": MODEL, "messages": HI}
CMPL = {"model": MODEL, "prompt": "Hi"}
TEXT = "Hello, world!"
TOKENS = len(TEXT) + 1  # and EOS


def test_n_chat_samples_are_choices_of_one_group_with_seeds_s_plus_i(
    client: TestClient, backend: ScriptedBackend
) -> None:
    r = client.post("/v1/chat/completions", json={**CHAT, "n": 8, "seed": 41})
    assert r.status_code == 200, r.text
    body = r.json()
    assert [c["index"] for c in body["choices"]] == list(range(8))
    assert all(c["message"]["content"] == TEXT for c in body["choices"])
    assert sorted(c.sampling.seed for c in backend.calls) == list(range(41, 49))
    groups = {c.sampling.group for c in backend.calls}
    assert len(groups) == 1 and groups != {""}
    assert sorted(c.rid for c in backend.calls) == sorted(f"{body['id']}/{i}" for i in range(8))
    # The prompt counts once; the completions add up.
    prompt = len(backend.calls[0].prompt_ids)
    assert body["usage"]["prompt_tokens"] == prompt
    assert body["usage"]["completion_tokens"] == 8 * TOKENS
    assert body["usage"]["total_tokens"] == prompt + 8 * TOKENS


def test_sample_seeds_wrap_in_the_signed_64_bit_range() -> None:
    top = (1 << 63) - 1
    assert [seed_of(top - 1, i) for i in range(3)] == [top - 1, top, -(1 << 63)]
    assert seed_of(None, 3) is None


def test_n_without_a_seed_gives_unseeded_samples(
    client: TestClient, backend: ScriptedBackend
) -> None:
    r = client.post("/v1/chat/completions", json={**CHAT, "n": 3})
    assert r.status_code == 200 and len(r.json()["choices"]) == 3
    assert [c.sampling.seed for c in backend.calls] == [None] * 3


def test_a_stream_of_n_samples_carries_each_choices_index(
    client: TestClient, backend: ScriptedBackend
) -> None:
    body = {**CHAT, "n": 3, "seed": 5, "stream": True, "stream_options": {"include_usage": True}}
    events = sse(client.post("/v1/chat/completions", json=body).text)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert len({c["id"] for c in chunks}) == 1  # one response
    text: dict[int, str] = {}
    finish: dict[int, str] = {}
    for c in chunks[:-1]:
        (choice,) = c["choices"]
        text[choice["index"]] = text.get(choice["index"], "") + (choice["delta"]["content"] or "")
        if choice["finish_reason"]:
            finish[choice["index"]] = choice["finish_reason"]
    assert text == dict.fromkeys(range(3), TEXT) and finish == dict.fromkeys(range(3), "stop")
    usage = chunks[-1]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 3 * TOKENS


def test_n_completions_of_several_prompts_are_indexed_prompt_by_prompt(
    client: TestClient, backend: ScriptedBackend
) -> None:
    r = client.post("/v1/completions", json={**CMPL, "prompt": ["a", "bc"], "n": 2, "seed": 9})
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2, 3]
    assert [len(c.prompt_ids) for c in backend.calls] == [1, 1, 2, 2]
    assert [c.sampling.seed for c in backend.calls] == [9, 10, 9, 10]
    assert r.json()["usage"]["prompt_tokens"] == 3  # each prompt once


def test_chat_top_logprobs_in_openais_shape_with_token_ids(
    client: TestClient, backend: ScriptedBackend
) -> None:
    r = client.post("/v1/chat/completions", json={**CHAT, "logprobs": True, "top_logprobs": 2})
    assert r.status_code == 200, r.text
    assert backend.calls[0].sampling.top_logprobs == 2
    content = r.json()["choices"][0]["logprobs"]["content"]
    assert "".join(t["token"] for t in content) == TEXT
    first = content[0]
    assert first["logprob"] == pytest.approx(logprob_of(0))
    assert first["top_logprobs"] == [
        {"token": "A", "logprob": pytest.approx(logprob_of(0) - 0.5), "bytes": [65],
         "token_id": 65},
        {"token": "B", "logprob": pytest.approx(logprob_of(0) - 1.5), "bytes": [66],
         "token_id": 66},
    ]  # fmt: skip
    assert all(len(t["top_logprobs"]) == 2 for t in content)
    stream = client.post(
        "/v1/chat/completions",
        json={**CHAT, "logprobs": True, "top_logprobs": 1, "stream": True},
    )
    tops = [
        t["top_logprobs"]
        for c in sse(stream.text)[:-1]
        for ch in c["choices"]
        if ch.get("logprobs")
        for t in ch["logprobs"]["content"]
    ]
    assert len(tops) == TOKENS and all(t[0]["token_id"] == 65 for t in tops)


def test_chat_top_logprobs_need_logprobs_and_are_at_most_20(client: TestClient) -> None:
    r = client.post("/v1/chat/completions", json={**CHAT, "top_logprobs": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "top_logprobs"
    r = client.post("/v1/chat/completions", json={**CHAT, "logprobs": True, "top_logprobs": 21})
    assert r.status_code == 400 and r.json()["error"]["param"] == "top_logprobs"


def test_completions_logprobs_k_gives_k_plus_the_sampled_token(
    client: TestClient, backend: ScriptedBackend
) -> None:
    r = client.post("/v1/completions", json={**CMPL, "logprobs": 2})
    assert r.status_code == 200, r.text
    lp = r.json()["choices"][0]["logprobs"]
    assert "".join(lp["tokens"]) == TEXT
    assert lp["top_logprobs"][0] == {
        "A": pytest.approx(logprob_of(0) - 0.5),
        "B": pytest.approx(logprob_of(0) - 1.5),
        "H": pytest.approx(logprob_of(0)),
    }
    assert all(len(alts) == 3 for alts in lp["top_logprobs"])
    r = client.post(
        "/v1/completions", json={**CMPL, "logprobs": 1, "return_tokens_as_token_ids": True}
    )
    lp = r.json()["choices"][0]["logprobs"]
    assert lp["tokens"][0] == "token_id:72"
    assert set(lp["top_logprobs"][0]) == {"token_id:65", "token_id:72"}
    r = client.post("/v1/completions", json={**CMPL, "logprobs": 0})
    assert r.json()["choices"][0]["logprobs"]["top_logprobs"] is None
    assert backend.calls[-1].sampling.top_logprobs == 0


def test_vllms_sampling_fields_reach_the_pool_together(
    client: TestClient, backend: ScriptedBackend
) -> None:
    fields = {
        "top_k": 20,
        "min_p": 0.05,
        "presence_penalty": 0.5,
        "frequency_penalty": 0.25,
        "repetition_penalty": 1.1,
        "min_tokens": 4,
        "logit_bias": {"65": -100, "66": 200},
    }
    r = client.post("/v1/chat/completions", json={**CHAT, **fields, "temperature": 0.7})
    assert r.status_code == 200, r.text
    s = backend.calls[0].sampling
    assert (s.top_k, s.min_p, s.presence_penalty, s.frequency_penalty, s.repetition_penalty,
            s.min_tokens) == (20, 0.05, 0.5, 0.25, 1.1, 4)  # fmt: skip
    assert s.logit_bias == ((65, -100.0), (66, 100.0))  # clamped to [-100, 100], as vLLM
    r = client.post("/v1/completions", json={**CMPL, "top_k": -1, "repetition_penalty": 1.0})
    assert r.status_code == 200 and backend.calls[-1].sampling.top_k == 0  # -1: all tokens
    r = client.post("/v1/completions", json={**CMPL, "logit_bias": {"9999": 1}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "logit_bias"


def test_generate_n_samples_are_a_list_as_sglang_answers(
    client: TestClient, backend: ScriptedBackend
) -> None:
    body = {"input_ids": [1, 2], "sampling_params": {"n": 3, "seed": 7, "max_new_tokens": 32}}
    r = client.post("/generate", json=body)
    assert r.status_code == 200, r.text
    outs = r.json()
    assert [o["text"] for o in outs] == [TEXT] * 3 and all("index" not in o for o in outs)
    assert [c.sampling.seed for c in backend.calls] == [7, 8, 9]
    assert len({c.sampling.group for c in backend.calls} - {""}) == 1
    events = sse(client.post("/generate", json={**body, "stream": True}).text)
    assert events[-1] == "[DONE]"
    last = {e["index"]: e["text"] for e in events[:-1]}
    assert last == dict.fromkeys(range(3), TEXT)


def test_generate_returns_sglangs_output_top_logprobs(
    client: TestClient, backend: ScriptedBackend
) -> None:
    body = {"input_ids": [1], "return_logprob": True, "top_logprobs_num": 2,
            "return_text_in_logprobs": True}  # fmt: skip
    meta = client.post("/generate", json=body).json()["meta_info"]
    tops = meta["output_top_logprobs"]
    assert len(tops) == len(meta["output_token_logprobs"]) == TOKENS
    assert tops[0] == [
        [pytest.approx(logprob_of(0) - 0.5), 65, "A"],
        [pytest.approx(logprob_of(0) - 1.5), 66, "B"],
    ]
    plain = client.post("/generate", json={"input_ids": [1], "return_logprob": True})
    assert "output_top_logprobs" not in plain.json()["meta_info"]


def test_generate_takes_sglangs_sampling_fields(
    client: TestClient, backend: ScriptedBackend
) -> None:
    sp = {"top_k": 5, "min_p": 0.1, "presence_penalty": 0.5, "frequency_penalty": -0.5,
          "repetition_penalty": 1.2, "min_new_tokens": 3}  # fmt: skip
    r = client.post("/generate", json={"input_ids": [1], "sampling_params": sp})
    assert r.status_code == 200, r.text
    s = backend.calls[0].sampling
    assert (s.top_k, s.min_p, s.presence_penalty, s.frequency_penalty, s.repetition_penalty,
            s.min_tokens) == (5, 0.1, 0.5, -0.5, 1.2, 3)  # fmt: skip
    for name, value in (("min_p", 1.5), ("min_new_tokens", -1), ("n", 0), ("top_k", -2)):
        r = client.post("/generate", json={"input_ids": [1], "sampling_params": {name: value}})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == f"sampling_params.{name}"
