"""A generation request, checked: what the three generation APIs share before the backend.

A :class:`Job` is the prompt's ids, the sampling (its stop ids include the tokenizer's EOS
unless the request ignores it), the session and the stop strings. Every refusal is a 400 that
names the field at fault; the backend only sees ids of the served model's vocabulary, a prompt
that fits its context and a limit that fits beside it.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import Request

from pearl.gateway import fields
from pearl.gateway import protocol as p
from pearl.gateway import stops as stops_mod
from pearl.gateway.backend import GatewayError, Sampling
from pearl.gateway.context import Context
from pearl.gateway.errors import refuse
from pearl.gateway.sessions import session_problem

SESSION_HEADER = "x-session-id"


@dataclass(frozen=True)
class Job:
    """One validated generation request."""

    rid: str
    prompt_ids: list[int]
    sampling: Sampling
    session: str
    stop: stops_mod.Stops = ()  # stop strings (pearl.gateway.stops)
    keep_stop: bool = False  # the text keeps the stop string or token that ended it
    specials: bool = False  # the text keeps special tokens (skip_special_tokens=false)

    def text_ids(self, ids: Sequence[int], final: bool, finish: str | None) -> Sequence[int]:
        """``ids`` without a final stop token (text leaves it out, unless it keeps it)."""
        if self.keep_stop:
            return ids
        if final and finish == "stop" and ids and ids[-1] in self.sampling.stop_ids:
            return ids[:-1]
        return ids


def check_model(ctx: Context, model: str | None) -> None:
    """``model`` is the one this gateway serves (None: a route where it is optional); else 404
    ``model_not_found``, as vLLM and OpenAI answer."""
    if model is not None and model != ctx.backend.model:
        raise GatewayError(
            f"the model {model!r} does not exist; this gateway serves {ctx.backend.model!r}",
            status=404,
            kind="invalid_request_error",
            param="model",
            code="model_not_found",
        )


def check_text(req: p.BaseModel) -> None:
    """Every string of the request is text (no lone surrogate): it can be encoded."""
    where = p.bad_text(req)
    if where is not None:
        raise refuse(
            f"{where or 'the body'} is not valid Unicode text (a lone surrogate such as "
            "\\ud800); send text that encodes as UTF-8",
            where or None,
        )


def check_common(ctx: Context, req: p._Sampled, route: str) -> None:
    """What chat and completions (``route``) refuse alike: bad text, another model, a field
    PEARL does not implement yet (:data:`pearl.gateway.fields.REFUSED`)."""
    check_text(req)
    check_model(ctx, req.model)
    fields.check(req, route)


def check_ids(ctx: Context, ids: Sequence[int], param: str | None) -> None:
    """Token ids of the served model's vocabulary: in [0, vocab_size)."""
    if not ids:
        return
    vocab = ctx.backend.vocab_size
    low, high = min(ids), max(ids)
    if low < 0 or high >= vocab:
        bad = low if low < 0 else high
        raise refuse(
            f"token id {bad} is outside the vocabulary of {ctx.backend.model!r}: "
            f"token ids are 0 to {vocab - 1}",
            param,
        )


def session_of(request: Request, user: str | None) -> str:
    """The ``X-Session-ID`` header, else ``user``, else "" (at most 256 bytes)."""
    header = request.headers.get(SESSION_HEADER)
    session = header or user or ""
    problem = session_problem(session)
    if problem is not None:
        raise refuse(problem, "X-Session-ID" if header else "user")
    return session


def job(
    ctx: Context,
    prefix: str,
    prompt_ids: list[int],
    *,
    max_tokens: int | None,
    param: str,
    temperature: float | None,
    top_p: float | None,
    seed: int | None,
    stop_ids: Sequence[int] | None,
    session: str,
    rid: str | None = None,
    eos: bool = True,
    stop: stops_mod.Stops = (),
    stop_param: str = "stop_token_ids",
    prompt_param: str | None = None,
    knobs: Mapping[str, Any] | None = None,
    top_logprobs: int = 0,
    keep_stop: bool = False,
    specials: bool = False,
) -> Job:
    """A validated request: the prompt's ids and ``stop_ids`` are the model's, the prompt
    fits, the limit (``param``) fits beside it, and it stops at ``stop_ids``, (``eos``) the
    tokenizer's EOS, where it has one, and ``stop`` strings. ``stop_param`` and
    ``prompt_param`` name the fields in an error; the request id is ``rid`` or
    ``prefix``-random. ``knobs``: vLLM's sampling fields, checked
    (:func:`pearl.gateway.sampling.knobs`); ``top_logprobs``: alternatives per token;
    ``keep_stop`` and ``specials``: the text keeps its stop and its special tokens."""
    n, limit = len(prompt_ids), ctx.backend.max_context
    if n == 0:
        raise refuse("the prompt is empty", prompt_param)
    check_ids(ctx, prompt_ids, prompt_param)
    if n >= limit:
        raise refuse(
            f"the prompt is {n} tokens; the context holds {limit}, "
            "with room for at least one generated token",
            None,
        )
    if max_tokens is None:
        max_tokens = limit - n
    elif n + max_tokens > limit:
        raise refuse(
            f"{param}={max_tokens} plus the prompt's {n} tokens is beyond the "
            f"context of {limit} tokens (at most {limit - n})",
            param,
        )
    check_ids(ctx, stop_ids or [], stop_param)
    eos_id = ctx.tok.eos_id
    stops = [*([eos_id] if eos and eos_id >= 0 else []), *(stop_ids or [])]
    sampling = Sampling(
        max_new_tokens=max_tokens,
        temperature=1.0 if temperature is None else temperature,
        top_p=1.0 if top_p is None else top_p,
        seed=seed,
        stop_ids=tuple(dict.fromkeys(stops)),
        top_logprobs=top_logprobs,
        **(knobs or {}),
    )
    return Job(
        rid=rid or f"{prefix}-{uuid.uuid4().hex}",
        prompt_ids=prompt_ids,
        sampling=sampling,
        session=session,
        stop=stop,
        keep_stop=keep_stop,
        specials=specials,
    )


__all__ = [
    "SESSION_HEADER",
    "Job",
    "check_common",
    "check_ids",
    "check_model",
    "check_text",
    "job",
    "session_of",
]
