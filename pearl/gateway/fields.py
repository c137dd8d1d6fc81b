"""The fields of an OpenAI request beyond those PEARL implements: refused, or ignored and named.

Agent frameworks and the OpenAI SDK's wrappers send more than a server reads (``service_tier``,
``prompt_cache_key``, ``safety_identifier``, ``parallel_tool_calls``, ``store``, ``metadata``,
explicit ``null`` values, ...). PEARL does what vLLM's OpenAI server does:

- an explicit ``null`` means the field's default (:func:`pearl.gateway.protocol.drop_nulls`,
  before validation);
- a field that would change the output and that PEARL does not implement yet is refused with a
  400 naming it, unless it has its no-op value (vLLM's default: ``top_k=-1``, ``n=1``, ...).
  :data:`REFUSED` is that list, in one place: implementing a field removes its entry;
- any other field a route does not read is accepted and ignored: :func:`ignored` lists them, the
  response's ``X-PEARL-Ignored-Fields`` header names them, and the first time each name is
  ignored it is logged.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from starlette.responses import Response

from pearl.gateway.errors import refuse

log = logging.getLogger("pearl.gateway")

IGNORED_HEADER = "X-PEARL-Ignored-Fields"
MAX_NAMED = 32  # names in the header; more are counted
_logged: set[str] = set()  # names already logged as ignored (bounded)
_MAX_LOGGED = 1024
_PLAIN = re.compile(r"[A-Za-z0-9_.\-]{1,64}")

CHAT, COMPLETIONS = "chat", "completions"
BOTH = frozenset({CHAT, COMPLETIONS})


def _never(_: Any) -> bool:
    return False


def _is(*values: Any) -> Callable[[Any], bool]:
    """A no-op test: the value is one of ``values`` (a bool is not a number here)."""

    def test(v: Any) -> bool:
        return any(type(v) is type(x) or (_num(v) and _num(x)) for x in values) and v in values

    return test


def _num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _empty(v: Any) -> bool:
    return v in ({}, [], "")


@dataclass(frozen=True)
class Refused:
    """A field PEARL does not implement yet: ``why`` ends the 400's message; ``noop`` accepts
    the values that change nothing."""

    why: str
    noop: Callable[[Any], bool] = _never
    routes: frozenset[str] = BOTH


_SAMPLING = "vLLM's sampling fields are not implemented yet (issue 43)"

# Fields that would change the output and that PEARL does not implement.
REFUSED: dict[str, Refused] = {
    # n > 1 samples
    "best_of": Refused("best_of > 1 is not supported", _is(1)),
    "use_beam_search": Refused("beam search is not supported", _is(False)),
    "length_penalty": Refused("length_penalty is beam search's, not supported", _is(1, 1.0)),
    # top logprobs
    "prompt_logprobs": Refused("prompt logprobs are not returned"),
    "return_tokens_as_token_ids": Refused(
        "return_tokens_as_token_ids is supported by /v1/completions only",
        _is(False),
        frozenset({CHAT}),
    ),  # fmt: skip
    # vLLM's sampling fields
    "bad_words": Refused(f"{_SAMPLING}: bad_words", _empty),
    "allowed_token_ids": Refused(f"{_SAMPLING}: allowed_token_ids"),
    "logits_processors": Refused(f"{_SAMPLING}: logits_processors"),
    "spaces_between_special_tokens": Refused(
        f"{_SAMPLING}: spaces_between_special_tokens (only true)", _is(True)
    ),
    "truncate_prompt_tokens": Refused("truncate_prompt_tokens is not supported"),
    # structured outputs (pearl.gateway.structured implements the others)
    "structural_tag": Refused("structural_tag is not supported (structured outputs)"),
    # what the prompt is made of
    "echo": Refused("echo is not supported", _is(False)),
    "suffix": Refused("suffix is not supported", _empty, frozenset({COMPLETIONS})),
    "add_generation_prompt": Refused(
        "add_generation_prompt=false is not supported", _is(True), frozenset({CHAT})
    ),
    "continue_final_message": Refused(
        "continue_final_message is not supported", _is(False), frozenset({CHAT})
    ),
    "chat_template": Refused(
        "a request's own chat_template is not supported: the model's is used",
        routes=frozenset({CHAT}),
    ),
    "documents": Refused("documents are not supported", _empty, frozenset({CHAT})),
}


def check(req: BaseModel, route: str) -> None:
    """Refuse (400, naming it) a field of :data:`REFUSED` that ``req`` gives a value that is not
    its no-op."""
    given = req.model_fields_set | set(req.model_extra or ())
    for name in sorted(given):
        rule = REFUSED.get(name)
        if rule is None or route not in rule.routes:
            continue
        value = getattr(req, name, None)
        if value is not None and not rule.noop(value):
            raise refuse(rule.why, name)


def ignored(req: BaseModel, route: str, nested: Iterable[str] = ("stream_options",)) -> list[str]:
    """The fields of ``req`` that no route reads and that :func:`check` did not refuse: the
    extra ones, at the top level and in ``nested`` objects (``stream_options.x``)."""
    names = [n for n in (req.model_extra or {}) if not _refused_here(n, route)]
    for field in nested:
        inner = getattr(req, field, None)
        if isinstance(inner, BaseModel):
            names.extend(f"{field}.{n}" for n in inner.model_extra or {})
    for n in names:
        if n not in _logged and len(_logged) < _MAX_LOGGED:
            _logged.add(n)
            log.info("gateway: ignoring the request field %r (accepted, as vLLM does)", n)
    return names


def _refused_here(name: str, route: str) -> bool:
    rule = REFUSED.get(name)
    return rule is not None and route in rule.routes


def header_value(names: list[str]) -> str:
    """``names`` as the header's value: comma-separated, each in printable ASCII, at most
    :data:`MAX_NAMED` of them, then ``+N more``."""
    shown = [n if _PLAIN.fullmatch(n) else _ascii(n) for n in names[:MAX_NAMED]]
    if len(names) > MAX_NAMED:
        shown.append(f"+{len(names) - MAX_NAMED} more")
    return ",".join(shown)


def mark(response: Response, names: list[str]) -> Response:
    """``response`` with the header naming the ignored fields ``names``, if any."""
    if names:
        response.headers[IGNORED_HEADER] = header_value(names)
    return response


def _ascii(name: str) -> str:
    text = name[:64].encode("ascii", "backslashreplace").decode("ascii")
    return "".join(c if c.isprintable() and c != "," else "?" for c in text)


__all__ = [
    "IGNORED_HEADER",
    "REFUSED",
    "Refused",
    "check",
    "header_value",
    "ignored",
    "mark",
]
