"""The one codec: typed records <-> ZeroMQ frames.

A message is ``[envelope, bulk...]``. The envelope is one msgpack map
``{proto, id, corr, sender, kind, body}``: ``proto`` is :data:`PROTOCOL_VERSION`, ``id`` the
sender's message number, ``corr`` the id of the request this answers (0 for none), ``sender`` a
peer name, ``kind`` the registered kind and ``body`` its :func:`pearl.core.schema.to_wire` mapping.
Optional bulk frames after the envelope are raw binary payloads, handed back zero-copy.

Decoding checks the frame count and every size *before* unpacking, unpacks with msgpack's
``max_*_len`` limits and no extension types, then checks the envelope and the body's schema.
Whatever is wrong raises :class:`BadMessage` (a :class:`ProtocolError`) whose ``code`` is an
:class:`ErrorCode` for the ``error`` reply. Nothing is ever pickled.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn, TypeAlias

import msgpack
import msgspec

from pearl.core.commands import COMMANDS
from pearl.core.errors import ProtocolError
from pearl.core.events import RECORDS
from pearl.core.schema import Registry, WireStruct
from transports.protocol import MESSAGES, PROTOCOL_VERSION, ErrorCode, Limits

if TYPE_CHECKING:
    import zmq

#: one frame of a message: bytes (or a buffer of them), a zero-copy view, or a received zmq.Frame
Frame: TypeAlias = "bytes | bytearray | memoryview | zmq.Frame"

REGISTRIES: tuple[Registry, ...] = (MESSAGES, COMMANDS, RECORDS)
"""Where a kind is looked up, in this order (kinds are unique across them)."""

_ENVELOPE_KEYS = frozenset({"proto", "id", "corr", "sender", "kind", "body"})
_MAP6 = b"\x86"  # msgpack fixmap header for the envelope's six entries
_BODY_KEY = msgpack.packb("body")
_ENCODE = msgspec.msgpack.Encoder().encode


class Unencodable(ProtocolError):
    """A message that cannot be encoded (an int beyond 64 bits, a str that is not UTF-8): the
    message's own fault, never the peer's; nothing was sent."""


class BadMessage(ProtocolError):
    """A message the protocol does not allow; ``code`` names the reason for the error reply."""

    def __init__(self, code: str, message: str, corr: int = 0) -> None:
        super().__init__(message)
        self.code = code
        self.corr = corr  # id of the offending request when it could be read, else 0


@dataclass(frozen=True, slots=True)
class Envelope:
    """A decoded message: the typed record plus its addressing and any bulk frames."""

    msg: Any
    id: int = 0
    corr: int = 0
    sender: str = ""
    frames: tuple[bytes | memoryview, ...] = ()  # zero-copy views of received frames

    @property
    def kind(self) -> str:
        return str(self.msg.KIND)


def lookup(kind: object) -> Registry | None:
    """The registry that knows ``kind``, or None."""
    if type(kind) is not str:
        return None
    for reg in REGISTRIES:
        if kind in reg.kinds:
            return reg
    return None


def registries_overlap() -> set[str]:
    """Kinds registered in more than one registry (must be empty: the envelope names only kind)."""
    seen: set[str] = set()
    dup: set[str] = set()
    for reg in REGISTRIES:
        dup |= seen & reg.kinds.keys()
        seen |= reg.kinds.keys()
    return dup


def _no_ext(code: int, data: bytes) -> NoReturn:
    raise ValueError(f"msgpack extension type {code} is not allowed")


def nbytes(frame: Frame) -> int:
    """Size in bytes of a frame (bytes, memoryview or zmq.Frame)."""
    if isinstance(frame, bytes):
        return len(frame)
    return _view(frame).nbytes


def _view(frame: bytearray | memoryview | zmq.Frame) -> memoryview:
    """A zero-copy view of a frame (a zmq.Frame's is its own buffer)."""
    return memoryview(frame) if isinstance(frame, bytearray | memoryview) else frame.buffer


class Codec:
    """Encode and decode envelopes under one set of :class:`Limits`. Stateless, thread-safe."""

    def __init__(self, limits: Limits | None = None) -> None:
        self.limits = limits or Limits()
        lim = self.limits.max_envelope
        self._unpack_opts: dict[str, Any] = {
            "raw": False,
            "strict_map_key": False,  # int keys (worker ids) are allowed; unhashable keys fail
            "ext_hook": _no_ext,
            "max_str_len": lim,
            "max_bin_len": lim,
            "max_array_len": min(lim, 1 << 17),
            "max_map_len": min(lim // 2, 1 << 16),
            "max_ext_len": 0,
        }

    # -- encode --------------------------------------------------------------------------------

    def encode(
        self,
        msg: WireStruct,
        *,
        id: int = 0,
        corr: int = 0,
        sender: str = "",
        frames: Sequence[Frame] = (),
    ) -> list[Frame]:
        """Frames for ``msg``: the packed envelope, then ``frames`` untouched (zero-copy)."""
        kind = getattr(msg, "KIND", None)
        reg = lookup(kind)
        if reg is None or reg.kinds[str(kind)] is not type(msg):
            raise ProtocolError(f"cannot send {type(msg).__name__}: not a registered kind")
        try:
            body = _ENCODE(msg)  # every kind is a WireStruct: its to_wire mapping, packed
            head = msgpack.packb(
                {"proto": PROTOCOL_VERSION, "id": id, "corr": corr, "sender": sender, "kind": kind},
                use_bin_type=True,
            )
            # The envelope is one map: the five header fields, then "body" packed once above.
            env = _MAP6 + head[1:] + _BODY_KEY + body
        except (TypeError, ValueError, OverflowError) as e:
            raise Unencodable(f"cannot encode {kind!r}: {e}") from None
        out = [env, *frames]
        self._check_sizes(out, outgoing=True)
        return out

    # -- decode --------------------------------------------------------------------------------

    def decode(self, frames: Sequence[Frame]) -> Envelope:
        """Check sizes, unpack and validate; raise :class:`BadMessage` on anything wrong."""
        self._check_sizes(frames, outgoing=False)
        try:
            env = msgpack.unpackb(frames[0], **self._unpack_opts)
        except Exception as e:  # FormatError, ExtraData, StackError, ValueError, UnicodeError...
            raise BadMessage(
                ErrorCode.MALFORMED, f"envelope is not valid msgpack ({type(e).__name__}: {e})"
            ) from None
        if not isinstance(env, dict):
            raise BadMessage(
                ErrorCode.MALFORMED, f"envelope must be a map, got {type(env).__name__}"
            )
        corr: int = env["id"] if type(env.get("id")) is int else 0
        proto = env.get("proto")
        if proto != PROTOCOL_VERSION:
            raise BadMessage(
                ErrorCode.VERSION,
                f"protocol version {proto!r}, this PEARL speaks {PROTOCOL_VERSION}; "
                "run the same PEARL version on both ends",
                corr,
            )
        if env.keys() != _ENVELOPE_KEYS:
            raise BadMessage(
                ErrorCode.MALFORMED,
                f"envelope keys {sorted(map(str, env))}, expected {sorted(_ENVELOPE_KEYS)}",
                corr,
            )
        for key, tp in (("id", int), ("corr", int), ("sender", str), ("kind", str)):
            if type(env[key]) is not tp:
                raise BadMessage(
                    ErrorCode.MALFORMED,
                    f"envelope {key!r} must be {tp.__name__}, got {type(env[key]).__name__}",
                    corr,
                )
        kind, body = env["kind"], env["body"]
        reg = lookup(kind)
        if reg is None:
            raise BadMessage(ErrorCode.UNKNOWN_KIND, f"unknown message kind {kind[:80]!r}", corr)
        if not isinstance(body, dict) or body.get("kind") != kind:
            raise BadMessage(
                ErrorCode.SCHEMA, f"body of {kind!r} must be a map of kind {kind!r}", corr
            )
        try:
            msg = reg.decode(body)
        except Exception as e:  # SchemaError, or a record's own check failing on odd input
            raise BadMessage(ErrorCode.SCHEMA, f"{kind!r}: {e}", corr) from None
        bulk = tuple(f if isinstance(f, bytes) else _view(f) for f in frames[1:])
        return Envelope(msg=msg, id=env["id"], corr=env["corr"], sender=env["sender"], frames=bulk)

    def _check_sizes(self, frames: Sequence[Frame], outgoing: bool) -> None:
        lim = self.limits
        what = "outgoing" if outgoing else "incoming"
        n = len(frames)
        if n == 0:
            raise BadMessage(ErrorCode.MALFORMED, f"{what} message has no frames")
        if n > lim.max_frames:
            raise BadMessage(
                ErrorCode.TOO_LARGE, f"{what} message has {n} frames, at most {lim.max_frames}"
            )
        env = nbytes(frames[0])
        if env > lim.max_envelope:
            raise BadMessage(
                ErrorCode.TOO_LARGE,
                f"{what} envelope is {env} bytes, at most {lim.max_envelope}; "
                "send large payloads as bulk frames",
            )
        total = env
        for i, f in enumerate(frames[1:], 1):
            size = nbytes(f)
            if size > lim.max_frame:
                raise BadMessage(
                    ErrorCode.TOO_LARGE,
                    f"{what} frame {i} is {size} bytes, at most {lim.max_frame}",
                )
            total += size
        if total > lim.max_message:
            raise BadMessage(
                ErrorCode.TOO_LARGE, f"{what} message is {total} bytes, at most {lim.max_message}"
            )


__all__ = [
    "REGISTRIES",
    "BadMessage",
    "Codec",
    "Envelope",
    "Unencodable",
    "lookup",
    "nbytes",
    "registries_overlap",
]
