"""Chat templates and Hermes-style tool calls.

A chat is rendered to a prompt as Hugging Face's ``apply_chat_template`` renders it: the
tokenizer's Jinja template in an immutable sandbox (``trim_blocks``, ``lstrip_blocks``, the
``loopcontrols`` extension, ``{% generation %}`` blocks, a ``tojson`` that keeps non-ASCII,
``raise_exception`` and ``strftime_now``), with ``messages``, ``tools`` and
``add_generation_prompt=True``. Without a template the gateway renders ChatML with tools in the
system turn, as Qwen3's template does.

The model's tool calls are ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks
(Qwen3 / Hermes); a block that does not hold such JSON stays in the content, as it was written.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any

from jinja2 import TemplateError, nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.parser import Parser
from jinja2.sandbox import ImmutableSandboxedEnvironment

from pearl.gateway.backend import GatewayError

TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"

# ChatML as Qwen3 writes it, tools included (Hermes style), without the thinking parts.
CHATML_TEMPLATE = """\
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\\n\\n' }}
    {%- endif %}
    {{- "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n\
You are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and \
arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \
\\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'system' and loop.first %}
    {%- elif message.role == 'user' or message.role == 'system' %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
    {%- elif message.role == 'assistant' %}
        {{- '<|im_start|>assistant\\n' + message.content }}
        {%- for tool_call in message.tool_calls or [] %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {%- if message.content or not loop.first %}
                {{- '\\n' }}
            {%- endif %}
            {{- '<tool_call>\\n{"name": "' + tool_call.name + '", "arguments": ' }}
            {%- if tool_call.arguments is string %}
                {{- tool_call.arguments }}
            {%- else %}
                {{- tool_call.arguments | tojson }}
            {%- endif %}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == 'tool' %}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _raise(message: str) -> None:
    raise TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _Generation(Extension):
    """``{% generation %}...{% endgeneration %}``, which Hugging Face's templates may use to
    mark the assistant's tokens: rendered as its body."""

    tags = {"generation"}

    def parse(self, parser: Parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = self.call_method("_body")
        return nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    @staticmethod
    def _body(caller: Any) -> str:
        return str(caller())


@lru_cache(maxsize=8)
def _compile(source: str) -> Any:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols, _Generation]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


def message_dicts(messages: list[Any]) -> list[dict[str, Any]]:
    """Pydantic chat messages -> the dicts a template reads: text parts joined, ``developer``
    as ``system``, tool-call arguments as objects where they are JSON objects."""
    out = []
    for i, m in enumerate(messages):
        d = m.model_dump(exclude_none=True)
        content = m.content
        if isinstance(content, list):
            texts = []
            for part in content:
                if part.type != "text" or part.text is None:
                    raise GatewayError(
                        f"messages[{i}]: content parts of type {part.type!r} are not supported "
                        "(text only)",
                        param=f"messages[{i}].content",
                    )
                texts.append(part.text)
            content = "".join(texts)
        d["content"] = content if content is not None else ""
        if d["role"] == "developer":
            d["role"] = "system"
        for call in d.get("tool_calls", []):
            args = call["function"].get("arguments")
            if isinstance(args, str):
                try:
                    parsed = json.loads(args)
                except ValueError:
                    parsed = None
                if isinstance(parsed, dict):
                    call["function"]["arguments"] = parsed
        out.append(d)
    return out


def render(
    template: str | None,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    extra: dict[str, Any] | None = None,
    generation_prompt: bool = True,
) -> str:
    """The prompt text for a chat, ending with the assistant's generation prompt (unless
    ``generation_prompt`` is False: ``/tokenize``'s ``add_generation_prompt``)."""
    kwargs = dict(extra or {})
    kwargs.setdefault("bos_token", "")
    kwargs.setdefault("eos_token", "")
    try:
        return str(
            _compile(template or CHATML_TEMPLATE).render(
                messages=messages,
                tools=tools or None,
                add_generation_prompt=generation_prompt,
                **kwargs,
            )
        )
    except TemplateError as e:
        raise GatewayError(f"the chat template refused the messages: {e}", param="messages") from e
    except TypeError as e:
        raise GatewayError(f"the chat template could not render the messages: {e}") from e


@dataclass(frozen=True)
class ParsedCall:
    id: str
    name: str
    arguments: str  # JSON text, as OpenAI returns it


_BLOCK = re.compile(re.escape(TOOL_OPEN) + r"(.*?)" + re.escape(TOOL_CLOSE), re.DOTALL)


def _split(text: str) -> tuple[str, list[ParsedCall]]:
    """``text`` without its tool-call blocks (whitespace kept), and the calls."""
    calls: list[ParsedCall] = []

    def take(m: re.Match[str]) -> str:
        try:
            obj = json.loads(m.group(1))
        except ValueError:
            return m.group(0)
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return m.group(0)
        args = obj.get("arguments", obj.get("parameters", {}))
        calls.append(
            ParsedCall(
                id=f"call_{uuid.uuid4().hex[:24]}",
                name=obj["name"],
                arguments=args if isinstance(args, str) else json.dumps(args, ensure_ascii=False),
            )
        )
        return ""

    return _BLOCK.sub(take, text), calls


def parse_tool_calls(text: str) -> tuple[str | None, list[ParsedCall]]:
    """Split generated text into its content (stripped; None when empty) and its tool calls."""
    rest, calls = _split(text)
    return (rest.strip() or None), calls


class ToolStream:
    """Streams content up to the first ``<tool_call>`` and holds everything from there on:
    :meth:`feed` returns the text that is surely content, :meth:`finish` the held text's
    content and calls.

    The streamed content (every :meth:`feed`, then :meth:`finish`'s content) is exactly
    :func:`parse_tool_calls`' content: leading whitespace is dropped and trailing whitespace is
    held until more content follows it, so the whitespace between the content and a call never
    reaches the client (the chat template renders that separator itself; a client that sent it
    back would change the prompt's tokens)."""

    def __init__(self) -> None:
        self.held = ""
        self.in_call = False
        self.started = False  # some content was returned

    def feed(self, text: str) -> str:
        if self.in_call:
            self.held += text
            return ""
        buf = self.held + text
        if not self.started:
            buf = buf.lstrip()
        at = buf.find(TOOL_OPEN)
        if at >= 0:
            self.in_call = True
            end = at
        else:
            # Hold back a tail that could start "<tool_call>".
            end = len(buf)
            for k in range(min(len(TOOL_OPEN) - 1, len(buf)), 0, -1):
                if TOOL_OPEN.startswith(buf[-k:]):
                    end = len(buf) - k
                    break
        cut = len(buf[:end].rstrip())
        self.held = buf[cut:]
        self.started = self.started or cut > 0
        return buf[:cut]

    def finish(self) -> tuple[str | None, list[ParsedCall]]:
        held, self.held = self.held, ""
        rest, calls = _split(held)
        rest = rest.rstrip() if self.started else rest.strip()
        return (rest or None), calls
