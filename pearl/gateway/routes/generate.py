"""SGLang's ``POST /generate``: token in, token out, for trainers that speak SGLang.

A request gives ``text`` or ``input_ids``; the answer is the text, every generated id and
``meta_info`` (finish reason with what matched, logprobs as ``(logprob, id, text)``, the
weight versions, PEARL's recompute and migration counts). A stream sends the whole response so
far with each delta, as SGLang does.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from types import SimpleNamespace
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from pearl.gateway import protocol as p
from pearl.gateway import sampling
from pearl.gateway import stops as stops_mod
from pearl.gateway.backend import GatewayError
from pearl.gateway.context import Context
from pearl.gateway.errors import refuse
from pearl.gateway.jobs import Job, check_text, job, session_of
from pearl.gateway.output import Acc, collect, deltas, gather, merge
from pearl.gateway.sse import EventStream


def check(req: p.GenerateRequest) -> None:
    """What ``/generate`` refuses: bad text, both or neither prompt, prompt logprobs."""
    sp = req.sampling_params
    check_text(req)
    if (req.text is None) == (req.input_ids is None):
        raise refuse("give exactly one of text and input_ids", "input_ids")
    if req.logprob_start_len not in (-1,) and req.return_logprob:
        raise refuse(
            "prompt logprobs are not returned (logprob_start_len must be -1)",
            "logprob_start_len",
        )
    if sp.seed is not None and sp.sampling_seed is not None and sp.seed != sp.sampling_seed:
        raise refuse("seed and sampling_seed differ", "sampling_params.seed")


def knobs(ctx: Context, sp: p.GenerateSamplingParams) -> dict[str, Any]:
    """SGLang's sampling fields as vLLM's, checked (an error names SGLang's field)."""
    given = SimpleNamespace(
        model_extra=None, top_k=sp.top_k, min_p=sp.min_p, presence_penalty=sp.presence_penalty,
        frequency_penalty=sp.frequency_penalty, repetition_penalty=sp.repetition_penalty,
        min_tokens=sp.min_new_tokens, logit_bias=None,
    )  # fmt: skip
    try:
        return sampling.knobs(ctx, given, "sampling_params.")
    except GatewayError as e:
        if e.param == "sampling_params.min_tokens":
            e.param = "sampling_params.min_new_tokens"
        raise


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
        knobs=knobs(ctx, sp),
        top_logprobs=sampling.top_count(ctx, req.top_logprobs_num, "top_logprobs_num"),
        keep_stop=sp.no_stop_trim,
        specials=not sp.skip_special_tokens,
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
    text_ids = j.text_ids(acc.ids, final, acc.finish)
    lps = tops = None

    def entry(i: int, lp: float) -> tuple[float, int, str | None]:
        return lp, i, ctx.token_text(i) if req.return_text_in_logprobs else None

    if req.return_logprob:
        lps = [entry(i, lp) for i, lp in zip(acc.ids, acc.logprobs, strict=True)]
        if req.top_logprobs_num:
            tops = [[entry(i, lp) for i, lp in top] for top in acc.top]
    text = ctx.tok.decode(text_ids, not j.specials)
    hit = stops_mod.find_stop(text, j.stop) if j.stop else None
    return p.GenerateResponse(
        text=stops_mod.cut(text, j.stop, keep=j.keep_stop),
        output_ids=acc.ids,
        meta_info=p.GenerateMeta(
            id=j.rid,
            finish_reason=finish_reason(j, acc, hit) if final else None,
            prompt_tokens=len(j.prompt_ids),
            completion_tokens=len(acc.ids),
            output_token_logprobs=lps,
            output_top_logprobs=tops,
            weight_version=acc.last_version,
            weight_versions=acc.versions_out(),
            recomputed_tokens=acc.recomputed,
            migrations=acc.migrations,
            e2e_latency=time.perf_counter() - t0,
        ),
    )


async def outputs(
    ctx: Context, j: Job, req: p.GenerateRequest, t0: float, index: int | None = None
) -> AsyncIterator[dict[str, Any]]:
    """The stream: the response so far after each delta (``index``: its sample's, n > 1)."""
    acc = Acc()
    async for d in deltas(ctx, j):
        acc.add(d)
        out = response(ctx=ctx, j=j, req=req, acc=acc, final=d.finish_reason is not None, t0=t0)
        out.index = index
        yield dump(out)


async def streams(
    ctx: Context, js: Sequence[Job], req: p.GenerateRequest, t0: float
) -> AsyncIterator[dict[str, Any]]:
    """The samples' streams, merged as they come, each chunk with its sample's ``index``."""
    its = [outputs(ctx=ctx, j=x, req=req, t0=t0, index=i) for i, x in enumerate(js)]
    async for _, out in merge(its):
        yield out


def dump(out: p.GenerateResponse) -> dict[str, Any]:
    """``out`` as JSON, without the fields SGLang leaves out when not asked."""
    body = out.model_dump(mode="json")
    if body["index"] is None:
        del body["index"]
    if body["meta_info"]["output_top_logprobs"] is None:
        del body["meta_info"]["output_top_logprobs"]
    return body


async def create(ctx: Context, req: p.GenerateRequest, request: Request) -> Any:
    """The response to ``req``: a JSON body, or a stream; with ``n > 1``, n samples of the
    prompt (seeds s + i, :mod:`pearl.gateway.sampling`) as a list, or chunks with ``index``,
    as SGLang answers."""
    check(req)
    j = job_of(ctx, req, request)
    n = sampling.count(req.sampling_params.n, "sampling_params.n")
    js = sampling.samples(j, n)
    t0 = time.perf_counter()
    if req.stream:
        if n == 1:
            return EventStream(outputs(ctx=ctx, j=j, req=req, t0=t0))
        return EventStream(streams(ctx=ctx, js=js, req=req, t0=t0))
    accs = await gather([collect(ctx, x) for x in js])
    bodies = [
        dump(response(ctx=ctx, j=x, req=req, acc=acc, final=True, t0=t0))
        for x, acc in zip(js, accs, strict=True)
    ]
    return JSONResponse(bodies[0] if n == 1 else bodies)


def router(ctx: Context) -> APIRouter:
    r = APIRouter()

    @r.post("/generate", response_model=None)
    async def generate(req: p.GenerateRequest, request: Request) -> Any:
        return await create(ctx, req, request)

    return r


__all__ = [
    "check", "create", "dump", "finish_reason", "job_of", "knobs", "outputs", "response",
    "router", "streams",
]  # fmt: skip
