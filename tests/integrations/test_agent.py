"""pearl.integrations.agent's rules, on chat responses as the gateway writes them: turns are
recovered from token ids (the environment's between the model's), split where the weights
version changes, and a prompt that does not extend the last turn is refused."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("httpx2", reason="the trl extra installs openai (and httpx2)")

from pearl.integrations.agent import (  # noqa: E402
    AgentError,
    HistoryRewritten,
    Served,
    trajectory_of,
)


def response(
    prompt: list[int], ids: list[int], versions: list[list[int]], finish: str = "stop"
) -> dict[str, Any]:
    """A chat response body with return_token_ids and logprobs (logprob of id i: -i / 10)."""
    lps = [{"token": "x", "logprob": -i / 10, "bytes": [120], "top_logprobs": []} for i in ids]
    choice = {"index": 0, "message": {"role": "assistant", "content": "x"},
              "logprobs": {"content": lps}, "finish_reason": finish, "token_ids": ids,
              "weight_version": versions[-1][1], "weight_versions": versions}  # fmt: skip
    return {"id": "c", "choices": [choice], "prompt_token_ids": prompt,
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(ids),
                      "total_tokens": len(prompt) + len(ids), "migrations": 1}}  # fmt: skip


def assemble(*bodies: dict[str, Any]) -> Any:
    served = [Served.of(b) for b in bodies]
    return trajectory_of(
        served, session="s", trajectory_id="t", group_id="g", task_id="k", reward=0.5
    )


def test_the_tokens_between_turns_are_the_environments() -> None:
    t = assemble(
        response([1, 2, 3], [10, 11], [[0, 4]], "tool_calls"),
        response([1, 2, 3, 10, 11, 20, 21], [12], [[0, 4]]),
    )
    assert t.tokens() == (1, 2, 3, 10, 11, 20, 21, 12)
    assert t.loss_mask() == (0, 0, 0, 1, 1, 0, 0, 1)
    assert t.rollout_logprobs() == pytest.approx((0, 0, 0, -1.0, -1.1, 0, 0, -1.2))
    assert t.token_versions() == (-1, -1, -1, 4, 4, -1, -1, 4)
    assert t.reward == 0.5 and t.done and t.n_turns == 2


def test_a_response_that_spans_versions_keeps_each_tokens_version() -> None:
    t = assemble(response([1], [10, 11, 12], [[0, 4], [2, 5]]))
    assert t.token_versions() == (-1, 4, 4, 5)
    assert [x.finish_reason for x in t.turns] == ["abort", "stop"]
    assert t.n_turns == 1 and t.min_version == 4


def test_a_prompt_that_does_not_extend_the_last_turn_is_refused() -> None:
    first = response([1, 2, 3], [10, 11], [[0, 0]])
    with pytest.raises(HistoryRewritten, match="turn 1's .* differ from token 4"):
        assemble(first, response([1, 2, 3, 10, 99, 20], [12], [[0, 0]]))
    with pytest.raises(HistoryRewritten, match="differ from token 1"):
        assemble(first, response([1, 5], [12], [[0, 0]]))  # history dropped
    with pytest.raises(AgentError, match="no chat completion"):
        assemble()


def test_ids_and_logprobs_must_match() -> None:
    body = response([1], [10, 11], [[0, 0]])
    body["choices"][0]["logprobs"]["content"].pop()
    with pytest.raises(AgentError, match="2 token ids and 1 logprobs"):
        Served.of(body)
