"""What the HTTP gateway needs from whatever serves it: the contract between the two halves.

The gateway (``pearl.gateway.app``) speaks HTTP and the OpenAI / SGLang dialects; a
:class:`GatewayBackend` generates tokens and takes control events. The pool backend
(``pearl.gateway.pool``) routes through PEARL's Router to the elastic pool; tests use a scripted
one. The gateway never sees actors, the event log or engines: only this module's types.

Rules every backend keeps:
- ``generate`` yields :class:`Delta` values in order and ends after the one whose
  ``finish_reason`` is set; the concatenated ``token_ids`` are the completion, whatever
  migrations happened underneath (a turn moved off a leaving worker continues with its prefix).
- A request fails with :class:`GatewayError` only when the pool gave up on it; elasticity alone
  never fails a request.
- Every request it gets passed the gateway's checks: token ids (prompt and stop ids) are in
  [0, ``vocab_size``), the seed is a signed 64-bit integer, text is valid Unicode.
- ``session`` names a conversation (``X-Session-ID``, else the request's ``user``, else ""):
  its turns go to the worker that holds its prefix, and the backend measures them as one
  trajectory (turns, prompt and generated tokens, the gap between a response and the next
  request).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from pearl.engines.grammar import Grammar
from pearl.tokenizer import Tokenizer


class GatewayError(Exception):
    """A request the gateway answers with an error body: ``status`` is its HTTP status,
    ``kind`` OpenAI's error type (``invalid_request_error``, ``authentication_error``, ...),
    ``param`` the request field at fault, if one is, ``code`` OpenAI's error code
    (``model_not_found``). A transient refusal (503, 429) names ``retry_after_s``, sent as the
    ``Retry-After`` header."""

    def __init__(
        self, message: str, status: int = 400, kind: str = "invalid_request_error",
        param: str | None = None, retry_after_s: float | None = None, code: str | None = None,
    ) -> None:  # fmt: skip
        super().__init__(message)
        self.message, self.status, self.kind, self.param = message, status, kind, param
        self.retry_after_s, self.code = retry_after_s, code


@dataclass(frozen=True)
class Sampling:
    max_new_tokens: int
    temperature: float = 1.0  # 0: greedy
    top_p: float = 1.0
    seed: int | None = None
    stop_ids: tuple[int, ...] = ()
    # vLLM's sampling fields, its defaults (pearl.engines.base.SamplingParams says how)
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_tokens: int = 0
    logit_bias: tuple[tuple[int, float], ...] = ()
    top_logprobs: int = 0  # alternatives per generated token (Delta.top_logprobs)
    group: str = ""  # the samples of one request (n > 1): one worker, one prefill
    grammar: Grammar | None = None  # structured outputs (pearl.gateway.structured)


@dataclass(frozen=True)
class Delta:
    """Tokens generated since the previous delta, all by one weights version."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]  # one per token
    weight_version: int
    finish_reason: str | None = None  # "stop" | "length" on the last delta, else None
    # Both count what happened since the previous delta: summed over a request's deltas, they
    # are its totals (Usage).
    recomputed_tokens: int = 0  # prompt tokens re-prefilled because the request moved
    migrations: int = 0  # times the request moved to another worker before this delta
    # per token, the (token id, raw logprob) alternatives asked for, most likely first
    top_logprobs: tuple[tuple[tuple[int, float], ...], ...] = ()


@dataclass
class Usage:
    """What one request cost, over all its attempts."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    recomputed_tokens: int = 0
    migrations: int = 0
    weight_versions: list[tuple[int, int]] = field(default_factory=list)  # (first token, version)


class GatewayBackend(Protocol):
    model: str  # the one model id /v1/models lists and requests must name
    max_context: int  # prompt + completion tokens a request may span
    vocab_size: int  # the served model's vocabulary: every token id is in [0, vocab_size)
    tokenizer: Tokenizer
    chat_template: str | None  # a Jinja chat template (Hugging Face's), or None: ChatML

    def generate(
        self, rid: str, prompt_ids: Sequence[int], sampling: Sampling, session: str
    ) -> AsyncIterator[Delta]:
        """Generate for one request (an async generator; see the module's rules)."""
        ...

    async def status(self) -> dict[str, Any]:
        """``pearl status --json``."""
        ...

    async def serving(self) -> str | None:
        """None once a worker serves requests; else why none does (``/health``'s 503). Cheap:
        load balancers ask every few seconds."""
        ...

    async def event(self, kind: str, body: dict[str, Any], wait: bool = True) -> dict[str, Any]:
        """An elastic event by its kind (``gpus-added``, ``training-begin``, ...) with its
        fields; the same handlers as the ZeroMQ API. Raises GatewayError for a refused one.
        With ``wait``, ``training-begin`` answers once training may proceed (every borrowed GPU
        back), as ``pearl event training-begin`` does."""
        ...


__all__ = ["Delta", "GatewayBackend", "GatewayError", "Sampling", "Usage"]
