"""The gateway's FastAPI application: OpenAI's chat and completions, SGLang's ``/generate``,
and PEARL's control routes, over one :class:`~pearl.gateway.backend.GatewayBackend`.

:func:`build_app` only wires: a :class:`~pearl.gateway.context.Context` over the backend, the
:class:`~pearl.gateway.guard.Guard` (and CORS), the error handlers, and one router per API
(:mod:`pearl.gateway.routes`).

Rules:
- Every answer that is not a success is an OpenAI error body
  (``{"error": {"message", "type", "param", "code"}}``): 400 for bad input (malformed JSON,
  a field PEARL does not implement yet, named: :mod:`pearl.gateway.fields`), 404
  ``model_not_found`` for another model, the :class:`~pearl.gateway.guard.Guard`'s
  refusals (401, 403, 408, 413, 415, 421, 429) before any route runs, a
  :class:`GatewayError`'s own status, 500 for anything unexpected. No error stops the app; an
  error after a stream began is its last event.
- The API key, when set, guards every route but vLLM's health routes (``/health``, ``/ping``,
  ``/version``); the comparison takes constant time.
- Fields a route does not read are ignored, as vLLM ignores them, and named in the response's
  ``X-PEARL-Ignored-Fields`` header; an explicit ``null`` is the field's default.
- Token-exact: ``token_ids`` are every generated id, the stop token included; text leaves out a
  final stop token. Weight versions come as ``[[first token index, version], ...]``.
- Stop strings end a response where its text first holds one (:mod:`pearl.gateway.stops`).
- The session is the ``X-Session-ID`` header, else the request's ``user``, else "": at most
  256 bytes (400 beyond).
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from pearl.config.gateway import GatewayConfig
from pearl.gateway import errors, routes
from pearl.gateway.backend import GatewayBackend
from pearl.gateway.context import Context
from pearl.gateway.errors import error_body
from pearl.gateway.guard import Guard, origin_of
from pearl.gateway.jobs import SESSION_HEADER
from pearl.gateway.output import Detok as _Detok  # noqa: F401  (tests/gateway import it here)
from pearl.gateway.routes.control import EVENT_KINDS
from pearl.gateway.serve import GatewayServer


def build_app(
    backend: GatewayBackend,
    *,
    api_key: str | None = None,
    max_body_bytes: int = 1 << 20,
    max_streams: int = 256,
    body_timeout_s: float = 30.0,
    allowed_origins: Sequence[str] = (),
) -> FastAPI:
    """The gateway over ``backend``; ``api_key`` None serves without authentication. At most
    ``max_streams`` generation requests, streamed or not, run at once; the other bounds and
    checks are the :class:`~pearl.gateway.guard.Guard`'s. Pages from ``allowed_origins`` get
    CORS answers (preflights included)."""
    app = FastAPI(title="PEARL gateway", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(
        Guard,
        api_key=api_key,
        max_body_bytes=max_body_bytes,
        max_requests=max_streams,
        body_timeout_s=body_timeout_s,
        allowed_origins=allowed_origins,
    )
    if allowed_origins:  # outside the guard: a preflight carries no API key
        app.add_middleware(
            CORSMiddleware,
            allow_origins=[origin_of(o) for o in allowed_origins],
            allow_methods=["GET", "POST"],
            allow_headers=["authorization", "content-type", SESSION_HEADER],
        )
    errors.install(app)
    ctx = Context.of(backend)
    for module in routes.MODULES:
        app.include_router(module.router(ctx))
    return app


PROCESS_HEADER = "x-pearl-gateway-process"


def tag_process(app: Any, index: int) -> Any:
    """``app`` answering every response with ``X-PEARL-Gateway-Process: index`` (which of the
    gateway processes sharing the port served it)."""
    header = (PROCESS_HEADER.encode(), str(index).encode())

    async def tagged(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return

        async def send_tagged(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), header]}
            await send(message)

        await app(scope, receive, send_tagged)

    return tagged


def open_gateway(
    backend: GatewayBackend,
    g: GatewayConfig,
    sock: socket.socket,
    api_key: str | None,
    process: int | None = None,
) -> GatewayServer:
    """The gateway over ``backend`` with ``[gateway]``'s bounds, serving on ``sock`` (bound by
    :func:`pearl.gateway.serve.bind`); returns once it serves. ``process``: the index of the
    gateway process serving it, told in every response (None: pearld's own gateway)."""
    app = build_app(
        backend,
        api_key=api_key,
        max_body_bytes=g.max_body_bytes,
        max_streams=g.max_streams,
        body_timeout_s=g.body_timeout_s,
        allowed_origins=g.allowed_origins,
    )
    asgi = app if process is None else tag_process(app, process)
    server = GatewayServer(
        asgi, g.listen, sock, max_connections=g.max_connections, header_timeout_s=g.header_timeout_s
    )
    return server.start()


__all__ = [
    "EVENT_KINDS",
    "PROCESS_HEADER",
    "SESSION_HEADER",
    "Guard",
    "build_app",
    "error_body",
    "open_gateway",
    "tag_process",
]
