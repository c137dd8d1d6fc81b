"""Structured outputs: a request's output constraint, as vLLM's OpenAI server reads it.

One of these, as a :class:`~pearl.engines.grammar.Grammar` the engines decode under:

- ``response_format``: ``{"type": "json_object"}`` (any JSON object) or ``{"type":
  "json_schema", "json_schema": {"schema": ...}}``; ``{"type": "text"}`` is none;
- vLLM's ``structured_outputs`` (``json``, ``regex``, ``choice``, ``grammar``, ``json_object``)
  and its older ``guided_json``, ``guided_regex``, ``guided_choice``, ``guided_grammar``;
- ``tool_choice`` ``"required"`` or a named function: the output is a tool call in the chat
  template's format (``<tool_call>{"name": ..., "arguments": ...}</tool_call>``, what
  :func:`pearl.gateway.templates.parse_tool_calls` reads), its arguments valid against the
  tool's ``parameters`` schema.

A constraint llguidance cannot compile (a JSON-schema keyword it does not implement, a bad regex)
is a 400 naming the field and the compiler's reason.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from pearl.engines.grammar import Grammar, problem, schema_text
from pearl.gateway import protocol as p
from pearl.gateway.errors import refuse
from pearl.gateway.jobs import Job
from pearl.gateway.templates import TOOL_CLOSE, TOOL_OPEN

_ANY_OBJECT = '{"type":"object"}'
_GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice",
           "guided_grammar": "grammar"}  # fmt: skip
_SO_KINDS = {"json": "json", "regex": "regex", "choice": "choice", "grammar": "grammar"}


def grammar_of(req: p._Sampled) -> Grammar | None:
    """The request's constraint, checked (a 400 names the field at fault); None if it has none.
    More than one is a 400, as in vLLM."""
    found: list[tuple[str, Grammar]] = []
    rf = getattr(req, "response_format", None)
    if rf is not None:
        g = _response_format(rf)
        if g is not None:
            found.append(("response_format", g))
    so = getattr(req, "structured_outputs", None)
    if so is not None:
        found.append(("structured_outputs", _structured_outputs(so)))
    for name, kind in _GUIDED.items():
        v = getattr(req, name, None)
        if v is not None:
            found.append((name, Grammar(kind=kind, text=_text(v, kind, name))))
    tools = getattr(req, "tools", None)
    tc = getattr(req, "tool_choice", None)
    if tc is not None and tc not in ("auto", "none"):
        found.append(("tool_choice", _tool_grammar(tools or [], tc)))
    if len(found) > 1:
        names = ", ".join(n for n, _ in found)
        raise refuse(f"give one structured-output constraint, not several ({names})", found[1][0])
    if not found:
        return None
    name, g = found[0]
    why = problem(g)
    if why is not None:
        raise refuse(
            f"{name}: the {g.kind} constraint is not supported by PEARL's grammar engine "
            f"(llguidance): {why.strip()}; docs/gateway.md lists what is",
            name,
        )
    return g


def constrain(j: Job, g: Grammar | None) -> Job:
    """``j`` decoding under ``g``."""
    if g is None:
        return j
    return dataclasses.replace(j, sampling=dataclasses.replace(j.sampling, grammar=g))


def _response_format(rf: Any) -> Grammar | None:
    kind = rf.get("type") if isinstance(rf, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return Grammar(kind="json", text=_ANY_OBJECT)
    if kind == "json_schema":
        spec = rf.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if schema is None:
            schema = {}  # OpenAI: no schema is any JSON value
        if not isinstance(schema, dict | bool):
            raise refuse("response_format.json_schema.schema must be an object", "response_format")
        return Grammar(kind="json", text=schema_text(schema))
    raise refuse(
        f"response_format type {kind!r} is not supported; use 'text', 'json_object' or "
        "'json_schema'",
        "response_format",
    )


def _structured_outputs(so: Any) -> Grammar:
    if not isinstance(so, dict):
        raise refuse("structured_outputs must be an object", "structured_outputs")
    given = [k for k in (*_SO_KINDS, "json_object", "structural_tag") if so.get(k) is not None]
    if len(given) != 1:
        raise refuse(
            "structured_outputs takes exactly one of json, regex, choice, grammar, json_object; "
            f"got {given or 'none'}",
            "structured_outputs",
        )
    key = given[0]
    if key == "structural_tag":
        raise refuse("structured_outputs.structural_tag is not supported", "structured_outputs")
    if key == "json_object":
        return Grammar(kind="json", text=_ANY_OBJECT)
    kind = _SO_KINDS[key]
    return Grammar(kind=kind, text=_text(so[key], kind, f"structured_outputs.{key}"))


def _text(v: Any, kind: str, name: str) -> str:
    if kind == "json":
        if not isinstance(v, str | dict | bool):
            raise refuse(f"{name} must be a JSON schema (an object or its text)", name)
        return schema_text(v)
    if kind == "choice":
        if not (isinstance(v, list) and v and all(isinstance(c, str) for c in v)):
            raise refuse(f"{name} must be a non-empty list of strings", name)
        return json.dumps(v)
    if not isinstance(v, str) or not v:
        raise refuse(f"{name} must be a non-empty string", name)
    return v


def _tool_grammar(tools: list[Any], choice: Any) -> Grammar:
    """One tool call of ``tools`` (``choice`` = "required") or of the named one, as the chat
    template writes it: ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``, with
    ``json.dumps``'s separators (``", "``, ``": "``), as the template writes the name and the
    gateway the parsed arguments. So the call the model was made to write renders back, in the
    next turn's prompt, to the very tokens it sampled: an agent's history extends token for token
    (what :mod:`pearl.integrations.agent` needs to train on it)."""
    defs = {t.function.name: t.function for t in tools}
    if choice == "required":
        names = list(defs)
    elif isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        if name not in defs:
            raise refuse(f"tool_choice names {name!r}, which is not among tools", "tool_choice")
        names = [name]
    else:
        raise refuse(
            "tool_choice must be 'auto', 'none', 'required' or "
            '{"type": "function", "function": {"name": ...}}',
            "tool_choice",
        )
    if not names:
        raise refuse(f"tool_choice={choice!r} needs tools", "tool_choice")
    calls = [
        {
            "type": "object",
            "properties": {
                "name": {"const": n},
                "arguments": _parameters(defs[n]),
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for n in names
    ]
    schema: dict[str, Any] = calls[0] if len(calls) == 1 else {"anyOf": calls}
    schema["x-guidance"] = {
        "whitespace_flexible": False,
        "item_separator": ", ",
        "key_separator": ": ",
    }
    body = json.dumps(schema, separators=(",", ":"))
    lark = (
        f"start: {json.dumps(TOOL_OPEN + chr(10))} %json{body} {json.dumps(chr(10) + TOOL_CLOSE)}"
    )
    return Grammar(kind="grammar", text=lark)


def _parameters(fn: Any) -> Any:
    params = getattr(fn, "parameters", None)
    return params if isinstance(params, dict) and params else {"type": "object"}


__all__ = ["constrain", "grammar_of"]
