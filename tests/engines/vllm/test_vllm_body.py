"""What a vLLM worker is sent (issue 43): vLLM's sampling fields and top logprobs in vLLM's own
request fields, the structured constraint for PEARL's grammar processor (or in vLLM's
``structured_outputs``), and the answer's alternatives mapped back.
No server: the body and the client's parsing are plain functions."""

from __future__ import annotations

from pearl.engines.base import GenerateRequest, SamplingParams
from pearl.engines.grammar import Grammar, llguidance_text
from pearl.engines.vllm.client import Completion, alternatives
from pearl.engines.vllm.engine import body
from pearl.engines.vllm.launch import GENERATED_ARG, GRAMMAR_ARG


def request(**sampling: object) -> GenerateRequest:
    return GenerateRequest(rid="r", input_ids=(1, 2, 3), sampling=SamplingParams(**sampling))


def test_a_plain_request_sends_no_sampling_field_and_no_constraint() -> None:
    out = body(request(temperature=0.7, seed=5))
    assert (out["temperature"], out["seed"]) == (0.7, 5)
    assert not {"top_k", "min_p", "structured_outputs"} & out.keys() and out["logprobs"] == 0


def test_vllms_sampling_fields_pass_in_vllms_names() -> None:
    req = GenerateRequest(
        rid="r", input_ids=(1, 2, 3, 4), generated=2,
        sampling=SamplingParams(top_k=0, min_p=0.1, presence_penalty=0.5, frequency_penalty=-1,
                                repetition_penalty=1.2, min_tokens=5, logit_bias=((7, 3.0),)),
    )  # fmt: skip
    out = body(req)
    assert out["top_k"] == -1 and out["min_p"] == 0.1
    assert (out["presence_penalty"], out["frequency_penalty"], out["repetition_penalty"]) == (
        0.5, -1, 1.2,
    )  # fmt: skip
    assert out["min_tokens"] == 3  # two of five came before the move
    assert out["logit_bias"] == {"7": 3.0}


def test_the_constraint_goes_to_pearls_grammar_processor_with_the_kept_prefix() -> None:
    """The in-process engines' own llguidance grammar (compact JSON) and how many trailing
    prompt ids are earlier output, in vLLM's per-request extra args."""
    g = Grammar(kind="json", text='{"type": "object"}')
    req = GenerateRequest(rid="r", input_ids=(1, 2, 3, 4), generated=2,
                          sampling=SamplingParams(grammar=g))  # fmt: skip
    out = body(req)
    assert out["vllm_xargs"] == {GRAMMAR_ARG: llguidance_text(g), GENERATED_ARG: 2}
    assert "structured_outputs" not in out
    assert body(request(grammar=g))["vllm_xargs"][GENERATED_ARG] == 0
    assert "vllm_xargs" not in body(request())


def test_without_the_processor_the_constraint_goes_in_structured_outputs() -> None:
    cases = {
        Grammar(kind="json", text='{"type": "object"}'): {
            "json": {"type": "object"}, "disable_any_whitespace": True,
        },
        Grammar(kind="regex", text="[ab]+"): {"regex": "[ab]+"},
        Grammar(kind="choice", text='["yes", "no"]'): {"choice": ["yes", "no"]},
        Grammar(kind="grammar", text="start: 'x'"): {"grammar": "start: 'x'"},
    }  # fmt: skip
    for g, want in cases.items():
        out = body(request(grammar=g), grammar_processor=False)
        assert out["structured_outputs"] == want and "vllm_xargs" not in out


def test_top_logprobs_are_asked_by_id_and_mapped_back_most_likely_first() -> None:
    req = GenerateRequest(rid="r", input_ids=(1,), top_logprobs=2, return_logprobs=True)
    out = body(req)
    assert out["logprobs"] == 2 and out["return_tokens_as_token_ids"] is True
    assert body(GenerateRequest(rid="r", input_ids=(1,), return_logprobs=True))["logprobs"] == 0
    assert alternatives({"token_id:9": -3.0, "token_id:4": -0.1, "token_id:5": -1.0}) == (
        (4, -0.1), (5, -1.0), (9, -3.0),
    )  # fmt: skip
    c = Completion("http://127.0.0.1:1", {}, 1.0)
    chunk = {"choices": [{"token_ids": [4], "logprobs": {"token_logprobs": [-0.1],
             "top_logprobs": [{"token_id:4": -0.1, "token_id:5": -1.0}]}}]}  # fmt: skip
    c._take(chunk)
    assert c.out.top == [((4, -0.1), (5, -1.0))]
