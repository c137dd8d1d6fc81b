"""PEARL's control routes: ``GET /pearl/v1/status`` (``pearl status --json``) and
``POST /pearl/v1/events/{kind}``, an elastic event whose body is its fields as a JSON object.
The answers are the backend's handlers', as with the ZeroMQ API. ``training-begin`` answers once
training may proceed (borrowed GPUs back), unless ``?wait=false``."""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from pearl.core import events as ev
from pearl.gateway.backend import GatewayError
from pearl.gateway.context import Context
from pearl.gateway.errors import refuse

EVENT_KINDS = tuple(c.KIND for c in ev.ELASTIC_EVENTS)


def event_fields(raw: bytes) -> dict[str, Any]:
    """An event's body: a JSON object, or nothing (no fields)."""
    try:
        fields = json.loads(raw) if raw.strip() else {}
    except ValueError as e:
        raise refuse(f"malformed JSON body: {e}", None) from e
    if not isinstance(fields, dict):
        raise refuse("the event's body must be a JSON object of its fields", None)
    return fields


def router(ctx: Context) -> APIRouter:
    r = APIRouter()

    @r.get("/pearl/v1/status")
    async def status() -> Any:
        return JSONResponse(await ctx.backend.status())

    @r.post("/pearl/v1/events/{kind}")
    async def event(kind: str, request: Request) -> Any:
        if kind not in EVENT_KINDS:
            raise GatewayError(
                message=f"unknown event {kind!r}; one of {', '.join(EVENT_KINDS)}",
                status=404,
                kind="not_found_error",
                param="kind",
            )
        fields = event_fields(await request.body())
        wait = request.query_params.get("wait", "true").lower() not in ("false", "0", "no")
        return JSONResponse(await ctx.backend.event(kind, fields, wait=wait))

    return r


__all__ = ["EVENT_KINDS", "event_fields", "router"]
