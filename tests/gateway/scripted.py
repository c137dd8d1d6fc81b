"""A scripted GatewayBackend for the gateway's tests: a TEST DOUBLE, not an engine.

It answers every request with the next scripted reply (text, or token ids) or, when ``reply_to``
is set, with what that function makes of the prompt's text (a scripted policy, for multi-turn
agents whose next turn depends on what came back), cut into deltas of
``chunk`` tokens, with the weights version changing from ``versions[0]`` to ``versions[1]`` at
token ``switch_at`` (as a weights update mid-response would). It stops with the tokenizer's EOS
when the reply ends within ``max_new_tokens`` (``stop``), else at the limit (``length``). It
records what it was asked, and can be told to wait on a gate, or to fail, mid-response.

Its tokenizer is byte-level: ids 0-255 are UTF-8 bytes, 256 is EOS (decoded as ""), so a
multi-byte character can be split across deltas.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pearl.gateway.backend import Delta, GatewayError, Sampling

EOS = 256


class ScriptedTokenizer:
    """Byte-level, with EOS at 256 (bos and pad too: the scripted replies need none)."""

    bos_id = eos_id = pad_id = EOS
    vocab_size = 512

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        return [EOS] * add_bos + list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int], skip_special: bool = True) -> str:
        if skip_special:
            return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")
        return "".join(chr(i) if i < 128 else "<|eos|>" if i == EOS else "?" for i in ids)


def logprob_of(index: int) -> float:
    """The scripted logprob of the reply's ``index``-th token."""
    return -0.01 - 0.1 * (index % 7)


def top_of(token: int, index: int, k: int) -> tuple[tuple[int, float], ...]:
    """The scripted top ``k`` of the reply's ``index``-th token: ids 65, 66, ... ("A", "B", ...),
    each a nat less likely than the one before; the sampled token is not among them."""
    return tuple((65 + j, logprob_of(index) - 0.5 - j) for j in range(k))


@dataclass
class Call:
    rid: str
    prompt_ids: list[int]
    sampling: Sampling
    session: str


@dataclass
class ScriptedBackend:
    replies: list[str | list[int]] = field(default_factory=lambda: ["Hello, world!"])
    reply_to: Callable[[str], str] | None = None  # the prompt's text -> the reply, when set
    model: str = "scripted-model"
    max_context: int = 4096
    vocab_size: int = 512  # bytes, EOS, and spare ids (a stop id of 300 is in)
    chat_template: str | None = None
    chunk: int = 4
    versions: tuple[int, int] = (7, 8)
    switch_at: int = 5
    gate: threading.Event | None = None  # waited on after the first delta, when set
    fail_after: int | None = None  # raise `failure` after this many deltas
    failure: Exception = field(default_factory=lambda: GatewayError("pool gave up", 503))
    moves_per_delta: int = 0  # each delta says the request moved this often (re-prefilled)
    not_serving: str | None = None  # /health's answer: None (a worker serves), else why not
    calls: list[Call] = field(default_factory=list)
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    waits: list[bool] = field(default_factory=list)  # each event's wait
    closed: list[str] = field(default_factory=list)  # rids whose generator was closed early
    tokenizer: ScriptedTokenizer = field(default_factory=ScriptedTokenizer)

    def reply_ids(self, n: int) -> list[int]:
        reply = self.replies[n % len(self.replies)]
        return self.tokenizer.encode(reply) if isinstance(reply, str) else list(reply)

    async def generate(
        self, rid: str, prompt_ids: Sequence[int], sampling: Sampling, session: str
    ) -> AsyncIterator[Delta]:
        self.calls.append(
            Call(rid=rid, prompt_ids=list(prompt_ids), sampling=sampling, session=session)
        )
        if self.reply_to is not None:
            ids = self.tokenizer.encode(self.reply_to(self.tokenizer.decode(prompt_ids)))
        else:
            ids = self.reply_ids(len(self.calls) - 1)
        finish = "length"
        if len(ids) < sampling.max_new_tokens:
            ids, finish = [*ids, EOS] if EOS in sampling.stop_ids else ids, "stop"
        ids = ids[: sampling.max_new_tokens]
        done = False
        try:
            for k, start in enumerate(range(0, max(len(ids), 1), self.chunk)):
                if self.fail_after is not None and k >= self.fail_after:
                    raise self.failure
                part = ids[start : start + self.chunk]
                last = start + self.chunk >= len(ids)
                version = self.versions[0] if start < self.switch_at else self.versions[1]
                # A delta never spans a version change: split it where the version changes.
                if start < self.switch_at < start + len(part):
                    cut = self.switch_at - start
                    yield Delta(
                        tuple(part[:cut]),
                        tuple(logprob_of(start + i) for i in range(cut)),
                        self.versions[0],
                        recomputed_tokens=self.moves_per_delta * len(prompt_ids),
                        migrations=self.moves_per_delta,
                        top_logprobs=self._tops(part[:cut], start, sampling.top_logprobs),
                    )
                    part, start, version = part[cut:], self.switch_at, self.versions[1]
                yield Delta(
                    token_ids=tuple(part),
                    logprobs=tuple(logprob_of(start + i) for i in range(len(part))),
                    weight_version=version,
                    finish_reason=finish if last else None,
                    recomputed_tokens=self.moves_per_delta * len(prompt_ids),
                    migrations=self.moves_per_delta,
                    top_logprobs=self._tops(part, start, sampling.top_logprobs),
                )
                if k == 0 and self.gate is not None:
                    await asyncio.to_thread(self.gate.wait, 30)
            done = True
        finally:
            if not done:
                self.closed.append(rid)

    @staticmethod
    def _tops(part: Sequence[int], start: int, k: int) -> tuple[tuple[tuple[int, float], ...], ...]:
        return tuple(top_of(t, start + i, k) for i, t in enumerate(part)) if k else ()

    async def serving(self) -> str | None:
        return self.not_serving

    async def status(self) -> dict[str, Any]:
        return {"status": "replay", "workers": 2, "events": len(self.events)}

    async def event(self, kind: str, body: dict[str, Any], wait: bool = True) -> dict[str, Any]:
        if body.get("refuse"):
            raise GatewayError(f"{kind} refused: {body['refuse']}", 409, "invalid_request_error")
        self.events.append((kind, body))
        self.waits.append(wait)
        return {"ok": True, "kind": kind, "seq": len(self.events)}
