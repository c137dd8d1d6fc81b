"""Structured outputs through the real agent frameworks, against the torch engine with random
weights: whatever the model "wants", each result parses into its schema or tool call.

One embedded Runtime (configs/local-cpu.toml, torch workers of the tiny random preset) serves
them all; each framework sends its default structured request (response_format json_schema,
tool_choice required or named) and validates the answer with its own parser.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from pydantic import BaseModel, Field

from pearl.testing.wait import wait_until
from tests.gateway.conftest import local_runtime
from tests.gateway.test_poison import free_port

pytestmark = [pytest.mark.slow, pytest.mark.shared_actors]  # one Runtime for the module
MODEL = "tiny"
KEY = "none"
ROOT = Path(__file__).resolve().parents[2]
INSTRUCTOR_PYTHON = ROOT / ".venv-instructor" / "bin" / "python"


class City(BaseModel):  # bounded, so a random model's output ends within the context
    name: str = Field(max_length=24)
    population: int = Field(ge=0, le=10**9)
    capital: bool


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    sets = ("rl.env=", "daemon.borrow=never", "daemon.tick_s=0.1",
            f"gateway.listen=127.0.0.1:{port}", f"gateway.model={MODEL}",
            "workload.max_trajectory_tokens=2048")  # fmt: skip
    tmp: Path = tmp_path_factory.mktemp("structured")
    with local_runtime(tmp, sets) as rt:
        wait_until(
            lambda: any(w.activity == "active" and w.role != "training"
                        for w in rt.status().workers),
            120, "a torch worker serving", every=0.2,
        )  # fmt: skip
        yield f"http://127.0.0.1:{port}"


def test_vllm_fields_decode_under_their_grammar_and_a_bad_schema_is_a_400(url: str) -> None:
    hi = [{"role": "user", "content": "hi"}]
    with httpx.Client(base_url=url, timeout=120) as c:
        r = c.post("/v1/completions", json={"model": MODEL, "prompt": "x",
                                            "guided_choice": ["yes", "no"]})  # fmt: skip
        assert r.status_code == 200 and r.json()["choices"][0]["text"] in ("yes", "no")
        so = {"json": City.model_json_schema()}
        r = c.post("/v1/completions", json={"model": MODEL, "prompt": "x",
                                            "structured_outputs": so})  # fmt: skip
        City.model_validate_json(r.json()["choices"][0]["text"])
        bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"if": {}}}}
        r = c.post("/v1/chat/completions", json={"model": MODEL, "messages": hi,
                                                 "response_format": bad})  # fmt: skip
        assert r.status_code == 400 and r.json()["error"]["param"] == "response_format"
        assert '"if"' in r.json()["error"]["message"]


def test_pydantic_ai_output_type_tool_and_native(url: str) -> None:
    from pydantic_ai import Agent, NativeOutput
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    model = OpenAIChatModel(MODEL, provider=OpenAIProvider(base_url=f"{url}/v1", api_key=KEY))
    for output in (City, NativeOutput(City)):
        agent = Agent(model, output_type=output, retries=0)
        out = agent.run_sync("A city, please.").output
        assert isinstance(out, City)


def test_langchain_with_structured_output_json_schema_and_function_calling(url: str) -> None:
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model=MODEL, base_url=f"{url}/v1", api_key=KEY, max_retries=0)
    for method in ("json_schema", "function_calling"):
        out = llm.with_structured_output(City, method=method).invoke("A city, please.")
        assert isinstance(out, City), method


def test_openai_agents_output_type(url: str) -> None:
    import agents
    from agents import Agent, OpenAIChatCompletionsModel, Runner
    from openai import AsyncOpenAI

    agents.set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
    model = OpenAIChatCompletionsModel(model=MODEL, openai_client=client)
    agent = Agent(name="cities", instructions="Name a city.", model=model, output_type=City)
    out = Runner.run_sync(agent, "A city, please.").final_output
    assert isinstance(out, City)


def test_litellm_tool_choice_required(url: str) -> None:
    import litellm

    fn = {"name": "record_city", "parameters": City.model_json_schema()}
    tools = [{"type": "function", "function": fn}]
    r = litellm.completion(
        model=f"openai/{MODEL}", api_base=f"{url}/v1", api_key=KEY, tools=tools,
        tool_choice="required", messages=[{"role": "user", "content": "A city, please."}],
    )  # fmt: skip
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "record_city"
    City.model_validate(json.loads(call.function.arguments))


def test_instructor_tools_and_json_schema(url: str) -> None:
    """instructor lives in an environment of its own (deploy/instructor.txt): its client runs
    there, against this gateway, and must get a valid City in both modes at the first try."""
    if not INSTRUCTOR_PYTHON.exists():
        pytest.skip("no .venv-instructor: `make test` creates it")
    script = Path(__file__).with_name("instructor_client.py")
    proc = subprocess.run(
        [str(INSTRUCTOR_PYTHON), str(script), url, KEY, MODEL],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    modes = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [m["mode"] for m in modes] == ["tool_call", "json_schema_mode"]
    for m in modes:
        City.model_validate(m["city"])
