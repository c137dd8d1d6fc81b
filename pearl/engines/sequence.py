"""One request's life inside an engine, and the per-iteration plan the scheduler hands a backend."""

from __future__ import annotations

import enum
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from pearl.engines.base import FinishReason, GenerateRequest, GenerateResult


class Phase(enum.Enum):
    WAIT_KV = "wait-kv"  # decode role: the prefill worker's KV has not arrived yet
    QUEUED = "queued"  # waiting for KV pages (or KV arrived and waits to be imported)
    PREFILL = "prefill"  # prompt tokens still to compute, in chunks
    DECODE = "decode"  # one token per iteration


Top = tuple[tuple[int, float], ...]  # (token id, logprob) pairs, most likely first


class Sample(NamedTuple):
    """What a backend drew for one sequence: the token, its logprob, the top alternatives."""

    token: int
    logprob: float
    top: Top = ()


@dataclass(eq=False)
class Seq:
    """A request in flight: ``tokens`` = prompt + output, K/V exists for ``tokens[:computed]``."""

    req: GenerateRequest
    future: Future[GenerateResult]
    tokens: list[int]
    phase: Phase = Phase.QUEUED
    computed: int = 0
    pages: list[int] = field(default_factory=list)
    output: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    cached_tokens: int = -1  # set at first admission
    deadline: float = 0.0  # WAIT_KV: monotonic time after which the KV is given up
    kv: tuple[dict[str, Any], list[Any]] | None = None  # arrived KV waiting for pages
    state: Any = None  # the backend's per-sequence state (a sampling generator, a digest, ...)
    decode_steps: int = 0  # decode iterations it was in
    decode_batch_sum: int = 0  # their batch sizes, summed
    top: list[Top] = field(default_factory=list)  # per output token, when the request asks
    # A sample of a group (n > 1) waiting for its leader's prefill: it copies the leader's K/V
    # of its first ``share`` tokens instead of computing them.
    leader: Seq | None = None
    share: int = 0
    grammar: Any = None  # its structured-output matcher (pearl.engines.grammar.Constrained)

    @property
    def rid(self) -> str:
        return self.req.rid

    @property
    def pending(self) -> int:
        """Tokens whose K/V is still to be computed before the next sample."""
        return len(self.tokens) - self.computed

    def push(self, token: int, logprob: float, top: Top = ()) -> None:
        self.tokens.append(token)
        self.output.append(token)
        self.logprobs.append(logprob)
        if self.req.top_logprobs:
            self.top.append(top)

    @property
    def generated(self) -> int:
        """Output tokens so far, an earlier attempt's included (penalties and min_tokens)."""
        return self.req.generated + len(self.output)

    def history(self) -> tuple[list[int], list[int]]:
        """(prompt ids, output ids) as the penalties see them: output includes what earlier
        attempts generated."""
        cut = len(self.req.input_ids) - self.req.generated
        return self.tokens[:cut], self.tokens[cut:]

    def stop_reason(self, max_seq_len: int) -> FinishReason | None:
        """Why generation ends after the last sampled token, or None to go on."""
        sp = self.req.sampling
        if self.output and self.output[-1] in sp.stop_ids:
            return FinishReason.STOP
        if self.grammar is not None and self.grammar.stopped(self.output):
            return FinishReason.STOP  # the grammar is complete: nothing more may follow
        if len(self.output) >= sp.max_new_tokens or len(self.tokens) >= max_seq_len:
            return FinishReason.LENGTH
        return None

    def result(self, reason: FinishReason, version: int) -> GenerateResult:
        return GenerateResult(
            rid=self.rid,
            output_ids=tuple(self.output),
            logprobs=tuple(self.logprobs) if self.req.return_logprobs else (),
            finish_reason=reason,
            weights_version=version,
            prompt_tokens=len(self.req.input_ids),
            cached_tokens=max(self.cached_tokens, 0),
            decode_steps=self.decode_steps,
            decode_batch_sum=self.decode_batch_sum,
            top_logprobs=tuple(self.top),
        )


@dataclass(frozen=True, slots=True)
class Segment:
    """Compute K/V for ``seq.tokens[start:end]``; sample a token when ``end`` reaches the end."""

    seq: Seq
    start: int
    end: int

    @property
    def samples(self) -> bool:
        return self.end == len(self.seq.tokens)


__all__ = ["Phase", "Sample", "Segment", "Seq", "Top"]
