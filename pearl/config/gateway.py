"""``[gateway]``: the OpenAI-compatible HTTP gateway in front of the elastic pool."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GatewayConfig:
    """``[gateway]``: the OpenAI-compatible HTTP gateway in front of the elastic pool."""

    listen: str = ""
    """Where the gateway listens, HOST:PORT (port 0: any free port); "": off."""
    api_key_file: str = ""
    """A file holding the API key clients send as a bearer token; "": none (loopback only)."""
    model: str = ""
    """The model id the gateway serves and requests must name; "": the engine preset's name."""
    max_body_bytes: int = 1 << 20
    """Largest request body accepted, in bytes."""
    max_streams: int = 256
    """Generation requests (chat, completions, ``/generate``), streamed or not, served at once;
    more are refused with 429 and ``Retry-After``."""
    request_timeout_s: float = 120.0
    """How long a request waits for a worker able to serve it (its worker died, none can start,
    the pool is empty) before it fails with 503 and ``Retry-After``."""
    max_connections: int = 1024
    """Open HTTP connections at once, never more than a quarter of the open-file limit (pearld
    raises its soft limit to the hard one at start); one more is answered 429 and closed."""
    header_timeout_s: float = 10.0
    """A request's head (request line and headers) must arrive within this, counted from the
    connection's open or the previous response's end; else 408 and the connection closes."""
    body_timeout_s: float = 30.0
    """A request's body must arrive within this once its head did; else 408 and the connection
    closes."""
    allowed_origins: tuple[str, ...] = ()
    """Browser origins (``scheme://host[:port]``) allowed to call the gateway, with CORS answers;
    a request with any other ``Origin`` header is refused with 403. A TOML list, or a
    comma-separated string on the command line."""
    processes: int = 0
    """Gateway processes serving ``listen`` together (``SO_REUSEPORT``), each with a Router of
    its own fed by pearld's routes feed and sending requests straight to the worker hosts, so
    the data path leaves pearld's interpreter; pearld starts them again when they exit. 0: the
    gateway runs inside pearld (and in an embedded Runtime). At most 64. ``max_connections``
    and ``max_streams`` bound each process."""


__all__ = ["GatewayConfig"]
