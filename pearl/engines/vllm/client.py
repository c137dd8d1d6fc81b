"""One HTTP client for a vLLM server (its OpenAI-compatible API and its development endpoints).

Standard library only, as for SGLang (``http.client``, one connection per call). Generation
streams ``/v1/completions`` with token ids in and out (``return_token_ids``), so the tokens and
their logprobs are known as they come: :class:`Completion` is one such request, and
:meth:`Completion.cancel` closes its connection, which vLLM takes as an abort of the request
(the tokens read so far are kept by the caller). A refusal of the request itself, whether the
answer's status is 4xx or a 4xx error comes as a chunk of the stream (vLLM checks token ids and
stop ids after it has answered 200), raises :class:`RequestRefused` with the server's reason:
final for that request. Anything else that ends a stream early raises a plain EngineError. The
development endpoints (``/pause``, ``/resume``, ``/sleep``, ``/wake_up``, ``/collective_rpc``,
``/reset_prefix_cache``, ``/update_weight_version``) need the server started with
``VLLM_SERVER_DEV_MODE=1``.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from pearl.core.errors import RequestRefused
from pearl.engines.base import EngineError
from pearl.engines.web import call, parse_metrics


@dataclass
class Stream:
    """What a streamed completion has produced so far."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    # per token, the (id, logprob) alternatives, most likely first (with logprobs=k)
    top: list[tuple[tuple[int, float], ...]] = field(default_factory=list)
    finish_reason: str | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0


class Completion:
    """One streamed ``/v1/completions`` request; :meth:`run` reads it to the end, and
    :meth:`cancel` (from any thread) ends it early: vLLM aborts a request whose client left."""

    def __init__(self, base: str, body: dict[str, Any], timeout_s: float) -> None:
        parts = urlsplit(base)
        self._conn = http.client.HTTPConnection(
            parts.hostname or "127.0.0.1", parts.port or 80, timeout=timeout_s
        )
        self._body = json.dumps({**body, "stream": True}).encode()
        self._lock = threading.Lock()
        self.cancelled = False
        self.out = Stream()

    def run(self) -> Stream:
        """Post the request and read its chunks; returns at the last chunk, or early (with what
        came so far) once cancelled. Raises EngineError when the server fails it."""
        try:
            with self._lock:
                if self.cancelled:
                    return self.out
                self._conn.request(
                    "POST",
                    "/v1/completions",
                    body=self._body,
                    headers={"Content-Type": "application/json"},
                )
            resp = self._conn.getresponse()
            if resp.status != 200:
                raise refusal(resp.status, resp.read().decode(errors="replace"))
            for chunk in _events(resp):
                self._take(chunk)
        except (OSError, http.client.HTTPException) as e:
            if not self.cancelled:
                raise EngineError(f"POST /v1/completions: {type(e).__name__}: {e}") from None
        finally:
            self._conn.close()
        return self.out

    def _take(self, chunk: dict[str, Any]) -> None:
        out = self.out
        if "error" in chunk:  # the server failed the request after its 200
            error = chunk["error"]
            code = error.get("code") if isinstance(error, dict) else None
            raise refusal(code if isinstance(code, int) else 500, json.dumps(error))
        usage = chunk.get("usage") or {}
        if usage:
            out.prompt_tokens = int(usage.get("prompt_tokens") or out.prompt_tokens)
            details = usage.get("prompt_tokens_details") or {}
            out.cached_tokens = int(details.get("cached_tokens") or 0)
        for choice in chunk.get("choices") or ():
            ids = choice.get("token_ids") or ()
            out.token_ids.extend(int(t) for t in ids)
            lp = (choice.get("logprobs") or {}).get("token_logprobs") or ()
            out.logprobs.extend(float(x) if x is not None else 0.0 for x in lp)
            tops = (choice.get("logprobs") or {}).get("top_logprobs") or ()
            out.top.extend(alternatives(t) for t in tops)
            if choice.get("prompt_token_ids"):
                out.prompt_tokens = len(choice["prompt_token_ids"])
            if choice.get("finish_reason"):
                out.finish_reason = str(choice["finish_reason"])

    def cancel(self) -> None:
        """Close the connection: the reader returns what it has, vLLM aborts the request."""
        with self._lock:
            self.cancelled = True
            sock = self._conn.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


def alternatives(top: dict[str, float] | None) -> tuple[tuple[int, float], ...]:
    """One token's ``top_logprobs`` of a completions answer with ``return_tokens_as_token_ids``
    (``{"token_id:N": logprob}``, the k most likely and the sampled token) as (id, logprob)
    pairs, most likely first. The caller keeps the first k."""
    pairs = []
    for key, lp in (top or {}).items():
        _, _, tail = key.rpartition(":")
        if tail.lstrip("-").isdigit():
            pairs.append((int(tail), float(lp) if lp is not None else -9999.0))
    return tuple(sorted(pairs, key=lambda x: -x[1]))


def refusal(status: int, text: str) -> EngineError:
    """The error of a failed completion: :class:`RequestRefused` for a 4xx (the request's own
    fault, with the server's message), a plain EngineError otherwise."""
    reason = text.strip()
    with contextlib.suppress(ValueError, AttributeError, TypeError):
        body = json.loads(text)
        body = body.get("error", body) if isinstance(body, dict) else body
        reason = str(body.get("message") or reason)
    reason = reason[:500]
    if 400 <= status < 500:
        return RequestRefused(f"the vLLM server refused the request ({status}): {reason}")
    return EngineError(f"POST /v1/completions answered {status}: {reason}")


def _events(resp: http.client.HTTPResponse) -> Iterator[dict[str, Any]]:
    """The JSON objects of a server-sent event stream, up to ``data: [DONE]``."""
    for raw in resp:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            return
        try:
            yield json.loads(data)
        except json.JSONDecodeError:
            raise EngineError(f"vLLM sent a chunk that is not JSON: {data[:200]!r}") from None


class VLLMClient:
    """The calls PEARL makes to one vLLM server at ``base`` (``http://host:port``)."""

    def __init__(self, base: str) -> None:
        self.base = base.rstrip("/")

    def completion(self, body: dict[str, Any], timeout_s: float) -> Completion:
        return Completion(self.base, body, timeout_s)

    def healthy(self) -> bool:
        try:
            call(self.base + "/health", timeout_s=5.0)
            return True
        except EngineError:
            return False

    def wait_healthy(self, timeout_s: float, alive: Callable[[], bool] | None = None) -> None:
        """Until ``/health`` answers; raises EngineError after ``timeout_s`` or when ``alive()``
        says the server process is gone."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if alive is not None and not alive():
                raise EngineError(f"the vLLM server for {self.base} exited while starting")
            if self.healthy():
                return
            time.sleep(0.5)
        raise EngineError(f"the vLLM server at {self.base} did not answer /health in {timeout_s}s")

    def metrics(self) -> dict[str, float]:
        return parse_metrics(call(self.base + "/metrics", timeout_s=10.0))

    def pause(self) -> None:
        """Stop scheduling (requests in flight wait); what vLLM offers on CPUs for a lend."""
        call(self.base + "/pause", "POST", {}, timeout_s=60.0)

    def resume(self) -> None:
        call(self.base + "/resume", "POST", {}, timeout_s=60.0)

    def sleep(self, level: int = 1) -> None:
        """Free the device memory (CUDA, ``--enable-sleep-mode``): level 1 keeps the weights
        in host memory, so ``wake_up`` needs no reload."""
        call(f"{self.base}/sleep?level={level}", "POST", timeout_s=120.0)

    def wake_up(self) -> None:
        call(self.base + "/wake_up", "POST", timeout_s=120.0)

    def collective_rpc(self, method: str, *args: str, timeout_s: float = 600.0) -> Any:
        """Call a method of the worker extension on every worker (string arguments only)."""
        return call(
            self.base + "/collective_rpc",
            "POST",
            {"method": method, "args": list(args), "timeout": timeout_s},
            timeout_s=timeout_s + 10.0,
        )

    def reset_prefix_cache(self) -> None:
        call(self.base + "/reset_prefix_cache", "POST", timeout_s=60.0)

    def update_weight_version(self, version: int) -> None:
        call(
            self.base + "/update_weight_version",
            "POST",
            {"new_version": str(version)},
            timeout_s=30.0,
        )

    def weight_version(self) -> str | None:
        body = call(self.base + "/weight_info", timeout_s=10.0)
        return None if body is None else body.get("weight_version")


__all__ = ["Completion", "Stream", "VLLMClient", "refusal"]
