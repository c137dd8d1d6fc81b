"""JSON over HTTP to an engine's server, with the standard library only (``http.client``, one
connection per call, so every caller is thread-safe), and the Prometheus text its ``/metrics``
answers. Shared by the SGLang and vLLM clients and the torch engine's facade."""

from __future__ import annotations

import http.client
import json
import re
from typing import Any
from urllib.parse import urlsplit

from pearl.engines.base import EngineError


class HTTPError(EngineError):
    """A non-2xx answer; ``status`` and the decoded ``body`` are kept for the caller."""

    def __init__(self, method: str, url: str, status: int, body: object) -> None:
        super().__init__(f"{method} {url} answered {status}: {str(body)[:300]}")
        self.status, self.body = status, body


def request(
    url: str,
    method: str = "GET",
    payload: object = None,
    timeout_s: float = 30.0,
) -> tuple[int, Any]:
    """One HTTP call; JSON in and (when the answer is JSON) out. Connection errors raise."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(
        parts.hostname or "127.0.0.1", parts.port or 80, timeout=timeout_s
    )
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    data = None if payload is None else json.dumps(payload).encode()
    headers = {"Content-Type": "application/json"} if data is not None else {}
    try:
        conn.request(method, path, body=data, headers=headers)
        resp = conn.getresponse()
        raw = resp.read()
    except (OSError, http.client.HTTPException) as e:
        raise EngineError(f"{method} {url}: {type(e).__name__}: {e}") from None
    finally:
        conn.close()
    text = raw.decode("utf-8", errors="replace")
    try:
        body: Any = json.loads(text) if text.strip() else None
    except json.JSONDecodeError:
        body = text
    return resp.status, body


def call(url: str, method: str = "GET", payload: object = None, timeout_s: float = 30.0) -> Any:
    """:func:`request`, raising :class:`HTTPError` unless the status is 2xx."""
    status, body = request(url=url, method=method, payload=payload, timeout_s=timeout_s)
    if not 200 <= status < 300:
        raise HTTPError(method=method, url=url, status=status, body=body)
    return body


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> {metric name: value summed over its label sets}."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m is None or line.startswith("#"):
            continue
        try:
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(3))
        except ValueError:
            continue
    return out


__all__ = ["HTTPError", "call", "parse_metrics", "request"]
