"""OpenAI's ``POST /v1/chat/completions``, streamed or not, with tools.

The messages are rendered with the model's chat template (:mod:`pearl.gateway.chat`); with
tools, the model's ``<tool_call>`` blocks come back as ``tool_calls`` with the finish reason
``tool_calls``. A stream sends a role chunk, then the text as it settles (held back from the
first ``<tool_call>``), then the calls, a finish chunk and, if asked, a usage chunk.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from pearl.engines.sequence import Top
from pearl.gateway import fields, sampling, structured, templates
from pearl.gateway import protocol as p
from pearl.gateway import stops as stops_mod
from pearl.gateway.context import Context
from pearl.gateway.errors import refuse
from pearl.gateway.jobs import Job, check_common, job, session_of
from pearl.gateway.output import Acc, Extras, collect, final_text, gather, merge, texts
from pearl.gateway.sse import EventStream


def check(req: p.ChatRequest) -> None:
    """What chat refuses beyond what all generation refuses."""
    if req.max_tokens is not None and req.max_completion_tokens is not None:
        raise refuse("give max_tokens or max_completion_tokens, not both", "max_tokens")


def prompt_ids(
    ctx: Context, req: p.ChatRequest | p.TokenizeChatRequest, generation_prompt: bool = True
) -> list[int]:
    """The chat rendered with the model's template, as token ids (``/tokenize`` renders a
    chat too)."""
    messages = templates.message_dicts(req.messages)
    tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
    extra = dict(req.chat_template_kwargs or {})
    eos_id = ctx.tok.eos_id
    extra.setdefault("eos_token", ctx.token_text(eos_id) if eos_id >= 0 else "")
    text = templates.render(
        template=ctx.backend.chat_template,
        messages=messages,
        tools=tools,
        extra=extra,
        generation_prompt=generation_prompt,
    )
    return list(ctx.tok.encode(text))


def logprobs(
    ctx: Context, ids: Sequence[int], lps: Sequence[float], top: Sequence[Top] = ()
) -> p.ChoiceLogprobs:
    """OpenAI's logprobs of the tokens ``ids``; with ``top`` (per token, (id, logprob) pairs),
    each token's alternatives as ``{token, logprob, bytes, token_id}`` (``token_id``: PEARL's)."""
    content = []
    for k, (i, lp) in enumerate(zip(ids, lps, strict=True)):
        t = ctx.token_text(i)
        alts = [alternative(ctx, a, alp) for a, alp in top[k]] if k < len(top) else []
        content.append(
            p.TokenLogprob(token=t, logprob=lp, bytes=list(t.encode()), top_logprobs=alts)
        )
    return p.ChoiceLogprobs(content=content)


def alternative(ctx: Context, token: int, logprob: float) -> dict[str, Any]:
    t = ctx.token_text(token)
    return {"token": t, "logprob": max(logprob, -9999.0), "bytes": list(t.encode()),
            "token_id": token}  # fmt: skip


async def create(ctx: Context, req: p.ChatRequest, request: Request) -> Response:
    """The response to ``req``: a JSON body, or a stream of chunks."""
    check_common(ctx, req, fields.CHAT)
    check(req)
    use_tools = bool(req.tools) and req.tool_choice != "none"
    j = job(
        ctx,
        "chatcmpl",
        prompt_ids(ctx, req),
        max_tokens=req.max_completion_tokens or req.max_tokens,
        param="max_completion_tokens" if req.max_completion_tokens else "max_tokens",
        temperature=req.temperature,
        top_p=req.top_p,
        seed=req.seed,
        stop_ids=req.stop_token_ids,
        session=session_of(request, req.user),
        eos=not req.ignore_eos,
        stop=stops_mod.stops_of(req.stop, "stop"),
        prompt_param="messages",
        knobs=sampling.knobs(ctx, req),
        top_logprobs=top_of(ctx, req),
        keep_stop=bool(req.include_stop_str_in_output),
        specials=req.skip_special_tokens is False,
    )
    j = structured.constrain(j, structured.grammar_of(req))
    n = sampling.count(req.n)
    want = Extras(
        token_ids=bool(req.return_token_ids),
        logprobs=bool(req.logprobs),
        usage=bool(req.stream_options and req.stream_options.include_usage),
    )
    js = sampling.samples(j, n)
    if req.stream:
        return EventStream(streams(ctx=ctx, js=js, model=req.model, want=want, use_tools=use_tools))
    accs = await gather([collect(ctx, x) for x in js])
    resp = response(ctx=ctx, j=j, model=req.model, acc=accs[0], want=want, use_tools=use_tools)
    if n > 1:
        resp.choices = [
            response(ctx=ctx, j=x, model=req.model, acc=acc, want=want, use_tools=use_tools)
            .choices[0]
            .model_copy(update={"index": i})
            for i, (x, acc) in enumerate(zip(js, accs, strict=True))
        ]
        resp.usage = summed(len(j.prompt_ids), accs)
    return JSONResponse(resp.model_dump(mode="json"))


def top_of(ctx: Context, req: p.ChatRequest) -> int:
    """The alternatives per token asked for: ``top_logprobs``, which needs ``logprobs``."""
    if req.top_logprobs and not req.logprobs:
        raise refuse("top_logprobs needs logprobs=true", "top_logprobs")
    return sampling.top_count(ctx, req.top_logprobs, "top_logprobs")


def summed(prompt_tokens: int, accs: Sequence[Acc]) -> p.Usage:
    """Usage of ``n`` samples of one prompt: the prompt once, their completions summed."""
    parts = [acc.usage(prompt_tokens) for acc in accs]
    done = sum(u.completion_tokens for u in parts)
    return p.Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=done,
        total_tokens=prompt_tokens + done,
        recomputed_tokens=sum(u.recomputed_tokens for u in parts),
        migrations=sum(u.migrations for u in parts),
    )


async def streams(
    ctx: Context, js: Sequence[Job], model: str, want: Extras, use_tools: bool
) -> AsyncIterator[p.ChatChunk]:
    """The chunks of every sample (each choice's ``index`` its sample's), as they come; one
    usage chunk at the end, summed, if asked."""
    if len(js) == 1:
        async for c in chunks(ctx=ctx, j=js[0], model=model, want=want, use_tools=use_tools):
            yield c
        return
    accs = [Acc() for _ in js]
    each = dataclasses.replace(want, usage=False)
    its = [
        chunks(ctx=ctx, j=x, model=model, want=each, use_tools=use_tools, index=i, acc=accs[i])
        for i, x in enumerate(js)
    ]
    rid = js[0].sampling.group
    async for _, c in merge(its):
        c.id = rid
        yield c
    if want.usage:
        usage = summed(len(js[0].prompt_ids), accs)
        yield p.ChatChunk(id=rid, created=int(time.time()), model=model, choices=[], usage=usage)


def response(
    ctx: Context, j: Job, model: str, acc: Acc, want: Extras, use_tools: bool
) -> p.ChatResponse:
    """The whole response, its tool calls parsed out of its text when ``use_tools``."""
    out = final_text(ctx, j, acc)
    content, calls = templates.parse_tool_calls(out) if use_tools else (out, [])
    tool_calls = [
        p.ResponseToolCall(id=c.id, function=p.ResponseFunction(name=c.name, arguments=c.arguments))
        for c in calls
    ]
    return p.ChatResponse(
        id=j.rid,
        created=int(time.time()),
        model=model,
        usage=acc.usage(len(j.prompt_ids)),
        prompt_token_ids=j.prompt_ids if want.token_ids else None,
        choices=[
            p.ChatChoice(
                message=p.ResponseMessage(content=content, tool_calls=tool_calls or None),
                finish_reason="tool_calls" if calls else str(acc.finish),
                logprobs=logprobs(ctx=ctx, ids=acc.ids, lps=acc.logprobs, top=acc.top)
                if want.logprobs
                else None,
                token_ids=acc.ids if want.token_ids else None,
                weight_version=acc.last_version,
                weight_versions=acc.versions_out(),
            )
        ],
    )


async def chunks(
    ctx: Context,
    j: Job,
    model: str,
    want: Extras,
    use_tools: bool,
    index: int = 0,
    acc: Acc | None = None,
) -> AsyncIterator[p.ChatChunk]:
    """The stream's chunks of one sample (choice ``index``; its tokens into ``acc``): the role,
    the text as it settles, the tool calls, the finish."""
    now = int(time.time())

    def chunk(**choice: Any) -> p.ChatChunk:
        one = p.ChunkChoice(index=index, **choice)
        return p.ChatChunk(id=j.rid, created=now, model=model, choices=[one])

    first = chunk(delta=p.ChunkDelta(role="assistant", content=""))
    if want.token_ids:
        first.prompt_token_ids = j.prompt_ids
    yield first
    acc, held = acc or Acc(), templates.ToolStream() if use_tools else None
    async for d, text in texts(ctx, j, acc):
        if held is not None:
            text = held.feed(text)
        if text or want.token_ids or want.logprobs:
            yield chunk(
                delta=p.ChunkDelta(content=text),
                logprobs=logprobs(ctx=ctx, ids=d.token_ids, lps=d.logprobs, top=d.top_logprobs)
                if want.logprobs
                else None,
                token_ids=list(d.token_ids) if want.token_ids else None,
                weight_version=d.weight_version,
            )
    calls: list[templates.ParsedCall] = []
    if held is not None:
        rest, calls = held.finish()
        if rest:
            yield chunk(delta=p.ChunkDelta(content=rest))
        for k, c in enumerate(calls):
            function = p.DeltaFunction(name=c.name, arguments=c.arguments)
            call = p.DeltaToolCall(index=k, id=c.id, type="function", function=function)
            yield chunk(delta=p.ChunkDelta(tool_calls=[call]))
    finish = "tool_calls" if calls else str(acc.finish)
    yield chunk(delta=p.ChunkDelta(), finish_reason=finish, weight_version=acc.last_version)
    if want.usage:
        usage = acc.usage(len(j.prompt_ids))
        yield p.ChatChunk(id=j.rid, created=now, model=model, choices=[], usage=usage)


def router(ctx: Context) -> APIRouter:
    r = APIRouter()

    @r.post("/v1/chat/completions", response_model=None)
    async def chat_completions(req: p.ChatRequest, request: Request) -> Response:
        return fields.mark(await create(ctx, req, request), fields.ignored(req, fields.CHAT))

    return r


__all__ = ["check", "chunks", "create", "logprobs", "prompt_ids", "response", "router"]
