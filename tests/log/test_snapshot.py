"""Snapshot files and the ClusterState <-> mapping conversion."""

from __future__ import annotations

import dataclasses
import struct
from pathlib import Path

import msgpack
import pytest

from pearl.core.errors import LogCorrupted, SchemaError
from pearl.core.fold import replay
from pearl.core.state import ClusterState
from pearl.log import snapshot
from pearl.testing.workload import realistic

STATE = replay(realistic(400, seed=4))  # mid-plan, GPUs present, training


def test_every_field_of_the_table_is_snapshotted() -> None:
    m = snapshot.state_to_snapshot(STATE)
    assert set(m) == {f.name for f in dataclasses.fields(ClusterState)}
    assert STATE.workers and STATE.present_gpus  # a non-trivial table
    assert snapshot.state_from_snapshot(m) == STATE
    body = msgpack.unpackb(snapshot.encode(STATE, None)[12:], strict_map_key=False)
    assert body == {"format": 1, "seq": STATE.seq, "state": _lists(m), "extra": None}


def _lists(m: dict) -> dict:
    """``m`` with its tuples as lists, as msgpack reads it back."""
    return msgpack.unpackb(msgpack.packb(m), strict_map_key=False)


def test_fields_a_snapshot_lacks_read_as_their_defaults() -> None:
    """A snapshot written before a field existed loads with the field's default."""
    m = snapshot.state_to_snapshot(STATE)
    assert not STATE.regranted_gpus and not STATE.leaving_gpus
    del m["regranted_gpus"], m["leaving_gpus"]
    assert snapshot.state_from_snapshot(m) == STATE
    data = _rewrap({"format": 1, "seq": STATE.seq, "state": m, "extra": None})
    assert snapshot.decode(data, "f") == (STATE, None)


def test_file_bytes_round_trip_with_extra() -> None:
    data = snapshot.encode(STATE, {"theta": 0.2, "steps": [1, 2], "nested": {"a": None}})
    state, extra = snapshot.decode(data, "here")
    assert state == STATE and extra == {"theta": 0.2, "steps": [1, 2], "nested": {"a": None}}
    assert snapshot.decode(snapshot.encode(STATE, None), "here") == (STATE, None)


def test_unserialisable_extra_is_refused() -> None:
    with pytest.raises(SchemaError, match="not msgpack-serialisable"):
        snapshot.encode(STATE, {"x": object()})


def _rewrap(body: dict) -> bytes:
    raw = msgpack.packb(body, use_bin_type=True)
    from crc32c import crc32c

    return struct.pack("<4sII", b"PSNP", crc32c(raw), len(raw)) + raw


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d[:30], "bad magic, length or CRC"),
        (lambda d: d[:4] + b"\0" + d[5:], "bad magic, length or CRC"),
        (lambda d: d[:-1] + bytes([d[-1] ^ 1]), "bad magic, length or CRC"),
        (lambda d: b"XXXX" + d[4:], "bad magic, length or CRC"),
        (lambda d: d[:5], "shorter than its header"),
    ],
)
def test_damaged_files_raise_log_corrupted(mutate, message: str) -> None:
    data = snapshot.encode(STATE, None)
    with pytest.raises(LogCorrupted, match=message):
        snapshot.decode(mutate(data), "snap-file")


def test_well_formed_but_wrong_contents_raise_log_corrupted() -> None:
    m = snapshot.state_to_snapshot(STATE)
    with pytest.raises(LogCorrupted, match="snapshot format 2"):
        snapshot.decode(_rewrap({"format": 2, "seq": STATE.seq, "state": m, "extra": None}), "f")
    with pytest.raises(LogCorrupted, match="differs from snapshot seq"):
        snapshot.decode(_rewrap({"format": 1, "seq": 3, "state": m, "extra": None}), "f")
    bad = dict(m, workers=[*m["workers"], dict(m["workers"][-1], id=99)])  # two on one GPU
    with pytest.raises(LogCorrupted, match="GPU .* is bound to rollout workers"):
        snapshot.decode(_rewrap({"format": 1, "seq": STATE.seq, "state": bad, "extra": None}), "f")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"tp": "2"}, r"Expected `int`, got `str` - at `\$.tp`"),
        ({"tp": True}, r"Expected `int`, got `bool` - at `\$.tp`"),
        ({"present_gpus": 3}, r"Expected `array`, got `int` - at `\$.present_gpus`"),
        ({"phase": "napping"}, r"Invalid enum value 'napping' - at `\$.phase`"),
        ({"workers": [{"id": 1}]}, r"missing required field `gpus` - at `\$.workers\[0\]`"),
        ({"colour": 1}, "unknown field `colour`"),
    ],
)
def test_state_mapping_is_checked(change: dict, message: str) -> None:
    m = dict(snapshot.state_to_snapshot(STATE), **change)
    with pytest.raises(SchemaError, match=message):
        snapshot.state_from_snapshot(m)
    data = _rewrap({"format": 1, "seq": STATE.seq, "state": m, "extra": None})
    with pytest.raises(LogCorrupted, match=message):
        snapshot.decode(data, "f")


def test_write_file_is_atomic_and_named_by_seq(tmp_path: Path) -> None:
    data = snapshot.encode(STATE, None)
    path = snapshot.write_file(tmp_path, STATE.seq, data)
    assert path.name == f"snapshot-{STATE.seq:016d}.snap" and path.read_bytes() == data
    assert snapshot.parse_name(path.name) == STATE.seq
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temp file left
    assert snapshot.parse_name("snapshot-12.snap") is None
