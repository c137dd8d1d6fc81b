"""The gateway's one error shape: OpenAI's ``{"error": {"message", "type", "param", "code"}}``.

Every answer that is not a success has this body: 400 for bad input (malformed JSON, unknown
model, unsupported parameters, named), the Guard's refusals before any route runs, a
:class:`~pearl.gateway.backend.GatewayError`'s own status, 500 for anything unexpected.
:func:`install` makes the app answer FastAPI's and Starlette's own errors this way too.
"""

from __future__ import annotations

import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from pearl.gateway import protocol as p
from pearl.gateway.backend import GatewayError

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    421: "invalid_request_error",
    429: "rate_limit_error",
}


def error_body(
    message: str,
    status: int,
    kind: str | None = None,
    param: str | None = None,
    code: str | None = None,
) -> dict[str, Any]:
    """OpenAI's error body; ``kind`` defaults to the type OpenAI gives ``status``."""
    kind = kind or _ERROR_TYPES.get(status, "server_error" if status >= 500 else "api_error")
    # An error may quote the client's input, lone surrogates included: they must not make the
    # error itself unencodable.
    message, param = _text(message), None if param is None else _text(param)
    return p.ErrorResponse(
        error=p.ErrorBody(message=message, type=kind, param=param, code=code)
    ).model_dump()


def _text(s: str) -> str:
    """``s`` as text that UTF-8 can encode (a lone surrogate becomes "?")."""
    return s.encode("utf-8", "replace").decode("utf-8") if not s.isascii() else s


def refuse(message: str, param: str | None) -> GatewayError:
    """A 400 for bad input, ``param`` the field at fault."""
    return GatewayError(message=message, status=400, kind="invalid_request_error", param=param)


def error_response(e: GatewayError) -> JSONResponse:
    """``e`` as a response, with ``Retry-After`` for a transient refusal."""
    headers = None
    if e.retry_after_s is not None:
        headers = {"Retry-After": str(max(1, math.ceil(e.retry_after_s)))}
    return JSONResponse(
        error_body(message=e.message, status=e.status, kind=e.kind, param=e.param, code=e.code),
        status_code=e.status,
        headers=headers,
    )


def _is_union_tag(part: object) -> bool:
    return isinstance(part, str) and (
        part in {"str", "int", "float", "bool", "dict", "list", "none"} or "[" in part
    )


def validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    """The first of pydantic's complaints as a message and the parameter it names."""
    err = exc.errors()[0]
    # The location without "body" and without pydantic's union-member tags ("str", "list[int]").
    loc = [str(x) for x in err.get("loc", ()) if x != "body" and not _is_union_tag(x)]
    param = ".".join(loc) or None
    if err.get("type") == "json_invalid":
        return f"malformed JSON body: {err.get('ctx', {}).get('error', err.get('msg'))}", None
    if err.get("type") == "extra_forbidden":
        return f"unsupported parameter: {param!r}", param
    if err.get("type") == "missing":
        return f"missing required parameter: {param!r}", param
    return f"invalid {param or 'body'}: {err.get('msg')}", param


def install(app: FastAPI) -> None:
    """Answer a GatewayError, a request that fails validation and Starlette's own HTTP errors
    (404, 405) with error bodies."""

    @app.exception_handler(GatewayError)
    async def _gateway_error(_: Request, e: GatewayError) -> JSONResponse:
        return error_response(e)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, e: RequestValidationError) -> JSONResponse:
        message, param = validation_message(e)
        return error_response(refuse(message, param))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, e: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(error_body(str(e.detail), e.status_code), status_code=e.status_code)


__all__ = ["error_body", "error_response", "install", "refuse", "validation_message"]
