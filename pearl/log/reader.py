"""Replay's hot loop: the frames of one segment, verified when the log was opened, decoded."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import msgspec

from pearl.core import events
from pearl.core.errors import LogCorrupted
from pearl.core.events import Record
from pearl.log import framing
from pearl.log.framing import HEADER_SIZE

CACHE_PAYLOAD = 64  # small payloads repeat (activity changes, plan steps): decode each once
CACHE_ENTRIES = 4096


def records(
    buf: bytes,
    path: Path,
    first: int,
    start: int,
    until: int,
    size: int,
    max_record: int,
    cache: dict[bytes, Record],
) -> Iterator[tuple[int, Record]]:
    """(seq, record) of the frames of one segment with ``start <= seq <= until``, kept flat.

    Every byte up to ``size`` had its CRC checked when the log was opened, or was written by this
    process, so only the framing is re-checked here. msgspec decodes each payload straight into
    its record (one tagged union over every kind). Records are immutable and decoding is
    deterministic, so equal small payloads share one decoded record through ``cache``.
    """
    mv = memoryview(buf)
    unpack_from = framing.HEADER.unpack_from
    decode = events.RECORDS.msgpack_decoder().decode
    get = cache.get
    off, expected = 0, first
    while off < size:
        if size - off < HEADER_SIZE:
            raise LogCorrupted(f"{path}: short header at byte offset {off}")
        length, _crc, seq = unpack_from(buf, off)
        stop = off + HEADER_SIZE + length
        if seq != expected or not 0 < length <= max_record or stop > size:
            raise _bad(path, mv, off, size, max_record, expected)
        if seq >= start:
            if seq > until:
                return
            payload = buf[off + HEADER_SIZE : stop]
            record = get(payload)
            if record is None:
                try:
                    record = decode(payload)
                except msgspec.MsgspecError as e:
                    raise LogCorrupted(
                        f"{path}: record seq {seq} at byte offset {off} does not decode: {e}"
                    ) from None
                if length <= CACHE_PAYLOAD:
                    if len(cache) >= CACHE_ENTRIES:
                        cache.clear()
                    cache[payload] = record
            yield seq, record
        off, expected = stop, expected + 1


def _bad(
    path: Path, mv: memoryview, off: int, size: int, max_record: int, seq: int
) -> LogCorrupted:
    problem = framing.check(mv, off, size, max_record) or f"sequence break (expected {seq})"
    return LogCorrupted(f"{path}: {problem} at byte offset {off} (record seq {seq})")


__all__ = ["CACHE_ENTRIES", "CACHE_PAYLOAD", "records"]
