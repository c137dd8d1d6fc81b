"""OpenAI's ``POST /v1/completions``, streamed or not; ``prompt`` is a string, token ids, or a
list of either: one choice per prompt (its ``index``), generated at once, usage summed.

``logprobs=0`` returns the sampled tokens' logprobs with their text offsets; a stream's chunks
carry the text each delta settles, and each choice's first one its prompt's ids when they are
asked for.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Sequence

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from pearl.engines.sequence import Top
from pearl.gateway import fields, sampling, structured
from pearl.gateway import protocol as p
from pearl.gateway import stops as stops_mod
from pearl.gateway.context import Context
from pearl.gateway.errors import refuse
from pearl.gateway.jobs import Job, check_common, job, session_of
from pearl.gateway.output import Acc, Extras, collect, final_text, gather, merge, texts
from pearl.gateway.sse import EventStream


def logprobs(
    ctx: Context,
    ids: Sequence[int],
    lps: Sequence[float],
    offset: int,
    top: Sequence[Top] = (),
    as_ids: bool = False,
) -> p.CompletionLogprobs:
    """The tokens' text, logprobs and offsets, the first at ``offset`` in the response; with
    ``top``, each position's alternatives ``{text: logprob}``, the sampled token's included (so
    up to k + 1, as OpenAI and vLLM). ``as_ids`` (vLLM's ``return_tokens_as_token_ids``): every
    token is named ``token_id:N``, so the alternatives carry their ids."""
    name = (lambda i: f"token_id:{i}") if as_ids else ctx.token_text
    tokens, offsets = [], []
    for i in ids:
        t = name(i)
        tokens.append(t)
        offsets.append(offset)
        offset += len(t)
    alts = None
    if top:
        alts = []
        for k, (i, lp) in enumerate(zip(ids, lps, strict=True)):
            pairs = [*top[k], (i, lp)] if k < len(top) else [(i, lp)]
            alts.append({name(a): max(alp, -9999.0) for a, alp in dict(pairs).items()})
    return p.CompletionLogprobs(
        tokens=tokens, token_logprobs=list(lps), text_offset=offsets, top_logprobs=alts
    )


def prompts(ctx: Context, req: p.CompletionRequest) -> list[list[int]]:
    """The request's prompts as token ids: one, or one per item of a list."""
    prompt = req.prompt
    if isinstance(prompt, str):
        return [list(ctx.tok.encode(prompt))]
    if not prompt or isinstance(prompt[0], int):
        return [[int(i) for i in prompt]]  # type: ignore[arg-type]
    if len(prompt) > p.MAX_PROMPTS:
        raise refuse(f"{len(prompt)} prompts in one request; at most {p.MAX_PROMPTS}", "prompt")
    return [list(ctx.tok.encode(x)) if isinstance(x, str) else list(x) for x in prompt]


def jobs(ctx: Context, req: p.CompletionRequest, request: Request, rid: str) -> list[Job]:
    """One job per prompt: the request id ``rid``, or ``rid-i`` for the i-th of several; with
    ``n``, ``n`` samples of each (:func:`pearl.gateway.sampling.samples`), prompt by prompt
    (choice ``index`` = prompt * n + sample, as vLLM)."""
    ids = prompts(ctx, req)
    many = len(ids) > 1
    g = structured.grammar_of(req)
    knobs = sampling.knobs(ctx, req)
    top = sampling.top_count(ctx, req.logprobs, "logprobs")
    n = sampling.count(req.n)
    base = [
        structured.constrain(
            job(
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
                rid=f"{rid}-{k}" if many else rid,
                eos=not req.ignore_eos,
                stop=stops_mod.stops_of(req.stop, "stop"),
                prompt_param=f"prompt.{k}" if many else "prompt",
                knobs=knobs,
                top_logprobs=top,
                keep_stop=bool(req.include_stop_str_in_output),
                specials=req.skip_special_tokens is False,
            ),
            g,
        )
        for k, prompt in enumerate(ids)
    ]
    return [x for j in base for x in sampling.samples(j, n)]


async def create(ctx: Context, req: p.CompletionRequest, request: Request) -> Response:
    """The response to ``req``: a JSON body, or a stream of chunks."""
    check_common(ctx, req, fields.COMPLETIONS)
    rid = f"cmpl-{uuid.uuid4().hex}"
    js = jobs(ctx=ctx, req=req, request=request, rid=rid)
    want = Extras(
        token_ids=bool(req.return_token_ids),
        logprobs=req.logprobs is not None,
        as_ids=bool(req.return_tokens_as_token_ids),
        usage=bool(req.stream_options and req.stream_options.include_usage),
    )
    if req.stream:
        return EventStream(chunks(ctx=ctx, js=js, rid=rid, model=req.model, want=want))
    accs = await gather([collect(ctx, j) for j in js])
    resp = response(ctx=ctx, js=js, rid=rid, model=req.model, accs=accs, want=want)
    return JSONResponse(resp.model_dump(mode="json"))


def usage(js: Sequence[Job], accs: Sequence[Acc]) -> p.Usage:
    """The prompts' usage, summed."""
    parts = [acc.usage(len(j.prompt_ids)) for j, acc in zip(js, accs, strict=True)]
    once = {j.sampling.group or j.rid: len(j.prompt_ids) for j in js}  # n samples: one prompt
    return p.Usage(
        prompt_tokens=sum(once.values()),
        completion_tokens=sum(u.completion_tokens for u in parts),
        total_tokens=sum(once.values()) + sum(u.completion_tokens for u in parts),
        recomputed_tokens=sum(u.recomputed_tokens for u in parts),
        migrations=sum(u.migrations for u in parts),
    )


def response(
    ctx: Context, js: Sequence[Job], rid: str, model: str, accs: Sequence[Acc], want: Extras
) -> p.CompletionResponse:
    """The whole response: one choice per prompt."""
    ids = want.token_ids
    return p.CompletionResponse(
        id=rid,
        created=int(time.time()),
        model=model,
        usage=usage(js, accs),
        prompt_token_ids=js[0].prompt_ids if ids and len(js) == 1 else None,
        choices=[
            p.CompletionChoice(
                index=k,
                text=final_text(ctx, j, acc),
                finish_reason=acc.finish,
                logprobs=logprobs(
                    ctx=ctx,
                    ids=acc.ids,
                    lps=acc.logprobs,
                    offset=0,
                    top=acc.top,
                    as_ids=want.as_ids,
                )
                if want.logprobs
                else None,
                token_ids=acc.ids if ids else None,
                prompt_token_ids=j.prompt_ids if ids else None,
                weight_version=acc.last_version,
                weight_versions=acc.versions_out(),
            )
            for k, (j, acc) in enumerate(zip(js, accs, strict=True))
        ],
    )


async def choices(
    ctx: Context, j: Job, k: int, acc: Acc, want: Extras
) -> AsyncIterator[p.CompletionChoice]:
    """The stream's choices of prompt ``k``: one per delta."""
    offset, first = 0, True
    async for d, text in texts(ctx, j, acc):
        yield p.CompletionChoice(
            index=k,
            text=text,
            finish_reason=d.finish_reason,
            logprobs=logprobs(
                ctx=ctx,
                ids=d.token_ids,
                lps=d.logprobs,
                offset=offset,
                top=d.top_logprobs,
                as_ids=want.as_ids,
            )
            if want.logprobs
            else None,
            token_ids=list(d.token_ids) if want.token_ids else None,
            prompt_token_ids=j.prompt_ids if want.token_ids and first else None,
            weight_version=d.weight_version,
        )
        offset += sum(len(ctx.token_text(i)) for i in d.token_ids) if want.logprobs else 0
        first = False


async def chunks(
    ctx: Context, js: Sequence[Job], rid: str, model: str, want: Extras
) -> AsyncIterator[p.CompletionResponse]:
    """The stream's chunks: one per delta of any prompt, then, if asked, a usage chunk."""
    now, accs = int(time.time()), [Acc() for _ in js]
    its = [choices(ctx=ctx, j=j, k=k, acc=accs[k], want=want) for k, j in enumerate(js)]
    async for _, choice in merge(its):
        yield p.CompletionResponse(id=rid, created=now, model=model, choices=[choice])
    if want.usage:
        yield p.CompletionResponse(
            id=rid, created=now, model=model, choices=[], usage=usage(js, accs)
        )


def router(ctx: Context) -> APIRouter:
    r = APIRouter()

    @r.post("/v1/completions", response_model=None)
    async def completions(req: p.CompletionRequest, request: Request) -> Response:
        resp = await create(ctx, req, request)
        return fields.mark(resp, fields.ignored(req, fields.COMPLETIONS))

    return r


__all__ = [
    "choices",
    "chunks",
    "create",
    "jobs",
    "logprobs",
    "prompts",
    "response",
    "router",
    "usage",
]
