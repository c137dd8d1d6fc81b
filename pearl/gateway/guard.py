"""The gateway's guard: the ASGI middleware every request passes before any route sees it.

In order, each refusal an OpenAI error body, before the body is parsed or anything reaches the
pool:
1. **Host** (421): on a loopback listener, a ``Host`` header must name the listener (its
   address, ``localhost``, ``127.0.0.1`` or ``[::1]``, with its port). A page whose name was
   rebound to 127.0.0.1 cannot read the gateway. A request without ``Host`` is not a browser's.
2. **Origin** (403): a request with an ``Origin`` header (a browser's, cross-site or not) is
   refused unless that origin is in ``allowed_origins``.
3. **API key** (401), when one is set; compared in constant time. The health routes
   (:data:`OPEN_PATHS`: ``/health``, ``/ping``, ``/version``) need none, as in vLLM, so that a
   load balancer's or Kubernetes' probe can call them; checks 1 and 2 still apply.
4. **JSON control** (415): a ``POST /pearl/...`` must be ``Content-Type: application/json``,
   which a page cannot send without a CORS preflight.
5. **Requests** (429 + ``Retry-After``): at most ``max_requests`` generation requests
   (:data:`GENERATION_PATHS`), streamed or not, at once. A slot is held from here until the
   response ends, however it ends (freed as its last message goes out, so a client that has
   its answer can send the next request at once).
6. **Body**: over ``max_body_bytes`` (declared or not) is 413; not all there within
   ``body_timeout_s`` is 408. Both close the connection.
7. The app runs; when the client leaves before its response ended, the app's task is
   cancelled, so a request, streamed or not, is aborted in the pool (the backend's generator is
   closed). An unexpected exception is a 500 body if nothing was sent yet, and logged.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import logging
from collections.abc import Callable, Iterable

from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pearl.gateway.errors import error_body

log = logging.getLogger("pearl.gateway")

GENERATION_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/generate"})
OPEN_PATHS = frozenset({"/health", "/ping", "/version"})  # no API key (vLLM's health routes)
CONTROL_PREFIX = "/pearl/"
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "[::1]"})
RETRY_S = 1  # Retry-After of a request refused over the bound


async def send_error(
    send: Send,
    status: int,
    message: str,
    code: str | None = None,
    headers: Iterable[tuple[bytes, bytes]] = (),
) -> None:
    payload = json.dumps(error_body(message, status, code=code)).encode()
    head = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(payload))]
    if status == 401:
        head.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": [*head, *headers]})
    await send({"type": "http.response.body", "body": payload})


CLOSE = ((b"connection", b"close"),)


def origin_of(text: str) -> str:
    """An origin as browsers send it: ``scheme://host[:port]``, lower case, no trailing slash."""
    return text.strip().rstrip("/").lower()


def _loopback(host: str) -> bool:
    try:
        ip = ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return bool(ip.is_loopback or (mapped is not None and mapped.is_loopback))


def host_allowed(header: bytes, server: tuple[str, int] | None) -> bool:
    """Whether ``Host: header`` names the loopback listener ``server`` (any Host is allowed on
    another listener: the API key guards it)."""
    if not server or not _loopback(server[0]):
        return True
    text = header.decode("latin-1").strip().lower()
    if text.startswith("["):  # [v6]:port
        name, _, rest = text.partition("]")
        name, port = name + "]", rest[1:] if rest.startswith(":") else ""
    else:
        name, _, port = text.partition(":")
    if not (port or "80").isdigit() or int(port or "80") != server[1]:
        return False
    own = f"[{server[0]}]" if ":" in server[0] else server[0]
    return name in LOOPBACK_NAMES or name == own


class Guard:
    """ASGI middleware, outermost of the app's own (see the module for its checks, in order)."""

    def __init__(
        self,
        app: ASGIApp,
        api_key: str | None,
        max_body_bytes: int,
        max_requests: int = 256,
        body_timeout_s: float = 30.0,
        allowed_origins: Iterable[str] = (),
    ) -> None:
        self.app, self.max_body = app, max_body_bytes
        self.expected = None if api_key is None else api_key.encode()
        self.max_requests, self.body_timeout_s = max_requests, body_timeout_s
        self.origins = frozenset(origin_of(o) for o in allowed_origins)
        self.active = 0  # generation requests holding a slot (one event loop: no lock)

    def authorized(self, header: bytes) -> bool:
        """``Bearer KEY`` (the scheme in any case), compared in constant time."""
        assert self.expected is not None
        scheme, _, token = header.strip().partition(b" ")
        ok = hmac.compare_digest(token.strip(), self.expected)
        return ok and scheme.lower() == b"bearer"

    def refusal(self, scope: Scope, headers: dict[bytes, bytes]) -> tuple[int, str] | None:
        """Checks 1-4 of the module: (status, message) of the first that fails, or None."""
        host = headers.get(b"host")
        if host is not None and not host_allowed(host, scope.get("server")):
            return 421, (
                f"Host {host.decode('latin-1')!r} does not name this gateway's loopback "
                "address; use 127.0.0.1 or localhost with its port"
            )
        origin = headers.get(b"origin")
        if origin is not None and origin_of(origin.decode("latin-1")) not in self.origins:
            return 403, (
                f"requests from the browser origin {origin.decode('latin-1')!r} are refused; "
                "list it in gateway.allowed_origins to allow it"
            )
        keyed = self.expected is not None and scope["path"] not in OPEN_PATHS
        if keyed and not self.authorized(headers.get(b"authorization", b"")):
            return 401, "missing or wrong API key (Authorization: Bearer KEY)"
        if scope["method"] == "POST" and scope["path"].startswith(CONTROL_PREFIX):
            media = headers.get(b"content-type", b"").partition(b";")[0].strip().lower()
            if media != b"application/json":
                return 415, "a control request's body must be JSON (Content-Type: application/json)"
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        refused = self.refusal(scope, headers)
        if refused is not None:
            code = "invalid_api_key" if refused[0] == 401 else None
            await send_error(send, *refused, code=code)
            return
        counted = scope["method"] == "POST" and scope["path"] in GENERATION_PATHS
        if counted:
            if self.active >= self.max_requests:
                await send_error(
                    send,
                    429,
                    f"too many concurrent requests (limit {self.max_requests}); retry later",
                    headers=[(b"retry-after", b"%d" % RETRY_S)],
                )
                return
            self.active += 1
        held = counted

        def release() -> None:
            nonlocal held
            if held:
                held, self.active = False, self.active - 1

        try:
            await self.serve(
                scope=scope, receive=receive, send=send, headers=headers, release=release
            )
        finally:
            release()

    async def serve(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        headers: dict[bytes, bytes],
        release: Callable[[], None],
    ) -> None:
        """Checks 6 and 7 of the module; ``release`` frees the request's slot."""
        too_big = f"request body over {self.max_body} bytes"
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body:
            await send_error(send, 413, too_big, headers=CLOSE)
            return
        chunks: list[bytes] = []
        try:
            async with asyncio.timeout(self.body_timeout_s):
                status = await self.read_body(receive, chunks)
        except TimeoutError:
            late = f"the request body did not arrive within {self.body_timeout_s:g} s"
            await send_error(send, 408, late, headers=CLOSE)
            return
        if status == "gone":
            return
        if status == "big":
            await send_error(send, 413, too_big, headers=CLOSE)
            return
        await self.run(
            scope=scope, body=b"".join(chunks), receive=receive, send=send, release=release
        )

    async def read_body(self, receive: Receive, chunks: list[bytes]) -> str:
        """The body into ``chunks``: "ok", "big" (over the bound) or "gone" (the client left)."""
        total, more = 0, True
        while more:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return "gone"
            chunk = msg.get("body", b"")
            total += len(chunk)
            if total > self.max_body:
                return "big"
            chunks.append(chunk)
            more = msg.get("more_body", False)
        return "ok"

    async def run(
        self,
        scope: Scope,
        body: bytes,
        receive: Receive,
        send: Send,
        release: Callable[[], None],
    ) -> None:
        """The app on ``body``, cancelled when the client leaves before the response ended.
        The slot is released before the response's last message is sent: a client that has
        its whole answer may send the next request at once, while the app is still unwinding."""
        replayed = started = finished = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        async def tracked(msg: Message) -> None:
            nonlocal started, finished
            started = started or msg["type"] == "http.response.start"
            if msg["type"] == "http.response.body" and not msg.get("more_body", False):
                finished = True
                release()
            await send(msg)

        task = asyncio.ensure_future(self.app(scope, replay, tracked))
        # The body is read: the server's next message is http.disconnect (the client left, or
        # the response ended).
        gone = asyncio.ensure_future(receive())
        try:
            await asyncio.wait((task, gone), return_when=asyncio.FIRST_COMPLETED)
            if not task.done() and not finished:
                log.debug("gateway: the client left %s %s", scope["method"], scope["path"])
                task.cancel()
            await asyncio.wait((task,))
            if task.cancelled():
                return
            task.result()
        except ClientDisconnect:
            log.debug("gateway: the client left %s %s", scope["method"], scope["path"])
        except Exception as e:
            log.exception("gateway: unexpected error on %s %s", scope["method"], scope["path"])
            if not started:
                await send_error(send, 500, f"internal error: {type(e).__name__}: {e}")
        finally:
            gone.cancel()
            if not task.done():  # the guard itself was cancelled (the server stops)
                task.cancel()


__all__ = [
    "GENERATION_PATHS",
    "OPEN_PATHS",
    "Guard",
    "host_allowed",
    "origin_of",
    "send_error",
]
