"""Snapshots: a :class:`ClusterState` as one msgpack mapping, in a checksummed, atomic file.

File layout: ``b"PSNP" | u32 CRC32C(body) | u32 len(body)`` + msgpack body
``{"format": 1, "seq": N, "state": {...}, "extra": {...} | None}``. Files are named
``snapshot-<seq:016d>.snap`` and written temp file -> fsync -> rename -> fsync directory, so a
crash leaves either the old set of snapshots or the new one, plus at most a stray temp file.

:func:`state_to_snapshot` / :func:`state_from_snapshot` are pure: every field of ClusterState has
a converter below, and a field without one is a loud error rather than a silently lost value.
"""

from __future__ import annotations

import dataclasses
import os
import struct
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import msgpack
from crc32c import crc32c

from pearl.core.errors import LogCorrupted, PearlError, SchemaError
from pearl.core.schema import from_plain, to_plain
from pearl.core.state import ClusterState, PlanProgress, TrainingPhase, Worker, validate
from pearl.log import failpoints

FORMAT = 1
MAGIC = b"PSNP"
_HEAD = struct.Struct("<4sII")
PREFIX, SUFFIX, TMP = "snapshot-", ".snap", ".tmp"

# -- ClusterState <-> plain mapping -------------------------------------------------------------


def _int(v: Any, name: str) -> int:
    if type(v) is not int:
        raise SchemaError(f"snapshot field {name!r}: expected int, got {type(v).__name__}")
    return v


def _gpus(v: Any, name: str) -> frozenset[int]:
    if type(v) is not list:
        raise SchemaError(f"snapshot field {name!r}: expected an array of GPU ids")
    return frozenset(_int(g, name) for g in v)


def _workers(v: Any, name: str) -> Mapping[int, Worker]:
    if type(v) is not list:
        raise SchemaError(f"snapshot field {name!r}: expected an array of workers")
    ws = [from_plain(Worker, m) for m in v]
    return MappingProxyType({w.id: w for w in sorted(ws, key=lambda w: w.id)})


def _phase(v: Any, name: str) -> TrainingPhase:
    try:
        return TrainingPhase(v)
    except ValueError:
        raise SchemaError(f"snapshot field {name!r}: unknown training phase {v!r}") from None


def _plan(v: Any, name: str) -> PlanProgress | None:
    return None if v is None else from_plain(PlanProgress, v)


def _sorted(v: frozenset[int]) -> list[int]:
    return sorted(v)


_Enc = Callable[[Any], Any]
_Dec = Callable[[Any, str], Any]
_GPUS: tuple[_Enc, _Dec] = (_sorted, _gpus)
_INT: tuple[_Enc, _Dec] = (int, _int)
_FIELDS: dict[str, tuple[_Enc, _Dec]] = {
    "seq": _INT,
    "tp": _INT,
    "training_gpus": _GPUS,
    "reserved_gpus": _GPUS,
    "preemptible_gpus": _GPUS,
    "present_gpus": _GPUS,
    "reclaiming_gpus": _GPUS,
    "regranted_gpus": _GPUS,
    "workers": (lambda ws: [to_plain(ws[i]) for i in sorted(ws)], _workers),
    "phase": (lambda p: p.value, _phase),
    "training_step": _INT,
    "weights_version": _INT,
    "plan": (lambda p: None if p is None else to_plain(p), _plan),
    "last_plan": _INT,
    "next_incarnation": _INT,
    "leaving_gpus": (lambda m: [[g, m[g]] for g in sorted(m)], lambda v, n: _leaving(v, n)),
}
# Fields a snapshot written before they existed lacks: their defaults are right for it.
_OPTIONAL = frozenset({"leaving_gpus", "regranted_gpus"})


def _leaving(v: Any, name: str) -> Any:
    from types import MappingProxyType

    if not isinstance(v, list) or not all(
        isinstance(p, list | tuple) and len(p) == 2 and isinstance(p[0], int) for p in v
    ):
        raise SchemaError(f"snapshot field {name!r}: expected [[gpu, deadline], ...], got {v!r}")
    return MappingProxyType({int(g): float(d) for g, d in v})


def _names() -> list[str]:
    names = [f.name for f in dataclasses.fields(ClusterState)]
    missing = [n for n in names if n not in _FIELDS]
    if missing:
        raise TypeError(f"ClusterState field(s) {missing} have no snapshot converter in {__name__}")
    return names


def state_to_snapshot(state: ClusterState) -> dict[str, Any]:
    """The plain (msgpack- and JSON-ready) mapping of a whole table."""
    return {
        n: _FIELDS[n][0](getattr(state, n))
        for n in _names()
        if n not in _OPTIONAL or getattr(state, n)  # unchanged snapshots without notices
    }


def state_from_snapshot(m: Any) -> ClusterState:
    """Rebuild and validate a table from :func:`state_to_snapshot`'s mapping."""
    if not isinstance(m, dict):
        raise SchemaError(f"snapshot state: expected a mapping, got {type(m).__name__}")
    names = _names()
    unknown = sorted(set(m) - set(names), key=str)
    missing = [n for n in names if n not in m and n not in _OPTIONAL]
    if unknown or missing:
        raise SchemaError(f"snapshot state: unknown fields {unknown}, missing fields {missing}")
    state = ClusterState(**{n: _FIELDS[n][1](m[n], n) for n in names if n in m})
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
    try:
        body: bytes = msgpack.packb(
            {"format": FORMAT, "seq": state.seq, "state": state_to_snapshot(state), "extra": extra},
            use_bin_type=True,
        )
    except (TypeError, ValueError) as e:
        raise SchemaError(f"snapshot extra data is not msgpack-serialisable: {e}") from None
    return _HEAD.pack(MAGIC, crc32c(body), len(body)) + body


def decode(data: bytes, where: str) -> tuple[ClusterState, dict[str, Any] | None]:
    """(state, extra) from snapshot file bytes; LogCorrupted naming ``where`` if damaged."""
    if len(data) < _HEAD.size:
        raise LogCorrupted(f"{where}: snapshot is {len(data)} bytes, shorter than its header")
    magic, crc, length = _HEAD.unpack_from(data)
    body = data[_HEAD.size :]
    if magic != MAGIC or length != len(body) or crc32c(body) != crc:
        raise LogCorrupted(f"{where}: snapshot damaged (bad magic, length or CRC at offset 0)")
    try:
        m = msgpack.unpackb(body, raw=False, strict_map_key=False)
        if not isinstance(m, dict) or m.get("format") != FORMAT:
            found = m.get("format") if isinstance(m, dict) else m
            raise SchemaError(f"snapshot format {found!r}, this PEARL reads format {FORMAT}")
        state = state_from_snapshot(m["state"])
        if state.seq != m.get("seq"):
            raise SchemaError(f"state seq {state.seq} differs from snapshot seq {m.get('seq')}")
        extra = m.get("extra")
        if extra is not None and not isinstance(extra, dict):
            raise SchemaError("snapshot extra data must be a mapping")
    except (PearlError, ValueError, KeyError, msgpack.UnpackException) as e:
        # SchemaError, InvariantViolation from validate(), msgpack's own errors
        raise LogCorrupted(f"{where}: unreadable snapshot: {e}") from None
    return state, extra


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
