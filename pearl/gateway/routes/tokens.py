"""vLLM's ``POST /tokenize`` and ``POST /detokenize``, in vLLM's shapes.

``/tokenize`` takes a ``prompt`` (text, as completions encode it) or ``messages`` (rendered with
the model's chat template, as chat renders them: ``tools``, ``chat_template_kwargs``,
``add_generation_prompt``) and answers ``count``, ``max_model_len`` and ``tokens`` (with
``return_token_strs``, each token's text as ``token_strs``). ``/detokenize`` takes ``tokens``
(of the served vocabulary) and answers their text as ``prompt``. ``model`` is optional; another
model than the served one is a 404. Fields the routes do not read are ignored and named, as on
chat and completions (:mod:`pearl.gateway.fields`).
"""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response

from pearl.gateway import fields
from pearl.gateway import protocol as p
from pearl.gateway.context import Context
from pearl.gateway.errors import refuse
from pearl.gateway.jobs import check_ids, check_model, check_text
from pearl.gateway.routes.chat import prompt_ids

TOKENIZE = "tokenize"


def tokenize(
    ctx: Context, req: p.TokenizeCompletionRequest | p.TokenizeChatRequest
) -> p.TokenizeResponse:
    check_text(req)
    check_model(ctx, req.model)
    if isinstance(req, p.TokenizeChatRequest):
        if req.continue_final_message:
            raise refuse("continue_final_message is not supported", "continue_final_message")
        tokens = prompt_ids(ctx, req, generation_prompt=req.add_generation_prompt)
    else:
        tokens = list(ctx.tok.encode(req.prompt))
    strs = [ctx.token_text(i) for i in tokens] if req.return_token_strs else None
    return p.TokenizeResponse(
        count=len(tokens), max_model_len=ctx.backend.max_context, tokens=tokens, token_strs=strs
    )


def detokenize(ctx: Context, req: p.DetokenizeRequest) -> p.DetokenizeResponse:
    check_model(ctx, req.model)
    check_ids(ctx, req.tokens, "tokens")
    return p.DetokenizeResponse(prompt=str(ctx.tok.decode(req.tokens)))


def router(ctx: Context) -> APIRouter:
    r = APIRouter()

    @r.post("/tokenize", response_model=None)
    async def tokenize_route(
        req: p.TokenizeCompletionRequest | p.TokenizeChatRequest,
    ) -> Response:
        body = tokenize(ctx, req).model_dump(mode="json", exclude_none=True)
        return fields.mark(JSONResponse(body), fields.ignored(req, TOKENIZE, nested=()))

    @r.post("/detokenize", response_model=None)
    async def detokenize_route(req: p.DetokenizeRequest) -> Response:
        body = detokenize(ctx, req).model_dump(mode="json")
        return fields.mark(JSONResponse(body), fields.ignored(req, TOKENIZE, nested=()))

    return r


__all__ = ["detokenize", "router", "tokenize"]
