"""Wire-protocol constants and the transport-level message kinds, in one module.

Every message on a PEARL socket is a frozen, typed record registered under a kind: the kinds
below are msgspec Structs (:class:`pearl.core.schema.WireStruct`), decoded and checked by msgspec.
Log records (:data:`pearl.core.events.RECORDS`) and controller commands
(:data:`pearl.core.commands.COMMANDS`) travel as they are; :data:`MESSAGES` below adds what only
the wire needs: liveness, request and reply kinds of the API, pub/sub of state changes, worker
registration and actor calls.
Other modules add kinds by registering more classes in :data:`MESSAGES`.

Kinds must be unique across the three registries (the envelope names only the kind);
:func:`transports.codec.registries_overlap` checks that.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pearl.core.bounds import check_event
from pearl.core.errors import SchemaError
from pearl.core.events import ELASTIC_EVENTS as _ELASTIC
from pearl.core.events import Elastic, ElasticEvent
from pearl.core.schema import Registry, WireStruct
from pearl.core.status import ClusterStatus

# -- constants ------------------------------------------------------------------------------

PROTOCOL_VERSION = 1
"""Envelope version; a peer speaking another version gets an ``error`` reply (code ``version``)."""

MAX_ENVELOPE_BYTES = 1 << 20
"""Largest first frame (the msgpack envelope). Requests and replies are small; bulk goes after."""

MAX_FRAME_BYTES = 64 << 20
"""Largest bulk frame after the envelope."""

MAX_MESSAGE_BYTES = 256 << 20
"""Largest multipart message, all frames together. Also the socket's ZMQ_MAXMSGSIZE hard cap."""

MAX_FRAMES = 65
"""Most frames in one message: the envelope plus up to 64 bulk buffers."""

HEARTBEAT_INTERVAL_S = 1.0
"""Default heartbeat interval."""

LIVENESS = 3
"""A peer is dead after this many missed heartbeat intervals (ZeroMQ guide, Paranoid Pirate)."""

REQUEST_TIMEOUT_S = 2.5
"""Default time a client waits for one reply before it reconnects and retries (Lazy Pirate)."""

REQUEST_RETRIES = 3
"""Default number of re-sends after the first attempt before a request fails."""

POLL_MS = 100
"""Longest single poll of any loop: no poll waits forever, so close() is always prompt."""


@dataclass(frozen=True, slots=True)
class Limits:
    """Size limits a codec enforces before it decodes anything."""

    max_envelope: int = MAX_ENVELOPE_BYTES
    max_frame: int = MAX_FRAME_BYTES
    max_message: int = MAX_MESSAGE_BYTES
    max_frames: int = MAX_FRAMES


class ErrorCode:
    """Codes of ``error`` replies; a client can branch on them."""

    MALFORMED = "malformed"  # not msgpack, or not an envelope
    VERSION = "version"  # another PROTOCOL_VERSION
    TOO_LARGE = "too-large"  # a frame, the envelope or the message is over its limit
    UNKNOWN_KIND = "unknown-kind"  # no registry knows the kind
    SCHEMA = "schema"  # known kind, wrong fields or types (or another schema version)
    UNEXPECTED = "unexpected"  # valid message this endpoint does not serve
    REJECTED = "rejected"  # the handler refused it (a PearlError)
    INTERNAL = "internal"  # the handler failed; the server logged the traceback


# -- message kinds ----------------------------------------------------------------------------

MESSAGES = Registry("message")

ELASTIC_EVENTS: dict[str, type[ElasticEvent]] = {cls.KIND: cls for cls in _ELASTIC}
"""Record kinds an ``event`` message may carry."""


@MESSAGES.add
class Ping(WireStruct, tag="ping", frozen=True, kw_only=True):
    nonce: int = 0


@MESSAGES.add
class Pong(WireStruct, tag="pong", frozen=True, kw_only=True):
    nonce: int = 0


@MESSAGES.add
class Event(WireStruct, tag="event", frozen=True, kw_only=True):
    """An elastic event for the ElasticScheduler: one of :data:`ELASTIC_EVENTS`, typed.

    On the wire ``record`` is the record's own mapping (kind, version, fields); msgspec decodes it
    through the tagged union of the elastic kinds, so any other kind, a bad field or a number out
    of bounds (:func:`pearl.core.bounds.check_event`) is a schema error before the scheduler sees
    it. Build it with :meth:`of`; :attr:`decoded` is the record.
    """

    record: Elastic

    def __post_init__(self) -> None:
        if not isinstance(self.record, ElasticEvent):  # built by hand from another record
            raise SchemaError(
                f"Event.record: expected one of {sorted(ELASTIC_EVENTS)}, "
                f"got {type(self.record).__name__}"
            )
        # The edge: a step, version, GPU id or deadline out of bounds is refused here, when the
        # message is decoded (and when a client builds it), never logged (pearl.core.bounds).
        check_event(self.record)

    @classmethod
    def of(cls, record: Elastic) -> Event:
        return cls(record=record)

    @property
    def decoded(self) -> Elastic:
        return self.record


@MESSAGES.add
class Ack(WireStruct, tag="ack", frozen=True, kw_only=True):
    """The request is durable: its record has log sequence number ``seq``."""

    seq: int


@MESSAGES.add
class Error(WireStruct, tag="error", frozen=True, kw_only=True):
    """The request failed; ``code`` is one of :class:`ErrorCode`."""

    code: str
    message: str


@MESSAGES.add
class StatusRequest(WireStruct, tag="status-request", frozen=True, kw_only=True):
    pass


@MESSAGES.add
class Status(WireStruct, tag="status", frozen=True, kw_only=True):
    """The cluster status (None until pearld has published its first state)."""

    payload: ClusterStatus | None = None


@MESSAGES.add
class Subscribe(WireStruct, tag="subscribe", frozen=True, kw_only=True):
    """Ask for a snapshot of ``topic``; later changes come over PUB/SUB."""

    topic: str = "state"


@MESSAGES.add
class Snapshot(WireStruct, tag="snapshot", frozen=True, kw_only=True):
    """The whole state of a topic as of change number ``seq`` of publisher ``incarnation``."""

    seq: int
    payload: dict[str, Any]
    topic: str = "state"
    incarnation: int = 0


@MESSAGES.add
class Change(WireStruct, tag="change", frozen=True, kw_only=True):
    """Change number ``seq`` of a topic (consecutive within one publisher ``incarnation``)."""

    seq: int
    payload: dict[str, Any]
    incarnation: int = 0


@MESSAGES.add
class Register(WireStruct, tag="register", frozen=True, kw_only=True):
    """A worker host announces itself (again after a pearld restart: same worker, same address)."""

    worker: int
    incarnation: int
    address: str
    pid: int


@MESSAGES.add
class Heartbeat(WireStruct, tag="heartbeat", frozen=True, kw_only=True):
    """I am alive. From a publisher, ``seq`` is its newest change (subscribers see lost ones)."""

    incarnation: int = 0
    seq: int = 0


@MESSAGES.add
class Call(WireStruct, tag="call", frozen=True, kw_only=True):
    """Actor-to-actor message: run ``method(**args)`` on the actor named ``actor``."""

    actor: str
    method: str
    args: dict[str, Any]


@MESSAGES.add
class Result(WireStruct, tag="result", frozen=True, kw_only=True):
    """Generic reply to a ``call``."""

    value: Any = None


__all__ = [
    "ELASTIC_EVENTS",
    "HEARTBEAT_INTERVAL_S",
    "LIVENESS",
    "MAX_ENVELOPE_BYTES",
    "MAX_FRAMES",
    "MAX_FRAME_BYTES",
    "MAX_MESSAGE_BYTES",
    "MESSAGES",
    "POLL_MS",
    "PROTOCOL_VERSION",
    "REQUEST_RETRIES",
    "REQUEST_TIMEOUT_S",
    "Ack",
    "Call",
    "Change",
    "Error",
    "ErrorCode",
    "Event",
    "Heartbeat",
    "Limits",
    "Ping",
    "Pong",
    "Register",
    "Result",
    "Snapshot",
    "Status",
    "StatusRequest",
    "Subscribe",
]
