"""A bare pass-through reverse proxy for SGLang's ``POST /generate``: the floor any extra hop
pays, on the gateway's HTTP stack (uvicorn's httptools protocol on uvloop, an ASGI app, httpx to
the workers).

    python benchmarks/passthrough.py --pool FILE --port PORT [--pinned]

It forwards each request's body as it came (never parsed) to one of the worker servers that
serve now, listed in ``FILE`` (``[[worker id, url], ...]``, rewritten by whoever keeps it and
re-read when its modification time changes), and answers with the worker's status and body.
No routing logic: round-robin over the listed workers, or with ``--pinned`` a session's hash
(``X-Session-ID``, CRC-32) over them, the placement ``bench_gateway.py``'s ``direct`` agents use.
A request to a worker that cannot be reached is answered 502; it is never retried.
"""

from __future__ import annotations

import argparse
import itertools
import json
import zlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class Serving:
    """The worker URLs of the pool file, re-read when it changes; ``pick`` places a session on
    one by its hash, ``next`` takes them in turn."""

    def __init__(self, path: str | Path) -> None:
        self.path, self.mtime, self.urls = Path(path), 0, list[str]()
        self._turn = itertools.count()

    def _fresh(self) -> list[str]:
        mtime = self.path.stat().st_mtime_ns
        if mtime != self.mtime:
            self.mtime, self.urls = mtime, [u for _, u in json.loads(self.path.read_text())]
        return self.urls

    def pick(self, sid: str) -> str:
        urls = self._fresh()
        return urls[zlib.crc32(sid.encode()) % len(urls)]

    def next(self) -> str:
        urls = self._fresh()
        return urls[next(self._turn) % len(urls)]


def app(pool: str | Path, pinned: bool) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    """The ASGI app: ``POST /generate`` forwarded (see the module), anything else 404."""
    serving = Serving(pool)
    limits = httpx.Limits(max_connections=2048, max_keepalive_connections=2048)
    http: httpx.AsyncClient | None = None

    async def reply(send: Send, status: int, body: bytes, kind: bytes) -> None:
        headers = [(b"content-type", kind), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def asgi(scope: Scope, receive: Receive, send: Send) -> None:
        nonlocal http
        if scope["type"] == "lifespan":
            await receive()  # lifespan.startup
            await send({"type": "lifespan.startup.complete"})
            await receive()  # lifespan.shutdown
            if http is not None:
                await http.aclose()
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["method"] != "POST" or scope["path"] != "/generate":
            await reply(send, 404, b"not served", b"text/plain")
            return
        chunks = []
        while True:
            msg = await receive()
            chunks.append(msg.get("body", b""))
            if not msg.get("more_body"):
                break
        if http is None:
            http = httpx.AsyncClient(timeout=300, limits=limits)
        if pinned:
            sid = dict(scope["headers"]).get(b"x-session-id", b"").decode()
            url = serving.pick(sid)
        else:
            url = serving.next()
        try:
            r = await http.post(
                url + "/generate", content=b"".join(chunks),
                headers={"content-type": "application/json"},
            )  # fmt: skip
        except httpx.HTTPError as e:
            await reply(send, 502, f"{url}: {type(e).__name__}: {e}".encode(), b"text/plain")
            return
        await reply(send, r.status_code, r.content, r.headers.get("content-type", "").encode())

    return asgi


def main() -> None:
    import uvicorn

    ap = argparse.ArgumentParser()
    ap.add_argument("--pool", required=True, help="the pool file: [[worker id, url], ...]")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--pinned", action="store_true", help="place by X-Session-ID's hash")
    a = ap.parse_args()
    uvicorn.run(
        app(a.pool, a.pinned), host="127.0.0.1", port=a.port, http="httptools", loop="uvloop",
        lifespan="on", log_level="warning", access_log=False, backlog=2048,
    )  # fmt: skip


if __name__ == "__main__":
    main()
