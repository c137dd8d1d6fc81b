"""Record framing: ``u32 length | u32 CRC32C | u64 seq`` + msgpack payload, all little-endian.

The CRC32C covers the sequence number and the payload, which sit next to each other, so one
checksum call verifies both. The payload is the record's single mapping
(:func:`pearl.core.events.encode`: ``{"kind", fields..., "v"}``), which msgspec encodes straight
from the record; any writer of the same mapping (key order aside) makes a log that decodes
alike.

:func:`scan` walks a buffer of frames and says where the valid frames end and why;
:func:`find_frame` looks for any frame whose checksum verifies after a damaged one, which is what
tells a torn tail (nothing valid after it) from corruption in the middle (valid data after it).
"""

from __future__ import annotations

import struct
import threading
from dataclasses import dataclass

import msgspec
from crc32c import crc32c

from pearl.core import events
from pearl.core.errors import LogError, SchemaError

HEADER = struct.Struct("<IIQ")
HEADER_SIZE = HEADER.size  # 16
MAX_RECORD = 1 << 20  # default payload limit in bytes
_SEQ = struct.Struct("<Q")


_local = threading.local()


_RECORD_TYPES = frozenset(events.RECORDS.kinds.values())


def _encoder() -> msgspec.msgpack.Encoder:
    """This thread's msgspec Encoder (reused: no per-call set-up)."""
    e = getattr(_local, "encoder", None)
    if e is None:
        e = _local.encoder = msgspec.msgpack.Encoder()
    return e


def pack(record: object, max_record: int = MAX_RECORD) -> bytes:
    """A record's msgpack payload; refuses records that break the codec or the size limit."""
    if type(record) not in _RECORD_TYPES:
        raise SchemaError(f"cannot encode {type(record).__name__} as a log record: not a record")
    try:
        payload: bytes = _encoder().encode(record)
    except (TypeError, ValueError, OverflowError) as e:
        raise SchemaError(f"cannot encode {type(record).__name__} as a log record: {e}") from None
    if len(payload) > max_record:
        raise LogError(
            f"{type(record).__name__} record is {len(payload)} bytes, over the {max_record}-byte "
            "limit; log a reference to bulk data instead of the data"
        )
    return payload


def frame(seq: int, payload: bytes) -> bytes:
    """Header + payload for one record at ``seq``."""
    body = _SEQ.pack(seq) + payload
    return HEADER.pack(len(payload), crc32c(body), seq) + payload


def unpack(payload: bytes | memoryview) -> events.Record:
    """Decode one payload into its record; SchemaError when malformed."""
    try:
        return events.decode_bytes(payload)
    except msgspec.MsgspecError as e:
        raise SchemaError(f"log record does not decode: {e}") from None


@dataclass(frozen=True, slots=True)
class Scan:
    """How far a buffer holds valid frames, and what stopped the walk there (if anything)."""

    end: int  # offset just past the last valid frame
    first_seq: int
    last_seq: int  # first_seq - 1 when there is no valid frame
    count: int
    problem: str | None = None  # why the frame at ``end`` is not valid; None: clean to the end


def check(buf: bytes | memoryview, off: int, n: int, max_record: int = MAX_RECORD) -> str | None:
    """What is wrong with the frame at ``off`` in ``buf[:n]``; None when it verifies."""
    if n - off < HEADER_SIZE:
        return f"short header ({n - off} of {HEADER_SIZE} bytes)"
    length, crc, _ = HEADER.unpack_from(buf, off)
    if length == 0 or length > max_record:
        return f"bad record length {length}"
    end = off + HEADER_SIZE + length
    if end > n:
        return f"short record ({n - off - HEADER_SIZE} of {length} payload bytes)"
    if crc32c(buf[off + 8 : end]) != crc:
        return "CRC mismatch"
    return None


def scan(buf: bytes, first_seq: int, max_record: int = MAX_RECORD) -> Scan:
    """Walk frames from offset 0, expecting sequence numbers ``first_seq, first_seq + 1, ...``."""
    n = len(buf)
    off, expected = 0, first_seq
    unpack_from = HEADER.unpack_from
    while off < n:  # bytes slices, not memoryview ones: a small copy is cheaper than a view
        if n - off >= HEADER_SIZE:
            length, crc, seq = unpack_from(buf, off)
            end = off + HEADER_SIZE + length
            if 0 < length <= max_record and end <= n and crc32c(buf[off + 8 : end]) == crc:
                if seq != expected:
                    problem = f"sequence {seq} where {expected} was expected"
                    return Scan(
                        end=off,
                        first_seq=first_seq,
                        last_seq=expected - 1,
                        count=expected - first_seq,
                        problem=problem,
                    )
                off, expected = end, expected + 1
                continue
        why = check(buf=buf, off=off, n=n, max_record=max_record)
        return Scan(
            end=off,
            first_seq=first_seq,
            last_seq=expected - 1,
            count=expected - first_seq,
            problem=why,
        )
    return Scan(end=off, first_seq=first_seq, last_seq=expected - 1, count=expected - first_seq)


def find_frame(buf: bytes, start: int, max_record: int = MAX_RECORD) -> int | None:
    """Offset of the first frame at or after ``start`` whose length and CRC verify, or None."""
    mv = memoryview(buf)
    n = len(buf)
    unpack_from = HEADER.unpack_from
    for off in range(start, n - HEADER_SIZE):
        length, crc, _ = unpack_from(mv, off)
        end = off + HEADER_SIZE + length
        if 0 < length <= max_record and end <= n and crc32c(mv[off + 8 : end]) == crc:
            return off
    return None


__all__ = [
    "HEADER",
    "HEADER_SIZE",
    "MAX_RECORD",
    "Scan",
    "find_frame",
    "frame",
    "check",
    "pack",
    "scan",
    "unpack",
]
