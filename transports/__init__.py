"""ZeroMQ + msgpack transports: one codec, request/reply, pub/sub, liveness, CURVE.

- :mod:`transports.protocol`: constants (version, size limits, heartbeat) and message kinds;
- :mod:`transports.codec`: ``Codec.encode(msg, ...) -> frames``, ``.decode(frames) -> Envelope``;
- :mod:`transports.rpc`: ``Server(address, handler)`` (ROUTER, own thread) and ``Client`` (DEALER,
  Lazy Pirate retries); a handler is ``handler(env: Envelope) -> message | Reply | None``;
- :mod:`transports.pubsub`: ``Publisher`` of numbered changes and ``Subscriber`` (snapshot +
  changes, gap detection);
- :mod:`transports.heartbeat`: ``Liveness`` and ``HeartbeatSender`` with an injectable clock;
- :mod:`transports.auth`: loopback-only binds unless CURVE keys are given;
- :mod:`transports.diagnose`: why a client hears nothing (authentication failed, unreachable).

Only ``pearl.core`` is imported from the rest of PEARL. (``transports.bulk``, the KV and weight
channel, is separate and not re-exported here.)
"""

from transports.auth import ClientKeys, InsecureBind, ServerKeys
from transports.codec import BadMessage, Codec, Envelope
from transports.heartbeat import HeartbeatSender, Liveness
from transports.protocol import MESSAGES, PROTOCOL_VERSION, ErrorCode, Limits
from transports.pubsub import GapDetected, Publisher, Subscriber
from transports.rpc import Client, RemoteError, Reply, RequestTimeout, Server, dispatch

__all__ = [
    "MESSAGES",
    "PROTOCOL_VERSION",
    "BadMessage",
    "Client",
    "ClientKeys",
    "Codec",
    "Envelope",
    "ErrorCode",
    "GapDetected",
    "HeartbeatSender",
    "InsecureBind",
    "Limits",
    "Liveness",
    "Publisher",
    "RemoteError",
    "Reply",
    "RequestTimeout",
    "Server",
    "ServerKeys",
    "Subscriber",
    "dispatch",
]
