"""Server-sent events: each event a ``data:`` line of compact JSON, then ``data: [DONE]``.

An error after a stream began cannot change its status: it is the stream's last event, an
OpenAI error body, before ``[DONE]``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import StreamingResponse

from pearl.gateway import protocol as p
from pearl.gateway.backend import GatewayError
from pearl.gateway.errors import error_body

log = logging.getLogger("pearl.gateway")

DONE = "data: [DONE]\n\n"


def sse(obj: Any) -> str:
    """One event: a response model or a JSON value."""
    if isinstance(obj, p.BaseModel):
        obj = obj.model_dump(mode="json")
    return f"data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n"


def stream_error(e: Exception) -> str:
    """``e`` as an event; an unexpected one is logged and named."""
    if isinstance(e, GatewayError):
        return sse(error_body(message=e.message, status=e.status, kind=e.kind, param=e.param))
    log.exception("gateway: unexpected error in a stream")
    return sse(error_body(f"internal error: {type(e).__name__}: {e}", 500))


async def events(items: AsyncIterator[Any]) -> AsyncIterator[str]:
    """``items`` as events; an error ends them with its event; then ``[DONE]``."""
    try:
        async for item in items:
            yield sse(item)
    except Exception as e:
        yield stream_error(e)
    yield DONE


class EventStream(StreamingResponse):
    """A server-sent-events response of ``items`` (see :func:`events`)."""

    def __init__(self, items: AsyncIterator[Any]) -> None:
        super().__init__(
            events(items),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )


__all__ = ["DONE", "EventStream", "events", "sse", "stream_error"]
