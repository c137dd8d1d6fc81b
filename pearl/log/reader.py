"""Replay's hot loop: the frames of one segment, verified when the log was opened, decoded."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

import msgspec

from pearl.core import events
from pearl.core.errors import LogCorrupted
from pearl.core.events import Record
from pearl.log import framing
from pearl.log.framing import HEADER_SIZE

CHUNK = 4096  # frames decoded by one msgspec call
_ARRAY32 = struct.Struct(">BI")  # msgpack array 32 header: 0xdd, count


def records(
    buf: bytes, path: Path, first: int, start: int, until: int, size: int, max_record: int
) -> Iterator[tuple[int, Record]]:
    """(seq, record) of the frames of one segment with ``start <= seq <= until``, kept flat.

    Every byte up to ``size`` had its CRC checked when the log was opened, or was written by this
    process, so only the framing is re-checked here. The payloads of up to :data:`CHUNK` frames
    are joined behind one msgpack array header and decoded by a single msgspec call (one tagged
    union over every kind): the per-record cost left in Python is the header walk and the slice.
    """
    unpack_from = framing.HEADER.unpack_from
    decode = events.RECORDS.msgpack_list_decoder().decode
    off, seq = 0, first
    while off < size and seq < start:  # before the snapshot: framing checked, not decoded
        if size - off < HEADER_SIZE:
            raise LogCorrupted(f"{path}: short header at byte offset {off}")
        length, _crc, frame_seq = unpack_from(buf, off)
        stop = off + HEADER_SIZE + length
        if frame_seq != seq or not 0 < length <= max_record or stop > size:
            raise _bad(path=path, buf=buf, off=off, size=size, max_record=max_record, seq=seq)
        off, seq = stop, seq + 1
    while off < size and seq <= until:
        chunk_off, chunk_seq, last = off, seq, min(until, seq + CHUNK - 1)
        parts = [b""]  # the array header, once the count is known
        take = parts.append
        while off < size and seq <= last:
            if size - off < HEADER_SIZE:
                raise LogCorrupted(f"{path}: short header at byte offset {off}")
            length, _crc, frame_seq = unpack_from(buf, off)
            body = off + HEADER_SIZE
            stop = body + length
            if frame_seq != seq or not 0 < length <= max_record or stop > size:
                raise _bad(path=path, buf=buf, off=off, size=size, max_record=max_record, seq=seq)
            take(buf[body:stop])
            off, seq = stop, seq + 1
        n = seq - chunk_seq
        parts[0] = _ARRAY32.pack(0xDD, n)
        try:
            decoded = decode(b"".join(parts))
        except msgspec.MsgspecError:
            raise _undecodable(
                path=path, buf=buf, off=chunk_off, seq=chunk_seq, payloads=parts[1:]
            ) from None
        yield from zip(range(chunk_seq, seq), decoded, strict=True)


def _undecodable(path: Path, buf: bytes, off: int, seq: int, payloads: list[bytes]) -> LogCorrupted:
    """The first payload of a chunk that does not decode on its own, with its seq and offset."""
    one = events.RECORDS.msgpack_decoder().decode
    for payload in payloads:
        try:
            one(payload)
        except msgspec.MsgspecError as e:
            return LogCorrupted(
                f"{path}: record seq {seq} at byte offset {off} does not decode: {e}"
            )
        off += HEADER_SIZE + len(payload)
        seq += 1
    return LogCorrupted(f"{path}: records from seq {seq - len(payloads)} do not decode together")


def _bad(path: Path, buf: bytes, off: int, size: int, max_record: int, seq: int) -> LogCorrupted:
    problem = (
        framing.check(buf=buf, off=off, n=size, max_record=max_record)
        or f"sequence break (expected {seq})"
    )
    return LogCorrupted(f"{path}: {problem} at byte offset {off} (record seq {seq})")


__all__ = ["CHUNK", "records"]
