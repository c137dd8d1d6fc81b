"""A response as the backend's deltas arrive: its tokens (:class:`Acc`) and its text.

:func:`deltas` is the backend's stream for a :class:`~pearl.gateway.jobs.Job`, cut at its first
stop string; :func:`texts` is the one streaming loop chat and completions share: each delta with
the text it adds (detokenized incrementally, a final stop token left out, a stop string held
back until it is settled and then cut). Token-exact: ``Acc.ids`` are every generated id, the
stop token included; weight versions are ``[(first token index, version), ...]``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from pearl.gateway import protocol as p
from pearl.gateway import stops as stops_mod
from pearl.gateway.backend import Delta, GatewayError
from pearl.gateway.context import Context
from pearl.gateway.jobs import Job
from pearl.tokenizer import Tokenizer


@dataclass(frozen=True, kw_only=True)
class Extras:
    """What a response carries beyond its text, as the request asked."""

    token_ids: bool = False  # the prompt's and the response's token ids
    logprobs: bool = False  # the sampled tokens' logprobs
    usage: bool = False  # a stream ends with a usage chunk (stream_options.include_usage)
    as_ids: bool = False  # tokens named token_id:N (vLLM's return_tokens_as_token_ids)


@dataclass
class Acc:
    """A response's tokens as its deltas arrive."""

    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[tuple[tuple[int, float], ...]] = field(default_factory=list)  # per token, if asked
    versions: list[tuple[int, int]] = field(default_factory=list)
    last_version: int = 0
    finish: str | None = None
    recomputed: int = 0
    migrations: int = 0

    def add(self, d: Delta) -> None:
        if len(d.logprobs) != len(d.token_ids):
            raise GatewayError(
                "the backend sent a delta whose logprobs do not match its tokens",
                500,
                "server_error",
            )
        if d.token_ids and (not self.versions or self.versions[-1][1] != d.weight_version):
            self.versions.append((len(self.ids), d.weight_version))
        self.ids.extend(d.token_ids)
        self.logprobs.extend(d.logprobs)
        self.top.extend(d.top_logprobs)
        self.last_version = d.weight_version
        self.finish = d.finish_reason
        self.recomputed += d.recomputed_tokens
        self.migrations += d.migrations

    def usage(self, prompt_tokens: int) -> p.Usage:
        n = len(self.ids)
        return p.Usage(
            prompt_tokens=prompt_tokens,
            completion_tokens=n,
            total_tokens=prompt_tokens + n,
            recomputed_tokens=self.recomputed,
            migrations=self.migrations,
        )

    def versions_out(self) -> list[tuple[int, int]]:
        return self.versions or [(0, self.last_version)]


class Detok:
    """Incremental detokenizer: the text that ids add as they arrive. It decodes a window (the
    ids since the last emission but one) and holds back an incomplete character (a trailing
    U+FFFD) until the next ids complete it, so the cost per delta does not grow with the
    response."""

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = True) -> None:
        self.tok, self.skip = tokenizer, skip_special
        self.ids: list[int] = []
        self.prefix = self.read = 0  # window start; end of the ids already emitted

    def push(self, ids: Sequence[int], final: bool = False) -> str:
        self.ids.extend(ids)
        before = self.tok.decode(self.ids[self.prefix : self.read], self.skip)
        after = self.tok.decode(self.ids[self.prefix :], self.skip)
        if len(after) <= len(before) or (after.endswith("\ufffd") and not final):
            return ""
        self.prefix, self.read = self.read, len(self.ids)
        return str(after[len(before) :])


async def deltas(ctx: Context, j: Job) -> AsyncIterator[Delta]:
    """The backend's deltas up to the one that finishes; the backend's generator is closed
    however this ends (a client that left, an error)."""
    it = ctx.backend.generate(j.rid, j.prompt_ids, j.sampling, j.session)
    seen: list[int] = []
    try:
        async for d in it:
            if j.stop and d.token_ids:
                k = stops_mod.stop_at(tok=ctx.tok, seen=seen, new=d.token_ids, stops=j.stop)
                if k is not None:  # ends here; closing `it` aborts the rest in the pool
                    ids, lps = d.token_ids[:k], d.logprobs[:k]
                    d = replace(
                        d, token_ids=ids, logprobs=lps, finish_reason="stop",
                        top_logprobs=d.top_logprobs[:k],
                    )  # fmt: skip
            seen.extend(d.token_ids)
            yield d
            if d.finish_reason is not None:
                return
    finally:
        aclose = getattr(it, "aclose", None)
        if aclose is not None:
            await aclose()
    raise GatewayError(
        "the backend ended the response without a finish reason", 500, "server_error"
    )


async def collect(ctx: Context, j: Job) -> Acc:
    """The whole response."""
    acc = Acc()
    async for d in deltas(ctx, j):
        acc.add(d)
    return acc


def final_text(ctx: Context, j: Job, acc: Acc) -> str:
    """The whole response's text: without a final stop token, cut at a stop string."""
    text = ctx.tok.decode(j.text_ids(acc.ids, True, acc.finish), not j.specials)
    return stops_mod.cut(text, j.stop, keep=j.keep_stop)


async def texts(ctx: Context, j: Job, acc: Acc) -> AsyncIterator[tuple[Delta, str]]:
    """Each delta (added to ``acc``) with the text it adds to the response: the streaming loop
    of chat and completions, which differ only in the chunks they make of it."""
    detok, stopper = Detok(ctx.tok, not j.specials), stops_mod.StopText(j.stop, j.keep_stop)
    async for d in deltas(ctx, j):
        acc.add(d)
        final = d.finish_reason is not None
        text = detok.push(j.text_ids(d.token_ids, final, d.finish_reason), final)
        yield d, stopper.push(text, final)


T = TypeVar("T")


async def gather(aws: Sequence[Awaitable[T]]) -> list[T]:
    """All of ``aws`` at once (a completions request's prompts); the first error ends the
    others (their requests are aborted in the pool) and is raised."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def merge(its: Sequence[AsyncIterator[T]]) -> AsyncIterator[tuple[int, T]]:
    """The items of ``its`` as each comes, with the index of the iterator it came from; the
    first error ends the others (each is closed) and is raised. One iterator is read as is."""
    if len(its) == 1:
        async for x in its[0]:
            yield 0, x
        return
    queue: asyncio.Queue[tuple[int, Any, BaseException | None]] = asyncio.Queue()
    end = object()

    async def pump(i: int, it: AsyncIterator[T]) -> None:
        try:
            async for x in it:
                queue.put_nowait((i, x, None))
            queue.put_nowait((i, end, None))
        except Exception as e:
            queue.put_nowait((i, None, e))
        finally:
            aclose = getattr(it, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()

    tasks = [asyncio.ensure_future(pump(i, it)) for i, it in enumerate(its)]
    try:
        left = len(tasks)
        while left:
            i, x, error = await queue.get()
            if error is not None:
                raise error
            if x is end:
                left -= 1
                continue
            yield i, x
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


__all__ = [
    "Acc",
    "Detok",
    "Extras",
    "collect",
    "deltas",
    "final_text",
    "gather",
    "merge",
    "texts",
]
