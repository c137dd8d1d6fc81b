"""SGLang's ``POST /generate``: token in, token out, for trainers that speak SGLang.

A request gives ``text`` or ``input_ids``; the answer is the text, every generated id and
``meta_info`` (finish reason with what matched, logprobs as ``(logprob, id, text)``, the
weight versions, PEARL's recompute and migration counts). A stream sends the whole response so
far with each delta, as SGLang does.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from pearl.gateway import protocol as p
from pearl.gateway import stops as stops_mod
from pearl.gateway.context import Context
from pearl.gateway.errors import refuse
from pearl.gateway.jobs import Job, check_text, job, session_of
from pearl.gateway.output import Acc, collect, deltas
from pearl.gateway.sse import EventStream


def check(req: p.GenerateRequest) -> None:
    """What ``/generate`` refuses: bad text, both or neither prompt, what is unsupported."""
    sp = req.sampling_params
    check_text(req)
    if (req.text is None) == (req.input_ids is None):
        raise refuse("give exactly one of text and input_ids", "input_ids")
    if sp.n != 1:
        raise refuse("n > 1 is not supported: one output per request", "sampling_params.n")
    if sp.top_k not in (-1, 0):
        raise refuse("top_k is not supported (only -1)", "sampling_params.top_k")
    if req.logprob_start_len not in (-1,) and req.return_logprob:
        raise refuse(
            "prompt logprobs are not returned (logprob_start_len must be -1)",
            "logprob_start_len",
        )
    if req.top_logprobs_num:
        raise refuse("top_logprobs_num is not supported (only 0)", "top_logprobs_num")
    if sp.seed is not None and sp.sampling_seed is not None and sp.seed != sp.sampling_seed:
        raise refuse("seed and sampling_seed differ", "sampling_params.seed")


def job_of(ctx: Context, req: p.GenerateRequest, request: Request) -> Job:
    """The checked request as a job."""
    sp = req.sampling_params
    if req.input_ids is not None:
        prompt_ids = list(req.input_ids)
    else:
        prompt_ids = list(ctx.tok.encode(req.text or ""))
    return job(
        ctx,
        "gen",
        prompt_ids,
        max_tokens=sp.max_new_tokens,
        param="sampling_params.max_new_tokens",
        temperature=sp.temperature,
        top_p=sp.top_p,
        seed=sp.seed if sp.seed is not None else sp.sampling_seed,
        stop_ids=sp.stop_token_ids,
        session=session_of(request, None),
        rid=req.rid,
        eos=not sp.ignore_eos,
        stop=stops_mod.stops_of(sp.stop, "sampling_params.stop"),
        stop_param="sampling_params.stop_token_ids",
        prompt_param="input_ids" if req.input_ids is not None else "text",
    )


def finish_reason(j: Job, acc: Acc, hit: tuple[int, str] | None) -> dict[str, Any]:
    """SGLang's finish reason: its type, and the stop id or string that matched, or the
    length limit."""
    reason: dict[str, Any] = {"type": acc.finish}
    if acc.finish == "stop" and acc.ids and acc.ids[-1] in j.sampling.stop_ids:
        reason["matched"] = acc.ids[-1]
    elif acc.finish == "stop" and hit is not None:
        reason["matched"] = hit[1]
    elif acc.finish == "length":
        reason["length"] = j.sampling.max_new_tokens
    return reason


def response(
    ctx: Context, j: Job, req: p.GenerateRequest, acc: Acc, final: bool, t0: float
) -> p.GenerateResponse:
    """The response so far (the whole of it when ``final``); ``t0`` is when it began."""
    keep = req.sampling_params.no_stop_trim
    text_ids = acc.ids if keep else j.text_ids(acc.ids, final, acc.finish)
    lps = None
    if req.return_logprob:
        lps = [
            (lp, i, ctx.token_text(i) if req.return_text_in_logprobs else None)
            for i, lp in zip(acc.ids, acc.logprobs, strict=True)
        ]
    text = ctx.tok.decode(text_ids)
    hit = stops_mod.find_stop(text, j.stop) if j.stop else None
    return p.GenerateResponse(
        text=stops_mod.cut(text, j.stop, keep=keep),
        output_ids=acc.ids,
        meta_info=p.GenerateMeta(
            id=j.rid,
            finish_reason=finish_reason(j, acc, hit) if final else None,
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


async def outputs(
    ctx: Context, j: Job, req: p.GenerateRequest, t0: float
) -> AsyncIterator[p.GenerateResponse]:
    """The stream: the response so far after each delta."""
    acc = Acc()
    async for d in deltas(ctx, j):
        acc.add(d)
        yield response(ctx=ctx, j=j, req=req, acc=acc, final=d.finish_reason is not None, t0=t0)


async def create(ctx: Context, req: p.GenerateRequest, request: Request) -> Any:
    """The response to ``req``: a JSON body, or a stream."""
    check(req)
    j = job_of(ctx, req, request)
    t0 = time.perf_counter()
    if req.stream:
        return EventStream(outputs(ctx=ctx, j=j, req=req, t0=t0))
    body = response(ctx=ctx, j=j, req=req, acc=await collect(ctx, j), final=True, t0=t0)
    return JSONResponse(body.model_dump(mode="json"))


def router(ctx: Context) -> APIRouter:
    r = APIRouter()

    @r.post("/generate", response_model=None)
    async def generate(req: p.GenerateRequest, request: Request) -> Any:
        return await create(ctx, req, request)

    return r


__all__ = ["check", "create", "finish_reason", "job_of", "outputs", "response", "router"]
