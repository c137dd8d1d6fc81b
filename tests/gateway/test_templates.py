"""Chat templates, tool-call parsing and the incremental tool-call holder (no HTTP)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pearl.gateway import protocol as p
from pearl.gateway.app import _Detok
from pearl.gateway.backend import GatewayError
from pearl.gateway.templates import ToolStream, message_dicts, parse_tool_calls, render
from tests.gateway.scripted import ScriptedTokenizer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


def msgs(*raw: dict) -> list[dict]:
    return message_dicts([p.ChatMessage.model_validate(m) for m in raw])


def test_chatml_fallback_renders_turns_and_generation_prompt() -> None:
    text = render(None, msgs({"role": "system", "content": "Be brief."},
                             {"role": "user", "content": "Hi"}), None)  # fmt: skip
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_chatml_renders_tools_in_the_system_turn_and_tool_turns_as_qwen3_does() -> None:
    text = render(
        None,
        msgs(
            {"role": "developer", "content": "Sys."},
            {"role": "user", "content": [{"type": "text", "text": "Weather "},
                                         {"type": "text", "text": "in Paris?"}]},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function",
                 "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
            {"role": "tool", "tool_call_id": "c2", "content": "warm"},
        ),
        TOOLS,
    )  # fmt: skip
    assert text.startswith("<|im_start|>system\nSys.\n\n# Tools\n\n")
    assert "<tools>\n" + json.dumps(TOOLS[0]) + "\n</tools>" in text
    assert "<|im_start|>user\nWeather in Paris?<|im_end|>\n" in text
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": '
        '{"city": "Paris"}}\n</tool_call><|im_end|>\n'
    ) in text
    # Consecutive tool results share one user turn.
    assert (
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n"
        "<tool_response>\nwarm\n</tool_response><|im_end|>\n"
    ) in text
    assert text.endswith("<|im_start|>assistant\n")


def test_a_hugging_face_template_renders_in_the_sandbox() -> None:
    template = (
        "{% for m in messages %}{% if m.role == 'user' and m.content == 'bad' %}"
        "{{ raise_exception('no bad words') }}{% endif %}"
        "[{{ m.role }}]{{ m.content | tojson }}\n{% endfor %}"
        "{% if tools %}{{ tools[0].function.name }}{% endif %}"
        "{% if add_generation_prompt %}[assistant]{% endif %}{{ eos_token }}"
    )
    out = render(
        template=template,
        messages=msgs({"role": "user", "content": "héllo"}),
        tools=TOOLS,
        extra={"eos_token": "$"},
    )
    assert out == '[user]"héllo"\nget_weather[assistant]$'
    with pytest.raises(GatewayError, match="no bad words"):
        render(template, msgs({"role": "user", "content": "bad"}), None)
    # The sandbox refuses to reach Python internals.
    with pytest.raises(GatewayError):
        render("{{ messages.__class__.__mro__ }}{{ ''.__class__.__subclasses__() }}", [], None)


def test_generation_blocks_and_loop_controls_render_as_hugging_face_renders_them() -> None:
    template = (
        "{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}"
        "{% if m.role == 'assistant' %}{% generation %}<a>{{ m.content }}{% endgeneration %}"
        "{% else %}<u>{{ m.content }}{% endif %}{% endfor %}"
    )
    turns = msgs({"role": "user", "content": "q"}, {"role": "assistant", "content": "r"},
                 {"role": "user", "content": "dropped"})  # fmt: skip
    assert render(template, turns, None) == "<u>q<a>r"


def test_non_text_content_parts_are_refused() -> None:
    with pytest.raises(GatewayError, match="image_url"):
        msgs({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]})


def test_tool_calls_are_parsed_and_the_rest_is_content() -> None:
    content, calls = parse_tool_calls(
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
        '</tool_call>\n<tool_call>{"name": "now", "arguments": {}}</tool_call>'
    )
    assert content == "Let me check."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"}),
        ("now", {}),
    ]
    assert len({c.id for c in calls}) == 2 and all(c.id.startswith("call_") for c in calls)


def test_a_malformed_tool_call_stays_in_the_content() -> None:
    text = "<tool_call>{not json}</tool_call> and <tool_call>[1]</tool_call>"
    assert parse_tool_calls(text) == (text, [])
    assert parse_tool_calls("   ") == (None, [])


@pytest.mark.parametrize("cut", [1, 3, 7, 12])
def test_tool_stream_holds_back_a_split_tag(cut: int) -> None:
    text = 'Hi <tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>'
    ts = ToolStream()
    shown = "".join(ts.feed(text[i : i + cut]) for i in range(0, len(text), cut))
    assert shown == "Hi"
    content, calls = ts.finish()
    assert content is None and [(c.name, c.arguments) for c in calls] == [("f", '{"a": 1}')]


def test_tool_stream_releases_a_lookalike_prefix() -> None:
    ts = ToolStream()
    assert ts.feed("a <tool") == "a"
    assert ts.feed("box> b") == " <toolbox> b"
    assert ts.finish() == (None, [])


CALL = '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
PIECES = ["Hi", "x y", " ", "\n", "\n\n", CALL, "<tool", "<tool_call>", "</tool_call>", "é"]


@given(
    st.lists(st.sampled_from(PIECES), max_size=8),
    st.lists(st.integers(1, 9), min_size=1, max_size=20),
)
def test_tool_stream_streams_exactly_the_parsed_content(pieces: list[str], cuts: list[int]) -> None:
    """Whatever the cuts, the streamed content and calls are what parsing the whole text gives:
    a streamed reply re-rendered by the template is the prompt a non-streamed one would be."""
    text, ts, shown, at, k = "".join(pieces), ToolStream(), "", 0, 0
    while at < len(text):
        shown += ts.feed(text[at : at + cuts[k % len(cuts)]])
        at, k = at + cuts[k % len(cuts)], k + 1
    rest, calls = ts.finish()
    content, expected = parse_tool_calls(text)
    assert shown + (rest or "") == (content or "")
    assert [(c.name, c.arguments) for c in calls] == [(c.name, c.arguments) for c in expected]
    if calls:  # content before the first call never ends with the separator
        assert shown == shown.rstrip()


@given(st.text(max_size=40), st.lists(st.integers(1, 6), min_size=1, max_size=40))
def test_incremental_detokenizing_adds_up_to_the_whole_decode(text: str, cuts: list[int]) -> None:
    tok = ScriptedTokenizer()
    ids, parts, at, k = tok.encode(text), [], 0, 0
    detok = _Detok(tok)
    while at < len(ids):
        step = cuts[k % len(cuts)]
        part = detok.push(ids[at : at + step], final=at + step >= len(ids))
        assert "\ufffd" not in part or "\ufffd" in text
        parts.append(part)
        at, k = at + step, k + 1
    assert "".join(parts) == text
