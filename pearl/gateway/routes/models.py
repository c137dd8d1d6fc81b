"""``/v1/models``: the one model the gateway serves, with its context length."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from pearl.gateway import protocol as p
from pearl.gateway.context import Context
from pearl.gateway.jobs import check_model


def card(ctx: Context) -> p.ModelCard:
    b = ctx.backend
    return p.ModelCard(id=b.model, created=ctx.created, max_model_len=b.max_context)


def router(ctx: Context) -> APIRouter:
    r = APIRouter()

    @r.get("/v1/models")
    async def models() -> dict[str, Any]:
        return p.ModelList(data=[card(ctx)]).model_dump(mode="json")

    @r.get("/v1/models/{model:path}")
    async def model(model: str) -> dict[str, Any]:
        check_model(ctx, model)
        return card(ctx).model_dump(mode="json")

    return r


__all__ = ["card", "router"]
