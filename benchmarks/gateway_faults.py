"""The chaos run's gateway side: agents that keep chatting through pearld's gateway, and the
faults an outside client can throw at it (issue 41).

- :class:`Agents`: a few sessions, each sending chat requests one after another (streamed or
  not), as an OpenAI client would: a 429 or 503 with ``Retry-After`` is waited out and sent
  again. Every request is recorded with its start, end and outcome, so that the run can tell a
  request that failed because pearld itself was down (killed on purpose) from one that failed
  and should not have.
- :func:`poison`: requests that once took pearld or a worker host down or failed their
  neighbours: integers past 64 bits, ids past the vocabulary, lone surrogates, ``NaN``.
  Each must get a 4xx.
- :func:`slow_clients`: connections that send half a request and then nothing (slowloris);
  pearld must keep serving its API and the agents meanwhile.
- :func:`abandon`: long requests whose clients hang up at once; the pool must not keep
  generating for them.
"""

from __future__ import annotations

import contextlib
import json
import random
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

import httpx

MODEL = "pearl-chaos"
KEY = "sk-chaos"
RETRY_CAP_S = 2.0  # an agent waits at most this long on a Retry-After before sending again
PATIENCE_S = 90.0  # an agent gives a request up after this long


@dataclass
class Call:
    session: str
    t0: float
    t1: float = 0.0
    ok: bool = False
    status: int | None = None
    error: str = ""
    retries: int = 0


def headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {KEY}"}


class Agents(threading.Thread):
    """``n`` sessions chatting through the gateway at ``url`` until :meth:`stop`."""

    def __init__(self, url: str, n: int, rng: random.Random) -> None:
        super().__init__(name="chaos-agents", daemon=True)
        self.url, self.n, self.rng = url, n, rng
        self.calls: list[Call] = []
        self.halt = threading.Event()
        self._lock = threading.Lock()

    def run(self) -> None:
        rngs = [random.Random(self.rng.random()) for _ in range(self.n)]
        threads = [
            threading.Thread(target=self._session, args=(f"agent-{k}", r), daemon=True)
            for k, r in enumerate(rngs)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def stop(self) -> None:
        self.halt.set()
        if self.is_alive():
            self.join(PATIENCE_S + 30)

    def _session(self, session: str, rng: random.Random) -> None:
        messages: list[dict[str, str]] = []
        with httpx.Client(base_url=self.url, headers=headers(), timeout=PATIENCE_S) as http:
            while not self.halt.is_set():
                if len(messages) > 8:
                    messages = []
                messages.append({"role": "user", "content": f"turn {len(messages)} of {session}"})
                body = {
                    "model": MODEL,
                    "messages": messages,
                    "max_tokens": rng.randint(4, 24),
                    "stream": rng.random() < 0.5,
                }
                call = self._call(http, session, body)
                with self._lock:
                    self.calls.append(call)
                if call.ok:
                    messages.append({"role": "assistant", "content": "ok"})
                self.halt.wait(rng.uniform(0.0, 0.2))

    def _call(self, http: httpx.Client, session: str, body: dict[str, Any]) -> Call:
        call = Call(session, time.monotonic())
        deadline = call.t0 + PATIENCE_S
        while True:
            try:
                r = http.post("/v1/chat/completions", json=body, headers={"X-Session-ID": session})
                call.status = r.status_code
                if r.status_code == 200:
                    call.ok, call.error = stream_ok(r)
                    break
                call.error = r.text[:200]
                wait = r.headers.get("retry-after")
                if r.status_code in (429, 503) and wait and time.monotonic() < deadline:
                    call.retries += 1
                    self.halt.wait(min(float(wait), RETRY_CAP_S))
                    continue
                break
            except httpx.HTTPError as e:
                call.status, call.error = None, f"{type(e).__name__}: {e}"[:200]
                break
        call.t1 = time.monotonic()
        return call

    def snapshot(self) -> list[Call]:
        with self._lock:
            return list(self.calls)


def stream_ok(r: httpx.Response) -> tuple[bool, str]:
    """(finished, error) of a 200: a stream must end in ``[DONE]`` without an error event."""
    if not r.headers.get("content-type", "").startswith("text/event-stream"):
        choice = r.json()["choices"][0]
        return choice["finish_reason"] in ("stop", "length", "tool_calls"), ""
    lines = [x[6:] for x in r.text.splitlines() if x.startswith("data: ")]
    for x in lines:
        if x.startswith("{") and '"error"' in x:
            return False, x[:200]
    return bool(lines) and lines[-1] == "[DONE]", ""


def excused(call: Call, down: list[tuple[float, float]]) -> bool:
    """A failed call whose life crossed a window in which pearld was down (on purpose)."""
    return any(call.t0 <= end and call.t1 >= start for start, end in down)


# -- the faults ----------------------------------------------------------------------------------

POISON: tuple[tuple[str, dict[str, Any]], ...] = (
    ("/v1/chat/completions", {"stop_token_ids": [2**64]}),
    ("/v1/chat/completions", {"seed": 2**64}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "\ud800"}]}),
    ("/v1/completions", {"prompt": [10**9, 5]}),
    ("/v1/completions", {"prompt": [2**64]}),
    ("/generate", {"input_ids": [2**64]}),
    ("/generate", {"input_ids": [-1, 3]}),
    ("/v1/chat/completions", {"temperature": float("nan")}),
    ("/v1/chat/completions", {"max_tokens": 2**63}),
)


def poison(url: str, rng: random.Random) -> tuple[int, list[str]]:
    """Send the poison requests (in a random order): (sent, those not answered with a 4xx)."""
    base = {
        "/v1/chat/completions": {"model": MODEL, "messages": [{"role": "user", "content": "x"}]},
        "/v1/completions": {"model": MODEL, "prompt": "x"},
        "/generate": {"text": "x"},
    }
    bad = []
    items = list(POISON)
    rng.shuffle(items)
    with httpx.Client(base_url=url, headers=headers(), timeout=30) as http:
        for route, fields in items:
            body = json.dumps({**base[route], **fields}).encode()
            try:
                r = http.post(route, content=body, headers={"Content-Type": "application/json"})
            except httpx.HTTPError as e:
                bad.append(f"{route} {fields}: {type(e).__name__}")
                continue
            if not 400 <= r.status_code < 500:
                bad.append(f"{route} {list(fields)}: {r.status_code} {r.text[:120]}")
    return len(items), bad


def slow_clients(
    port: int, n: int, hold_s: float, halt: threading.Event, probe: Any
) -> dict[str, Any]:
    """Open ``n`` connections that send half a request's headers (or its headers and part of a
    body) and then nothing, hold them ``hold_s``; ``probe()`` runs meanwhile and must succeed."""
    held: list[socket.socket] = []
    refused = 0
    for k in range(n):
        c = socket.socket()
        c.settimeout(1.0)
        try:
            c.connect(("127.0.0.1", port))
            if k % 2:
                c.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            else:
                c.sendall(
                    b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n"
                    b"Authorization: Bearer %s\r\nContent-Type: application/json\r\n"
                    b"Content-Length: 100000\r\n\r\n{" % (port, KEY.encode())
                )
        except OSError:
            c.close()
            refused += 1
            continue
        held.append(c)
    probed = probe()
    halt.wait(hold_s)
    closed_by_pearld = 0
    for c in held:
        with contextlib.suppress(OSError):
            c.setblocking(False)
            try:
                if c.recv(1) == b"":
                    closed_by_pearld += 1
            except BlockingIOError:
                pass
            except OSError:
                closed_by_pearld += 1
        c.close()
    return {
        "opened": len(held),
        "refused": refused,
        "closed_by_pearld": closed_by_pearld,
        "probe_ok": probed,
    }


def abandon(url: str, n: int) -> int:
    """Start ``n`` long non-streamed requests and hang up on each as soon as it is sent."""
    host, port = url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)
    body = json.dumps(
        {"model": MODEL, "messages": [{"role": "user", "content": "long"}], "max_tokens": 512}
    ).encode()
    sent = 0
    for k in range(n):
        with contextlib.suppress(OSError), socket.create_connection((host, int(port)), 2.0) as c:
            c.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: %s:%s\r\n"
                b"Authorization: Bearer %s\r\nContent-Type: application/json\r\n"
                b"X-Session-ID: abandoned-%d\r\nContent-Length: %d\r\n\r\n%s"
                % (host.encode(), port.encode(), KEY.encode(), k, len(body), body)
            )
            sent += 1
    return sent


__all__ = ["KEY", "MODEL", "Agents", "Call", "abandon", "excused", "poison", "slow_clients"]
