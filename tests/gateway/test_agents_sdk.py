"""The OpenAI Agents SDK (`openai-agents`) runs a multi-turn tool-calling agent through the
gateway served by uvicorn, over chat completions (``OpenAIChatCompletionsModel``).

The model is a scripted policy (a test double, not a model): it reads the rendered prompt and
answers with Hermes ``<tool_call>`` blocks or a final answer built from the ``<tool_response>``
blocks it finds there. So a run ends with the scripted answer only if the SDK ran the tools
with the arguments the gateway parsed, sent their results back, and the chat template rendered
them into the next prompt.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable, Iterator
from typing import Any

import agents
import openai
import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    RunItemStreamEvent,
    Runner,
    function_tool,
)
from openai import AsyncOpenAI
from pydantic import BaseModel

from pearl.gateway.app import build_app
from tests.gateway.scripted import ScriptedBackend
from tests.gateway.serving import serve

MODEL = "scripted-model"
KEY = "agents-key"
END = "<|im_end|>\n"
FOLLOW_UP = "Add 1 to that."
RESPONSE = re.compile(r"<tool_response>\n(.*?)\n</tool_response>", re.DOTALL)


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def tool_turn(*results: str) -> str:
    """The tools' results as the ChatML template renders them, then the generation prompt."""
    body = "\n".join(f"<tool_response>\n{r}\n</tool_response>" for r in results)
    return f"<|im_start|>user\n{body}{END}<|im_start|>assistant\n"


def chain_policy(prompt: str) -> str:
    """(2+3)*4 in three turns: add, then multiply by 4 whatever add returned, then the answer
    from what multiply returned; asked FOLLOW_UP next, add 1 to that and answer. It reads tool
    results only from the prompt."""
    results = RESPONSE.findall(prompt)
    if not results:
        return "Let me add first.\n" + call("add", a=2, b=3)
    if len(results) == 1:
        return call("multiply", a=int(results[0]), b=4)
    if FOLLOW_UP not in prompt:
        return f"(2+3)*4 = {results[1]}"
    if len(results) == 2:
        return call("add", a=int(results[1]), b=1)
    return f"That makes {results[2]}."


def parallel_policy(prompt: str) -> str:
    """Two calls in one turn, then an answer from both results."""
    results = RESPONSE.findall(prompt)
    if not results:
        return call("add", a=2, b=3) + "\n" + call("add", a=10, b=20)
    return f"2+3 = {results[0]} and 10+20 = {results[1]}."


def handoff_policy(prompt: str) -> str:
    """The triage agent hands off to the calculator, which adds and answers."""
    if prompt.startswith("<|im_start|>system\nYou route questions."):
        return call("transfer_to_calculator")
    results = RESPONSE.findall(prompt)[1:]  # after the handoff's own result
    return call("add", a=2, b=3) if not results else f"2+3 = {results[0]}"


class Calculator:
    """Two function tools that record every call they get."""

    def __init__(self) -> None:
        self.ran: list[tuple[str, int, int]] = []

        @function_tool
        def add(a: int, b: int) -> int:
            """Add two integers."""
            self.ran.append(("add", a, b))
            return a + b

        @function_tool
        def multiply(a: int, b: int) -> int:
            """Multiply two integers."""
            self.ran.append(("multiply", a, b))
            return a * b

        self.tools = [add, multiply]


@pytest.fixture(autouse=True, scope="module")
def _no_tracing() -> Iterator[None]:
    # The SDK would otherwise export traces to OpenAI's servers.
    agents.set_tracing_disabled(True)
    yield


@pytest.fixture
def backend() -> ScriptedBackend:
    return ScriptedBackend(chunk=3)


@pytest.fixture
def base_url(backend: ScriptedBackend) -> Iterator[str]:
    with serve(build_app(backend, api_key=KEY)) as url:
        yield url


def agent_over(client: AsyncOpenAI, calc: Calculator, **settings: Any) -> Agent:
    return Agent(
        name="calculator",
        instructions="You are a calculator. Use the tools.",
        tools=list(calc.tools),
        model=OpenAIChatCompletionsModel(model=MODEL, openai_client=client),
        model_settings=ModelSettings(**settings),
    )


def client_for(base_url: str, key: str = KEY) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"{base_url}/v1", api_key=key, max_retries=0, timeout=30)


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
def test_agent_runs_a_tool_chain_through_the_gateway(
    base_url: str, backend: ScriptedBackend, streamed: bool
) -> None:
    backend.reply_to = chain_policy
    calc = Calculator()

    async def main() -> Any:
        async with client_for(base_url) as client:
            agent = agent_over(
                client, calc, extra_headers={"X-Session-ID": "agent-1"}, include_usage=True
            )
            if not streamed:
                return await Runner.run(agent, "What is (2+3)*4?")
            run = Runner.run_streamed(agent, "What is (2+3)*4?")
            async for _ in run.stream_events():
                pass
            return run

    result = asyncio.run(main())
    assert result.final_output == "(2+3)*4 = 20"
    # The tools ran with the arguments parsed from the model's <tool_call> blocks, in order.
    assert calc.ran == [("add", 2, 3), ("multiply", 5, 4)]
    assert len(backend.calls) == 3
    assert {c.session for c in backend.calls} == {"agent-1"}
    prompts = [backend.tokenizer.decode(c.prompt_ids) for c in backend.calls]
    # Every prompt carries the instructions and both tools' schemas (rendered in the system turn).
    for prompt in prompts:
        assert prompt.startswith("<|im_start|>system\nYou are a calculator. Use the tools.")
        assert '"name": "add"' in prompt and '"name": "multiply"' in prompt
        assert prompt.endswith("<|im_start|>assistant\n")
    # Each prompt is the previous one, the model's reply exactly as it was generated, and the
    # tool's result: the render/parse round trip through the chat template gives back the
    # model's own tokens, streamed or not, so a turn extends its session's prefix.
    reply1 = "Let me add first.\n" + call("add", a=2, b=3)
    reply2 = call("multiply", a=5, b=4)
    assert prompts[1] == prompts[0] + reply1 + END + tool_turn("5")
    assert prompts[2] == prompts[1] + reply2 + END + tool_turn("20")
    # The SDK counted what the gateway reported.
    usage = result.context_wrapper.usage
    assert usage.requests == 3
    assert usage.input_tokens == sum(len(c.prompt_ids) for c in backend.calls)


def test_a_follow_up_run_extends_the_conversation(base_url: str, backend: ScriptedBackend) -> None:
    backend.reply_to = chain_policy
    calc = Calculator()

    async def main() -> tuple[Any, Any]:
        async with client_for(base_url) as client:
            agent = agent_over(client, calc)
            first = await Runner.run(agent, "What is (2+3)*4?")
            follow = [*first.to_input_list(), {"role": "user", "content": FOLLOW_UP}]
            return first, await Runner.run(agent, follow)

    first, second = asyncio.run(main())
    assert (first.final_output, second.final_output) == ("(2+3)*4 = 20", "That makes 21.")
    assert calc.ran == [("add", 2, 3), ("multiply", 5, 4), ("add", 20, 1)]
    prompts = [backend.tokenizer.decode(c.prompt_ids) for c in backend.calls]
    assert len(prompts) == 5
    # The next run's prompt extends the last one by the answer as generated and the new turn.
    asked = f"<|im_start|>user\n{FOLLOW_UP}{END}<|im_start|>assistant\n"
    assert prompts[3] == prompts[2] + "(2+3)*4 = 20" + END + asked
    assert prompts[4] == prompts[3] + call("add", a=20, b=1) + END + tool_turn("21")


def test_a_triage_agent_hands_off_to_the_calculator(
    base_url: str, backend: ScriptedBackend
) -> None:
    backend.reply_to = handoff_policy
    calc = Calculator()

    async def main() -> Any:
        async with client_for(base_url) as client:
            calculator = agent_over(client, calc)
            triage = calculator.clone(
                name="triage", instructions="You route questions.", tools=[],
                handoffs=[calculator],
            )  # fmt: skip
            return await Runner.run(triage, "What is 2+3?")

    result = asyncio.run(main())
    assert result.final_output == "2+3 = 5" and result.last_agent.name == "calculator"
    assert calc.ran == [("add", 2, 3)]
    prompts = [backend.tokenizer.decode(c.prompt_ids) for c in backend.calls]
    assert len(prompts) == 3
    # The triage turn offered the handoff as a tool; the calculator saw it, and its result.
    assert '"name": "transfer_to_calculator"' in prompts[0] and '"name": "add"' not in prompts[0]
    assert prompts[1].startswith("<|im_start|>system\nYou are a calculator. Use the tools.")
    assert call("transfer_to_calculator") in prompts[1]
    assert RESPONSE.findall(prompts[1]) == ['{"assistant": "calculator"}']
    assert prompts[2] == prompts[1] + call("add", a=2, b=3) + END + tool_turn("5")


def test_agent_streams_parallel_tool_calls_through_the_gateway(
    base_url: str, backend: ScriptedBackend
) -> None:
    backend.reply_to = parallel_policy
    calc = Calculator()

    async def main() -> tuple[Any, list[str], str]:
        async with client_for(base_url) as client:
            agent = agent_over(client, calc, include_usage=True)
            run = Runner.run_streamed(agent, "What are 2+3 and 10+20?")
            items, text = [], ""
            async for event in run.stream_events():
                if isinstance(event, RunItemStreamEvent):
                    items.append(event.name)
                elif event.type == "raw_response_event" and (
                    event.data.type == "response.output_text.delta"
                ):
                    text += event.data.delta
            return run, items, text

    run, items, text = asyncio.run(main())
    answer = "2+3 = 5 and 10+20 = 30."
    assert run.final_output == answer and text == answer
    assert sorted(calc.ran) == [("add", 2, 3), ("add", 10, 20)]
    assert items.count("tool_called") == 2 and items.count("tool_output") == 2
    assert items[-1] == "message_output_created"
    first, second = (backend.tokenizer.decode(c.prompt_ids) for c in backend.calls)
    assert second == first + parallel_policy("") + END + tool_turn("5", "30")
    # Usage came in the streams' last chunks (stream_options.include_usage).
    usage = run.context_wrapper.usage
    assert usage.requests == 2
    assert usage.input_tokens == sum(len(c.prompt_ids) for c in backend.calls)
    assert usage.output_tokens > 0


def test_agent_with_a_wrong_api_key_is_refused(base_url: str, backend: ScriptedBackend) -> None:
    backend.reply_to = chain_policy
    calc = Calculator()

    async def main() -> None:
        async with client_for(base_url, key="not-the-key") as client:
            await Runner.run(agent_over(client, calc), "What is (2+3)*4?")

    with pytest.raises(openai.AuthenticationError, match="API key"):
        asyncio.run(main())
    assert backend.calls == [] and calc.ran == []


class Answer(BaseModel):
    value: int


def json_policy(prompt: str) -> str:
    """:func:`chain_policy`, its final answer as ``Answer``'s JSON."""
    out = chain_policy(prompt)
    done = re.fullmatch(r"\(2\+3\)\*4 = (\d+)", out)
    return json.dumps({"value": int(done[1])}) if done else out


@pytest.mark.parametrize(
    ("change", "policy", "final"),
    [
        ({"model_settings": ModelSettings(tool_choice="required")}, chain_policy, "(2+3)*4 = 20"),
        ({"output_type": Answer}, json_policy, Answer(value=20)),
    ],
    ids=["tool_choice_required", "structured_output"],
)
def test_forcing_a_tool_and_structured_output_reach_the_pool_as_a_grammar(
    base_url: str,
    backend: ScriptedBackend,
    change: dict[str, Any],
    policy: Callable[[str], str],
    final: Any,
) -> None:
    """Forcing a tool call and structured output are decoded under a grammar (issue 43): the
    SDK's request reaches the pool with its constraint, and the run ends with its answer. (The
    scripted policy does not follow grammars; tests/gateway/test_structured.py decodes under
    them with the torch engine.)"""
    backend.reply_to = policy
    calc = Calculator()

    async def main() -> Any:
        async with client_for(base_url) as client:
            agent = agent_over(client, calc).clone(**change)
            return (await Runner.run(agent, "What is (2+3)*4?")).final_output

    assert asyncio.run(main()) == final
    assert backend.calls[0].sampling.grammar is not None
    assert calc.ran == [("add", 2, 3), ("multiply", 5, 4)]
