"""The gateway's FastAPI application: OpenAI's chat and completions, SGLang's ``/generate``,
and PEARL's control routes, over one :class:`~pearl.gateway.backend.Backend`.

Rules:
- Every answer that is not a success is an OpenAI error body
  (``{"error": {"message", "type", "param", "code"}}``): 400 for bad input (malformed JSON,
  unknown model, unsupported parameters, named), the :class:`~pearl.gateway.guard.Guard`'s
  refusals (401, 403, 408, 413, 415, 421, 429) before any route runs, a
  :class:`GatewayError`'s own status, 500 for anything unexpected. No error stops the app; an
  error after a stream began is its last event.
- The API key, when set, guards every route; the comparison takes constant time.
- Token-exact: ``token_ids`` are every generated id, the stop token included; text leaves out a
  final stop token. Weight versions come as ``[[first token index, version], ...]``.
- Stop strings end a response where its text first holds one (:mod:`pearl.gateway.stops`).
- The session is the ``X-Session-ID`` header, else the request's ``user``, else "": at most
  256 bytes (400 beyond).
"""

from __future__ import annotations

import json
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from pearl.core import events as ev
from pearl.gateway import chat as chat_mod
from pearl.gateway import protocol as p
from pearl.gateway import stops as stops_mod
from pearl.gateway.backend import Backend, Delta, GatewayError, Sampling
from pearl.gateway.guard import Guard, origin_of
from pearl.gateway.sessions import session_problem

log = logging.getLogger("pearl.gateway")

EVENT_KINDS = tuple(c.KIND for c in ev.ELASTIC_EVENTS)
SESSION_HEADER = "x-session-id"

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    421: "invalid_request_error",
    429: "rate_limit_error",
}


def error_body(
    message: str,
    status: int,
    kind: str | None = None,
    param: str | None = None,
    code: str | None = None,
) -> dict[str, Any]:
    kind = kind or _ERROR_TYPES.get(status, "server_error" if status >= 500 else "api_error")
    # An error may quote the client's input, lone surrogates included: they must not make the
    # error itself unencodable.
    message, param = _text(message), None if param is None else _text(param)
    return p.ErrorResponse(
        error=p.ErrorBody(message=message, type=kind, param=param, code=code)
    ).model_dump()


def _text(s: str) -> str:
    """``s`` as text that UTF-8 can encode (a lone surrogate becomes "?")."""
    return s.encode("utf-8", "replace").decode("utf-8") if not s.isascii() else s


def _error_response(e: GatewayError) -> JSONResponse:
    headers = None
    if e.retry_after_s is not None:
        headers = {"Retry-After": str(max(1, math.ceil(e.retry_after_s)))}
    return JSONResponse(
        error_body(e.message, e.status, e.kind, e.param), status_code=e.status, headers=headers
    )


@dataclass
class _Acc:
    """A response's tokens as its deltas arrive."""

    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[tuple[int, int]] = field(default_factory=list)
    last_version: int = 0
    finish: str | None = None
    recomputed: int = 0
    migrations: int = 0

    def add(self, d: Delta) -> None:
        if len(d.logprobs) != len(d.token_ids):
            raise GatewayError(
                "the backend sent a delta whose logprobs do not match its tokens",
                500,
                "server_error",
            )
        if d.token_ids and (not self.versions or self.versions[-1][1] != d.weight_version):
            self.versions.append((len(self.ids), d.weight_version))
        self.ids.extend(d.token_ids)
        self.logprobs.extend(d.logprobs)
        self.last_version = d.weight_version
        self.finish = d.finish_reason
        self.recomputed += d.recomputed_tokens
        self.migrations += d.migrations

    def usage(self, prompt_tokens: int) -> p.Usage:
        n = len(self.ids)
        return p.Usage(
            prompt_tokens=prompt_tokens,
            completion_tokens=n,
            total_tokens=prompt_tokens + n,
            recomputed_tokens=self.recomputed,
            migrations=self.migrations,
        )

    def versions_out(self) -> list[tuple[int, int]]:
        return self.versions or [(0, self.last_version)]


@dataclass(frozen=True)
class _Job:
    """One validated generation request."""

    rid: str
    prompt_ids: list[int]
    sampling: Sampling
    session: str
    stop: stops_mod.Stops = ()  # stop strings (pearl.gateway.stops)

    def text_ids(self, ids: Sequence[int], final: bool, finish: str | None) -> Sequence[int]:
        """``ids`` without a final stop token (text leaves it out)."""
        if final and finish == "stop" and ids and ids[-1] in self.sampling.stop_ids:
            return ids[:-1]
        return ids


class _Detok:
    """Incremental detokenizer: the text that ids add as they arrive. It decodes a window (the
    ids since the last emission but one) and holds back an incomplete character (a trailing
    U+FFFD) until the next ids complete it, so the cost per delta does not grow with the
    response."""

    def __init__(self, tokenizer: Any) -> None:
        self.tok = tokenizer
        self.ids: list[int] = []
        self.prefix = self.read = 0  # window start; end of the ids already emitted

    def push(self, ids: Sequence[int], final: bool = False) -> str:
        self.ids.extend(ids)
        before = self.tok.decode(self.ids[self.prefix : self.read])
        after = self.tok.decode(self.ids[self.prefix :])
        if len(after) <= len(before) or (after.endswith("\ufffd") and not final):
            return ""
        self.prefix, self.read = self.read, len(self.ids)
        return str(after[len(before) :])


def _sse(obj: Any) -> str:
    if isinstance(obj, p.BaseModel):
        obj = obj.model_dump(mode="json")
    return f"data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n"


class _EventStream(StreamingResponse):
    """A server-sent-events response."""

    def __init__(self, body: AsyncIterator[str]) -> None:
        super().__init__(
            body,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )


def _refuse(message: str, param: str | None) -> GatewayError:
    return GatewayError(message, 400, "invalid_request_error", param)


def _is_union_tag(part: object) -> bool:
    return isinstance(part, str) and (
        part in {"str", "int", "float", "bool", "dict", "list", "none"} or "[" in part
    )


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    err = exc.errors()[0]
    # The location without "body" and without pydantic's union-member tags ("str", "list[int]").
    loc = [str(x) for x in err.get("loc", ()) if x != "body" and not _is_union_tag(x)]
    param = ".".join(loc) or None
    if err.get("type") == "json_invalid":
        return f"malformed JSON body: {err.get('ctx', {}).get('error', err.get('msg'))}", None
    if err.get("type") == "extra_forbidden":
        return f"unsupported parameter: {param!r}", param
    if err.get("type") == "missing":
        return f"missing required parameter: {param!r}", param
    return f"invalid {param or 'body'}: {err.get('msg')}", param


def build_app(
    backend: Backend,
    *,
    api_key: str | None = None,
    max_body_bytes: int = 1 << 20,
    max_streams: int = 256,
    body_timeout_s: float = 30.0,
    allowed_origins: Sequence[str] = (),
) -> FastAPI:
    """The gateway over ``backend``; ``api_key`` None serves without authentication. At most
    ``max_streams`` generation requests, streamed or not, run at once; the other bounds and
    checks are the :class:`~pearl.gateway.guard.Guard`'s. Pages from ``allowed_origins`` get
    CORS answers (preflights included)."""
    app = FastAPI(title="PEARL gateway", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(
        Guard,
        api_key=api_key,
        max_body_bytes=max_body_bytes,
        max_requests=max_streams,
        body_timeout_s=body_timeout_s,
        allowed_origins=allowed_origins,
    )
    if allowed_origins:  # outside the guard: a preflight carries no API key
        app.add_middleware(
            CORSMiddleware,
            allow_origins=[origin_of(o) for o in allowed_origins],
            allow_methods=["GET", "POST"],
            allow_headers=["authorization", "content-type", SESSION_HEADER],
        )
    created = int(time.time())
    tok = backend.tokenizer

    @app.exception_handler(GatewayError)
    async def _gateway_error(_: Request, e: GatewayError) -> JSONResponse:
        return _error_response(e)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, e: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(e)
        return _error_response(_refuse(message, param))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, e: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(error_body(str(e.detail), e.status_code), status_code=e.status_code)

    # --- shared validation -----------------------------------------------------------------

    def check_model(model: str) -> None:
        if model != backend.model:
            raise GatewayError(
                f"unknown model {model!r}; this gateway serves {backend.model!r}",
                400,
                "invalid_request_error",
                "model",
            )

    def check_text(req: p.BaseModel) -> None:
        """Every string of the request is text (no lone surrogate): it can be encoded."""
        where = p.bad_text(req)
        if where is not None:
            raise _refuse(
                f"{where or 'the body'} is not valid Unicode text (a lone surrogate such as "
                "\\ud800); send text that encodes as UTF-8",
                where or None,
            )

    def check_common(req: p._Sampled) -> None:
        check_text(req)
        check_model(req.model)
        if req.n not in (None, 1):
            raise _refuse("n > 1 is not supported: one choice per request", "n")
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(req, name):
                raise _refuse(f"{name} is not supported (only 0)", name)
        if req.logit_bias:
            raise _refuse("logit_bias is not supported", "logit_bias")

    def check_ids(ids: Sequence[int], param: str | None) -> None:
        """Token ids of the served model's vocabulary: in [0, vocab_size)."""
        if not ids:
            return
        vocab = backend.vocab_size
        low, high = min(ids), max(ids)
        if low < 0 or high >= vocab:
            bad = low if low < 0 else high
            raise _refuse(
                f"token id {bad} is outside the vocabulary of {backend.model!r}: "
                f"token ids are 0 to {vocab - 1}",
                param,
            )

    def job(
        prefix: str,
        prompt_ids: list[int],
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
    ) -> _Job:
        """A validated request: the prompt's ids and ``stop_ids`` are the model's, the prompt
        fits, the limit fits beside it, and it stops at ``stop_ids``, (``eos``) the tokenizer's
        EOS, where it has one, and ``stop`` strings. ``stop_param`` and ``prompt_param`` name
        the fields in an error."""
        n, ctx = len(prompt_ids), backend.max_context
        if n == 0:
            raise _refuse("the prompt is empty", prompt_param)
        check_ids(prompt_ids, prompt_param)
        if n >= ctx:
            raise _refuse(
                f"the prompt is {n} tokens; the context holds {ctx}, "
                "with room for at least one generated token",
                None,
            )
        if max_tokens is None:
            max_tokens = ctx - n
        elif n + max_tokens > ctx:
            raise _refuse(
                f"{param}={max_tokens} plus the prompt's {n} tokens is beyond the "
                f"context of {ctx} tokens (at most {ctx - n})",
                param,
            )
        check_ids(stop_ids or [], stop_param)
        stops = [*([tok.eos_id] if eos and tok.eos_id >= 0 else []), *(stop_ids or [])]
        sampling = Sampling(
            max_new_tokens=max_tokens,
            temperature=1.0 if temperature is None else temperature,
            top_p=1.0 if top_p is None else top_p,
            seed=seed,
            stop_ids=tuple(dict.fromkeys(stops)),
        )
        return _Job(rid or f"{prefix}-{uuid.uuid4().hex}", prompt_ids, sampling, session, stop)

    def session_of(request: Request, user: str | None) -> str:
        header = request.headers.get(SESSION_HEADER)
        session = header or user or ""
        problem = session_problem(session)
        if problem is not None:
            raise _refuse(problem, "X-Session-ID" if header else "user")
        return session

    async def deltas(j: _Job) -> AsyncIterator[Delta]:
        """The backend's deltas up to the one that finishes; the backend's generator is
        closed however this ends (a client that left, an error)."""
        it = backend.generate(j.rid, j.prompt_ids, j.sampling, j.session)
        seen: list[int] = []
        try:
            async for d in it:
                if j.stop and d.token_ids:
                    k = stops_mod.stop_at(tok, seen, d.token_ids, j.stop)
                    if k is not None:  # ends here; closing `it` aborts the rest in the pool
                        ids, lps = d.token_ids[:k], d.logprobs[:k]
                        d = replace(d, token_ids=ids, logprobs=lps, finish_reason="stop")
                seen.extend(d.token_ids)
                yield d
                if d.finish_reason is not None:
                    return
        finally:
            aclose = getattr(it, "aclose", None)
            if aclose is not None:
                await aclose()
        raise GatewayError(
            "the backend ended the response without a finish reason", 500, "server_error"
        )

    async def collect(j: _Job) -> _Acc:
        acc = _Acc()
        async for d in deltas(j):
            acc.add(d)
        return acc

    def stream_error(e: Exception) -> str:
        if isinstance(e, GatewayError):
            return _sse(error_body(e.message, e.status, e.kind, e.param))
        log.exception("gateway: unexpected error in a stream")
        return _sse(error_body(f"internal error: {type(e).__name__}: {e}", 500))

    def token_text(i: int) -> str:
        return str(tok.decode([i]))

    def chat_logprobs(ids: Sequence[int], lps: Sequence[float]) -> p.ChoiceLogprobs:
        content = []
        for i, lp in zip(ids, lps, strict=True):
            t = token_text(i)
            content.append(p.TokenLogprob(token=t, logprob=lp, bytes=list(t.encode())))
        return p.ChoiceLogprobs(content=content)

    def completion_logprobs(
        ids: Sequence[int], lps: Sequence[float], offset: int
    ) -> p.CompletionLogprobs:
        tokens, offsets = [], []
        for i in ids:
            t = token_text(i)
            tokens.append(t)
            offsets.append(offset)
            offset += len(t)
        return p.CompletionLogprobs(tokens=tokens, token_logprobs=list(lps), text_offset=offsets)

    # --- routes ----------------------------------------------------------------------------

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = p.ModelCard(id=backend.model, created=created, max_model_len=backend.max_context)
        return p.ModelList(data=[card]).model_dump(mode="json")

    @app.get("/v1/models/{model:path}")
    async def model(model: str) -> dict[str, Any]:
        if model != backend.model:
            raise GatewayError(f"unknown model {model!r}", 404, "not_found_error", "model")
        card = p.ModelCard(id=backend.model, created=created, max_model_len=backend.max_context)
        return card.model_dump(mode="json")

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(req: p.ChatRequest, request: Request) -> Any:
        check_common(req)
        if req.top_logprobs:
            raise _refuse(
                "top_logprobs is not supported (only the sampled tokens' logprobs: logprobs=true)",
                "top_logprobs",
            )
        if req.response_format and req.response_format.get("type") != "text":
            raise _refuse("response_format is not supported (only type 'text')", "response_format")
        choice = req.tool_choice
        if choice not in (None, "auto", "none"):
            raise _refuse("tool_choice must be 'auto' or 'none'", "tool_choice")
        use_tools = bool(req.tools) and choice != "none"
        if req.max_tokens is not None and req.max_completion_tokens is not None:
            raise _refuse("give max_tokens or max_completion_tokens, not both", "max_tokens")
        messages = chat_mod.message_dicts(req.messages)
        tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
        extra = dict(req.chat_template_kwargs or {})
        extra.setdefault("eos_token", token_text(tok.eos_id) if tok.eos_id >= 0 else "")
        text = chat_mod.render(backend.chat_template, messages, tools, extra)
        limit_param = "max_completion_tokens" if req.max_completion_tokens else "max_tokens"
        j = job(
            "chatcmpl",
            list(tok.encode(text)),
            req.max_completion_tokens or req.max_tokens,
            limit_param,
            req.temperature,
            req.top_p,
            req.seed,
            req.stop_token_ids,
            session_of(request, req.user),
            eos=not req.ignore_eos,
            stop=stops_mod.stops_of(req.stop, "stop"),
            prompt_param="messages",
        )
        want_ids, want_lp = bool(req.return_token_ids), bool(req.logprobs)
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return _EventStream(
                chat_stream(j, req.model, want_ids, want_lp, use_tools, include_usage)
            )
        acc = await collect(j)
        out = stops_mod.cut(tok.decode(j.text_ids(acc.ids, True, acc.finish)), j.stop)
        content, calls = chat_mod.parse_tool_calls(out) if use_tools else (out, [])
        message = p.ResponseMessage(
            content=content,
            tool_calls=[
                p.ResponseToolCall(
                    id=c.id, function=p.ResponseFunction(name=c.name, arguments=c.arguments)
                )
                for c in calls
            ]
            or None,
        )
        resp = p.ChatResponse(
            id=j.rid,
            created=int(time.time()),
            model=req.model,
            usage=acc.usage(len(j.prompt_ids)),
            prompt_token_ids=j.prompt_ids if want_ids else None,
            choices=[
                p.ChatChoice(
                    message=message,
                    finish_reason="tool_calls" if calls else str(acc.finish),
                    logprobs=chat_logprobs(acc.ids, acc.logprobs) if want_lp else None,
                    token_ids=acc.ids if want_ids else None,
                    weight_version=acc.last_version,
                    weight_versions=acc.versions_out(),
                )
            ],
        )
        return JSONResponse(resp.model_dump(mode="json"))

    async def chat_stream(
        j: _Job,
        model_name: str,
        want_ids: bool,
        want_lp: bool,
        use_tools: bool,
        include_usage: bool,
    ) -> AsyncIterator[str]:
        now = int(time.time())

        def chunk(**choice: Any) -> p.ChatChunk:
            return p.ChatChunk(
                id=j.rid, created=now, model=model_name, choices=[p.ChunkChoice(**choice)]
            )

        first = chunk(delta=p.ChunkDelta(role="assistant", content=""))
        if want_ids:
            first.prompt_token_ids = j.prompt_ids
        yield _sse(first)
        acc, detok, held = _Acc(), _Detok(tok), chat_mod.ToolStream() if use_tools else None
        stopper = stops_mod.StopText(j.stop)
        try:
            async for d in deltas(j):
                acc.add(d)
                final = d.finish_reason is not None
                text = detok.push(j.text_ids(d.token_ids, final, d.finish_reason), final)
                text = stopper.push(text, final)
                if held is not None:
                    text = held.feed(text)
                if text or want_ids or want_lp:
                    yield _sse(
                        chunk(
                            delta=p.ChunkDelta(content=text),
                            logprobs=chat_logprobs(d.token_ids, d.logprobs) if want_lp else None,
                            token_ids=list(d.token_ids) if want_ids else None,
                            weight_version=d.weight_version,
                        )
                    )
            calls: list[chat_mod.ParsedCall] = []
            if held is not None:
                rest, calls = held.finish()
                if rest:
                    yield _sse(chunk(delta=p.ChunkDelta(content=rest)))
                for k, c in enumerate(calls):
                    yield _sse(
                        chunk(
                            delta=p.ChunkDelta(
                                tool_calls=[
                                    p.DeltaToolCall(
                                        index=k,
                                        id=c.id,
                                        type="function",
                                        function=p.DeltaFunction(
                                            name=c.name, arguments=c.arguments
                                        ),
                                    )
                                ]
                            )
                        )
                    )
            finish = "tool_calls" if calls else str(acc.finish)
            yield _sse(
                chunk(delta=p.ChunkDelta(), finish_reason=finish, weight_version=acc.last_version)
            )
            if include_usage:
                yield _sse(
                    p.ChatChunk(
                        id=j.rid,
                        created=now,
                        model=model_name,
                        choices=[],
                        usage=acc.usage(len(j.prompt_ids)),
                    )
                )
        except Exception as e:
            yield stream_error(e)
        yield "data: [DONE]\n\n"

    @app.post("/v1/completions", response_model=None)
    async def completions(req: p.CompletionRequest, request: Request) -> Any:
        check_common(req)
        if req.logprobs:
            raise _refuse(
                "logprobs=N>0 asks for top alternatives, which are not returned; "
                "logprobs=0 returns the sampled tokens' logprobs",
                "logprobs",
            )
        if req.echo:
            raise _refuse("echo is not supported", "echo")
        if req.suffix:
            raise _refuse("suffix is not supported", "suffix")
        if req.best_of not in (None, 1):
            raise _refuse("best_of > 1 is not supported", "best_of")
        if isinstance(req.prompt, str):
            prompt_ids = list(tok.encode(req.prompt))
        else:
            prompt_ids = list(req.prompt)
        j = job(
            "cmpl",
            prompt_ids,
            req.max_tokens,
            "max_tokens",
            req.temperature,
            req.top_p,
            req.seed,
            req.stop_token_ids,
            session_of(request, req.user),
            eos=not req.ignore_eos,
            stop=stops_mod.stops_of(req.stop, "stop"),
            prompt_param="prompt",
        )
        want_ids, want_lp = bool(req.return_token_ids), req.logprobs is not None
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return _EventStream(completion_stream(j, req.model, want_ids, want_lp, include_usage))
        acc = await collect(j)
        text = stops_mod.cut(tok.decode(j.text_ids(acc.ids, True, acc.finish)), j.stop)
        resp = p.CompletionResponse(
            id=j.rid,
            created=int(time.time()),
            model=req.model,
            usage=acc.usage(len(j.prompt_ids)),
            prompt_token_ids=j.prompt_ids if want_ids else None,
            choices=[
                p.CompletionChoice(
                    text=text,
                    finish_reason=acc.finish,
                    logprobs=completion_logprobs(acc.ids, acc.logprobs, 0) if want_lp else None,
                    token_ids=acc.ids if want_ids else None,
                    prompt_token_ids=j.prompt_ids if want_ids else None,
                    weight_version=acc.last_version,
                    weight_versions=acc.versions_out(),
                )
            ],
        )
        return JSONResponse(resp.model_dump(mode="json"))

    async def completion_stream(
        j: _Job, model_name: str, want_ids: bool, want_lp: bool, include_usage: bool
    ) -> AsyncIterator[str]:
        now = int(time.time())
        acc, detok, offset, first = _Acc(), _Detok(tok), 0, True
        stopper = stops_mod.StopText(j.stop)
        try:
            async for d in deltas(j):
                acc.add(d)
                final = d.finish_reason is not None
                text = detok.push(j.text_ids(d.token_ids, final, d.finish_reason), final)
                text = stopper.push(text, final)
                resp = p.CompletionResponse(
                    id=j.rid,
                    created=now,
                    model=model_name,
                    choices=[
                        p.CompletionChoice(
                            text=text,
                            finish_reason=d.finish_reason,
                            logprobs=completion_logprobs(d.token_ids, d.logprobs, offset)
                            if want_lp
                            else None,
                            token_ids=list(d.token_ids) if want_ids else None,
                            prompt_token_ids=j.prompt_ids if want_ids and first else None,
                            weight_version=d.weight_version,
                        )
                    ],
                )
                offset += sum(len(token_text(i)) for i in d.token_ids) if want_lp else 0
                first = False
                yield _sse(resp)
            if include_usage:
                yield _sse(
                    p.CompletionResponse(
                        id=j.rid,
                        created=now,
                        model=model_name,
                        choices=[],
                        usage=acc.usage(len(j.prompt_ids)),
                    )
                )
        except Exception as e:
            yield stream_error(e)
        yield "data: [DONE]\n\n"

    @app.post("/generate", response_model=None)
    async def generate(req: p.GenerateRequest, request: Request) -> Any:
        sp = req.sampling_params
        check_text(req)
        if (req.text is None) == (req.input_ids is None):
            raise _refuse("give exactly one of text and input_ids", "input_ids")
        if sp.n != 1:
            raise _refuse("n > 1 is not supported: one output per request", "sampling_params.n")
        if sp.top_k not in (-1, 0):
            raise _refuse("top_k is not supported (only -1)", "sampling_params.top_k")
        if req.logprob_start_len not in (-1,) and req.return_logprob:
            raise _refuse(
                "prompt logprobs are not returned (logprob_start_len must be -1)",
                "logprob_start_len",
            )
        if req.top_logprobs_num:
            raise _refuse("top_logprobs_num is not supported (only 0)", "top_logprobs_num")
        if sp.seed is not None and sp.sampling_seed is not None and sp.seed != sp.sampling_seed:
            raise _refuse("seed and sampling_seed differ", "sampling_params.seed")
        if req.input_ids is not None:
            prompt_ids = list(req.input_ids)
        else:
            prompt_ids = list(tok.encode(req.text or ""))
        seed = sp.seed if sp.seed is not None else sp.sampling_seed
        j = job(
            "gen",
            prompt_ids,
            sp.max_new_tokens,
            "sampling_params.max_new_tokens",
            sp.temperature,
            sp.top_p,
            seed,
            sp.stop_token_ids,
            session_of(request, None),
            rid=req.rid,
            eos=not sp.ignore_eos,
            stop=stops_mod.stops_of(sp.stop, "sampling_params.stop"),
            stop_param="sampling_params.stop_token_ids",
            prompt_param="input_ids" if req.input_ids is not None else "text",
        )
        t0 = time.perf_counter()

        def body(acc: _Acc, final: bool) -> p.GenerateResponse:
            text_ids = j.text_ids(acc.ids, final, acc.finish)
            if sp.no_stop_trim:
                text_ids = acc.ids
            lps = None
            if req.return_logprob:
                lps = [
                    (lp, i, token_text(i) if req.return_text_in_logprobs else None)
                    for i, lp in zip(acc.ids, acc.logprobs, strict=True)
                ]
            text = tok.decode(text_ids)
            hit = stops_mod.find_stop(text, j.stop) if j.stop else None
            reason: dict[str, Any] | None = None
            if final:
                reason = {"type": acc.finish}
                if acc.finish == "stop" and acc.ids and acc.ids[-1] in j.sampling.stop_ids:
                    reason["matched"] = acc.ids[-1]
                elif acc.finish == "stop" and hit is not None:
                    reason["matched"] = hit[1]
                elif acc.finish == "length":
                    reason["length"] = j.sampling.max_new_tokens
            return p.GenerateResponse(
                text=stops_mod.cut(text, j.stop, keep=sp.no_stop_trim),
                output_ids=acc.ids,
                meta_info=p.GenerateMeta(
                    id=j.rid,
                    finish_reason=reason,
                    prompt_tokens=len(j.prompt_ids),
                    completion_tokens=len(acc.ids),
                    output_token_logprobs=lps,
                    weight_version=acc.last_version,
                    weight_versions=acc.versions_out(),
                    recomputed_tokens=acc.recomputed,
                    migrations=acc.migrations,
                    e2e_latency=time.perf_counter() - t0,
                ),
            )

        if req.stream:

            async def events() -> AsyncIterator[str]:
                acc = _Acc()
                try:
                    async for d in deltas(j):
                        acc.add(d)
                        yield _sse(body(acc, d.finish_reason is not None))
                except Exception as e:
                    yield stream_error(e)
                yield "data: [DONE]\n\n"

            return _EventStream(events())
        return JSONResponse(body(await collect(j), True).model_dump(mode="json"))

    @app.get("/pearl/v1/status")
    async def status() -> Any:
        return JSONResponse(await backend.status())

    @app.post("/pearl/v1/events/{kind}")
    async def event(kind: str, request: Request) -> Any:
        if kind not in EVENT_KINDS:
            raise GatewayError(
                f"unknown event {kind!r}; one of {', '.join(EVENT_KINDS)}",
                404,
                "not_found_error",
                "kind",
            )
        raw = await request.body()
        try:
            fields = json.loads(raw) if raw.strip() else {}
        except ValueError as e:
            raise _refuse(f"malformed JSON body: {e}", None) from e
        if not isinstance(fields, dict):
            raise _refuse("the event's body must be a JSON object of its fields", None)
        return JSONResponse(await backend.event(kind, fields))

    return app


__all__ = ["EVENT_KINDS", "SESSION_HEADER", "Guard", "build_app", "error_body"]
