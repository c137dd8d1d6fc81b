"""vLLM's health routes, for load balancers and Kubernetes probes: ``GET /health`` (200 with an
empty body once a worker serves requests; 503 with the reason before), ``GET``/``POST /ping``
(the same answer: SageMaker's name for it) and ``GET /version``. As in vLLM they need no API key
(the :class:`~pearl.gateway.guard.Guard` still checks ``Host`` and ``Origin``)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import Response

import pearl
from pearl.gateway.backend import GatewayError
from pearl.gateway.context import Context
from pearl.gateway.guard import OPEN_PATHS

PATHS = OPEN_PATHS  # served without the API key


async def health(ctx: Context) -> Response:
    """200 once a worker serves; else a 503 naming why not."""
    try:
        why = await ctx.backend.serving()
    except GatewayError:
        raise
    except Exception as e:  # the pool did not answer: not healthy, and say so
        why = f"the pool did not answer: {type(e).__name__}: {e}"
    if why is not None:
        raise GatewayError(f"not serving: {why}", 503, "server_error", retry_after_s=1.0)
    return Response(status_code=200)


def router(ctx: Context) -> APIRouter:
    r = APIRouter()

    @r.get("/health", response_model=None)
    async def health_route() -> Response:
        return await health(ctx)

    @r.api_route("/ping", methods=["GET", "POST"], response_model=None)
    async def ping() -> Response:
        return await health(ctx)

    @r.get("/version")
    async def version() -> dict[str, Any]:
        return {"version": pearl.__version__}

    return r


__all__ = ["PATHS", "health", "router"]
