"""The gateway's routes, one module per API, each a ``router(ctx)`` over one
:class:`~pearl.gateway.context.Context`:

- :mod:`~pearl.gateway.routes.chat`: OpenAI's ``/v1/chat/completions``, tools included;
- :mod:`~pearl.gateway.routes.completions`: OpenAI's ``/v1/completions``;
- :mod:`~pearl.gateway.routes.generate`: SGLang's ``/generate``;
- :mod:`~pearl.gateway.routes.models`: ``/v1/models``;
- :mod:`~pearl.gateway.routes.tokens`: vLLM's ``/tokenize`` and ``/detokenize``;
- :mod:`~pearl.gateway.routes.health`: vLLM's ``/health``, ``/ping`` and ``/version``;
- :mod:`~pearl.gateway.routes.control`: PEARL's ``/pearl/v1/status`` and elastic events.

What they share lives beside them: :mod:`~pearl.gateway.jobs` checks a request,
:mod:`~pearl.gateway.output` turns the backend's deltas into tokens and text,
:mod:`~pearl.gateway.sse` streams, :mod:`~pearl.gateway.errors` answers errors.
"""

from __future__ import annotations

from pearl.gateway.routes import chat, completions, control, generate, health, models, tokens

# in the order the app includes them
MODULES = (models, chat, completions, generate, tokens, health, control)

__all__ = [
    "MODULES",
    "chat",
    "completions",
    "control",
    "generate",
    "health",
    "models",
    "tokens",
]
