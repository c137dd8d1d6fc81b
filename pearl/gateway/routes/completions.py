"""OpenAI's ``POST /v1/completions``, streamed or not; ``prompt`` is a string or token ids.

``logprobs=0`` returns the sampled tokens' logprobs with their text offsets; a stream's chunks
carry the text each delta settles, and the first one the prompt's ids when they are asked for.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from pearl.gateway import protocol as p
from pearl.gateway import stops as stops_mod
from pearl.gateway.context import Context
from pearl.gateway.errors import refuse
from pearl.gateway.jobs import Job, check_common, job, session_of
from pearl.gateway.output import Acc, Extras, collect, final_text, texts
from pearl.gateway.sse import EventStream


def check(req: p.CompletionRequest) -> None:
    """What completions refuse beyond what all generation refuses."""
    if req.logprobs:
        raise refuse(
            "logprobs=N>0 asks for top alternatives, which are not returned; "
            "logprobs=0 returns the sampled tokens' logprobs",
            "logprobs",
        )
    if req.echo:
        raise refuse("echo is not supported", "echo")
    if req.suffix:
        raise refuse("suffix is not supported", "suffix")
    if req.best_of not in (None, 1):
        raise refuse("best_of > 1 is not supported", "best_of")


def logprobs(
    ctx: Context, ids: Sequence[int], lps: Sequence[float], offset: int
) -> p.CompletionLogprobs:
    """The tokens' text, logprobs and offsets, the first at ``offset`` in the response."""
    tokens, offsets = [], []
    for i in ids:
        t = ctx.token_text(i)
        tokens.append(t)
        offsets.append(offset)
        offset += len(t)
    return p.CompletionLogprobs(tokens=tokens, token_logprobs=list(lps), text_offset=offsets)


async def create(ctx: Context, req: p.CompletionRequest, request: Request) -> Any:
    """The response to ``req``: a JSON body, or a stream of chunks."""
    check_common(ctx, req)
    check(req)
    prompt = list(ctx.tok.encode(req.prompt)) if isinstance(req.prompt, str) else list(req.prompt)
    j = job(
        ctx,
        "cmpl",
        prompt,
        max_tokens=req.max_tokens,
        param="max_tokens",
        temperature=req.temperature,
        top_p=req.top_p,
        seed=req.seed,
        stop_ids=req.stop_token_ids,
        session=session_of(request, req.user),
        eos=not req.ignore_eos,
        stop=stops_mod.stops_of(req.stop, "stop"),
        prompt_param="prompt",
    )
    want = Extras(
        token_ids=bool(req.return_token_ids),
        logprobs=req.logprobs is not None,
        usage=bool(req.stream_options and req.stream_options.include_usage),
    )
    if req.stream:
        return EventStream(chunks(ctx, j, req.model, want))
    resp = response(ctx, j, req.model, await collect(ctx, j), want)
    return JSONResponse(resp.model_dump(mode="json"))


def response(ctx: Context, j: Job, model: str, acc: Acc, want: Extras) -> p.CompletionResponse:
    """The whole response."""
    ids = want.token_ids
    return p.CompletionResponse(
        id=j.rid,
        created=int(time.time()),
        model=model,
        usage=acc.usage(len(j.prompt_ids)),
        prompt_token_ids=j.prompt_ids if ids else None,
        choices=[
            p.CompletionChoice(
                text=final_text(ctx, j, acc),
                finish_reason=acc.finish,
                logprobs=logprobs(ctx, acc.ids, acc.logprobs, 0) if want.logprobs else None,
                token_ids=acc.ids if ids else None,
                prompt_token_ids=j.prompt_ids if ids else None,
                weight_version=acc.last_version,
                weight_versions=acc.versions_out(),
            )
        ],
    )


async def chunks(
    ctx: Context, j: Job, model: str, want: Extras
) -> AsyncIterator[p.CompletionResponse]:
    """The stream's chunks: one per delta, then, if asked, a usage chunk."""
    now, acc, offset, first = int(time.time()), Acc(), 0, True
    async for d, text in texts(ctx, j, acc):
        choice = p.CompletionChoice(
            text=text,
            finish_reason=d.finish_reason,
            logprobs=logprobs(ctx, d.token_ids, d.logprobs, offset) if want.logprobs else None,
            token_ids=list(d.token_ids) if want.token_ids else None,
            prompt_token_ids=j.prompt_ids if want.token_ids and first else None,
            weight_version=d.weight_version,
        )
        offset += sum(len(ctx.token_text(i)) for i in d.token_ids) if want.logprobs else 0
        first = False
        yield p.CompletionResponse(id=j.rid, created=now, model=model, choices=[choice])
    if want.usage:
        usage = acc.usage(len(j.prompt_ids))
        yield p.CompletionResponse(id=j.rid, created=now, model=model, choices=[], usage=usage)


def router(ctx: Context) -> APIRouter:
    r = APIRouter()

    @r.post("/v1/completions", response_model=None)
    async def completions(req: p.CompletionRequest, request: Request) -> Any:
        return await create(ctx, req, request)

    return r


__all__ = ["check", "chunks", "create", "logprobs", "response", "router"]
