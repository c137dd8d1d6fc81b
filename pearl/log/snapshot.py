"""Snapshots: a :class:`ClusterState` as one msgpack mapping, in a checksummed, atomic file.

File layout: ``b"PSNP" | u32 CRC32C(body) | u32 len(body)`` + msgpack body
``{"format": 1, "seq": N, "state": {...}, "extra": {...} | None}``, where ``state`` is the table's
:class:`~pearl.core.state.TableSnapshot` as msgspec encodes it (a mapping of its fields). A field
the file lacks takes the struct's default, so snapshots written before a field existed still
load; an unknown field or a value of the wrong type is refused. Files are named
``snapshot-<seq:016d>.snap`` and written temp file -> fsync -> rename -> fsync directory, so a
crash leaves either the old set of snapshots or the new one, plus at most a stray temp file.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Any

import msgspec
from crc32c import crc32c

from pearl.core.errors import LogCorrupted, PearlError, SchemaError
from pearl.core.schema import from_plain, to_plain
from pearl.core.state import ClusterState, TableSnapshot, validate
from pearl.log import failpoints

FORMAT = 1
MAGIC = b"PSNP"
_HEAD = struct.Struct("<4sII")
PREFIX, SUFFIX, TMP = "snapshot-", ".snap", ".tmp"


class _Body(msgspec.Struct, frozen=True):
    """A snapshot body; ``state`` stays undecoded until ``format`` says how to read it."""

    format: object = None
    seq: object = None
    state: msgspec.Raw = msgspec.Raw()
    extra: object = None


_ENCODER = msgspec.msgpack.Encoder()
_BODY = msgspec.msgpack.Decoder(_Body)
_TABLE = msgspec.msgpack.Decoder(TableSnapshot)

# -- ClusterState <-> plain mapping -------------------------------------------------------------


def state_to_snapshot(state: ClusterState) -> dict[str, Any]:
    """The plain (msgpack- and JSON-ready) mapping of a whole table, as a snapshot holds it."""
    return to_plain(TableSnapshot.of(state))


def state_from_snapshot(m: object) -> ClusterState:
    """Rebuild and validate a table from :func:`state_to_snapshot`'s mapping."""
    state = from_plain(TableSnapshot, m).state()
    validate(state)
    return state


# -- files ---------------------------------------------------------------------------------------


def file_name(seq: int) -> str:
    return f"{PREFIX}{seq:016d}{SUFFIX}"


def parse_name(name: str) -> int | None:
    """The seq a snapshot file name carries, or None for any other name."""
    if name.startswith(PREFIX) and name.endswith(SUFFIX):
        digits = name[len(PREFIX) : -len(SUFFIX)]
        if len(digits) == 16 and digits.isdigit():
            return int(digits)
    return None


def encode(state: ClusterState, extra: dict[str, Any] | None) -> bytes:
    """Snapshot file bytes."""
    body = {"format": FORMAT, "seq": state.seq, "state": TableSnapshot.of(state), "extra": extra}
    try:
        data = _ENCODER.encode(body)
    except (TypeError, ValueError, OverflowError) as e:
        raise SchemaError(f"snapshot extra data is not msgpack-serialisable: {e}") from None
    return _HEAD.pack(MAGIC, crc32c(data), len(data)) + data


def decode(data: bytes, where: str) -> tuple[ClusterState, dict[str, Any] | None]:
    """(state, extra) from snapshot file bytes; LogCorrupted naming ``where`` if damaged."""
    if len(data) < _HEAD.size:
        raise LogCorrupted(f"{where}: snapshot is {len(data)} bytes, shorter than its header")
    magic, crc, length = _HEAD.unpack_from(data)
    body = memoryview(data)[_HEAD.size :]
    if magic != MAGIC or length != len(body) or crc32c(body) != crc:
        raise LogCorrupted(f"{where}: snapshot damaged (bad magic, length or CRC at offset 0)")
    try:
        m = _BODY.decode(body)
        if m.format != FORMAT:
            raise SchemaError(f"snapshot format {m.format!r}, this PEARL reads format {FORMAT}")
        state = _TABLE.decode(m.state).state()
        validate(state)
        if state.seq != m.seq or type(m.seq) is not int:
            raise SchemaError(f"state seq {state.seq} differs from snapshot seq {m.seq!r}")
        if m.extra is not None and not isinstance(m.extra, dict):
            raise SchemaError("snapshot extra data must be a mapping")
    except (PearlError, msgspec.MsgspecError) as e:
        # SchemaError, InvariantViolation from validate(), msgspec's decoding errors
        raise LogCorrupted(f"{where}: unreadable snapshot: {e}") from None
    return state, m.extra


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file(directory: Path, seq: int, data: bytes) -> Path:
    """Atomically create ``directory/snapshot-<seq>.snap`` holding ``data``."""
    final = directory / file_name(seq)
    tmp = directory / (file_name(seq) + TMP)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    write = failpoints.write if failpoints.DISK else os.write
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[write(fd, view) :]
            if failpoints.DISK:
                failpoints.sync(fd, os.fsync)
            else:
                os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full disk must not keep a dead half-snapshot
        raise
    if failpoints.ACTIVE:
        failpoints.hit("snapshot-rename")
    os.replace(tmp, final)
    fsync_dir(directory)
    return final


__all__ = [
    "FORMAT",
    "decode",
    "encode",
    "file_name",
    "fsync_dir",
    "parse_name",
    "state_from_snapshot",
    "state_to_snapshot",
    "write_file",
]
