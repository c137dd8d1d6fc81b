"""What every route serves from: the backend, its tokenizer, and when the gateway started.

The routes of each API (:mod:`pearl.gateway.routes`) take one :class:`Context`, as vLLM's
``OpenAIServingChat`` and ``OpenAIServingCompletion`` take the engine and its tokenizer. The
limits a request is checked against (the model's name, its context, its vocabulary) are read
from the backend when the request comes, not copied here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from pearl.gateway.backend import GatewayBackend
from pearl.tokenizer import Tokenizer


@dataclass(frozen=True)
class Context:
    backend: GatewayBackend
    tok: Tokenizer  # the backend's tokenizer, as the gateway was built
    created: int = field(default_factory=lambda: int(time.time()))  # /v1/models' "created"

    @classmethod
    def of(cls, backend: GatewayBackend) -> Context:
        return cls(backend=backend, tok=backend.tokenizer)

    def token_text(self, i: int) -> str:
        """The text of token ``i`` alone (as logprobs name a token)."""
        return str(self.tok.decode([i]))


__all__ = ["Context"]
