"""The codec: every registered kind round-trips; everything else is a BadMessage with a code."""

from __future__ import annotations

import contextlib

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pearl.core.commands import COMMANDS
from pearl.core.errors import ProtocolError, SchemaError
from pearl.core.events import RECORDS, GpusAdded, PlanCommit
from pearl.core.schema import to_wire
from tests.transports.samples import all_kinds, sample
from transports.codec import BadMessage, Codec, registries_overlap
from transports.protocol import (
    MESSAGES,
    PROTOCOL_VERSION,
    Error,
    ErrorCode,
    Event,
    Limits,
    Ping,
    Result,
)

KINDS = all_kinds()


def test_every_registry_is_covered_and_kinds_are_unique() -> None:
    names = {reg for reg, _, _ in KINDS}
    assert names == {MESSAGES.name, COMMANDS.name, RECORDS.name}
    assert len(KINDS) == len(MESSAGES.kinds) + len(COMMANDS.kinds) + len(RECORDS.kinds)
    assert registries_overlap() == set()


@pytest.mark.parametrize(("reg", "kind", "cls"), KINDS, ids=[f"{r}:{k}" for r, k, _ in KINDS])
def test_round_trip(reg: str, kind: str, cls: type) -> None:
    codec = Codec()
    msg = sample(cls)
    frames = codec.encode(msg, id=11, corr=10, sender="me", frames=[b"bulk", bytearray(b"x" * 5)])
    env = codec.decode(frames)
    assert env.msg == msg
    assert type(env.msg) is cls and env.kind == kind
    assert (env.id, env.corr, env.sender) == (11, 10, "me")
    assert [bytes(f) for f in env.frames] == [b"bulk", b"xxxxx"]


def test_event_carries_an_elastic_record_only() -> None:
    ev = Event.of(GpusAdded(gpus=(1, 2)))
    assert Codec().decode(Codec().encode(ev)).msg.decoded == GpusAdded(gpus=(1, 2))
    bad = _envelope("event", {"kind": "event", "v": 1, "record": to_wire(PlanCommit(plan=3))})
    with pytest.raises(BadMessage) as e:
        Codec().decode([bad])
    assert e.value.code == ErrorCode.SCHEMA and "'plan-commit' - at `$.record.kind`" in str(e.value)
    with pytest.raises(SchemaError, match="gpus-added"):  # built by hand from another record
        Event.of(PlanCommit(plan=3))


def _envelope(kind: str, body: object, **over: object) -> bytes:
    env = {"proto": PROTOCOL_VERSION, "id": 5, "corr": 0, "sender": "t", "kind": kind}
    env["body"] = body
    env.update(over)
    return msgpack.packb(env)


PING = {"kind": "ping", "v": 1, "nonce": 1}

BAD = {
    "not-msgpack": ([b"\xc1\xc1\xc1"], ErrorCode.MALFORMED),
    "truncated": ([_envelope("ping", PING)[:-3]], ErrorCode.MALFORMED),
    "extra-bytes": ([_envelope("ping", PING) + b"\x00"], ErrorCode.MALFORMED),
    "not-a-map": ([msgpack.packb([1, 2, 3])], ErrorCode.MALFORMED),
    "ext-type": ([msgpack.packb({"proto": msgpack.ExtType(5, b"x")})], ErrorCode.MALFORMED),
    "bad-utf8": ([b"\x81\xa2\xff\xfe\x01"], ErrorCode.MALFORMED),
    "no-frames": ([], ErrorCode.MALFORMED),
    "wrong-proto": ([_envelope("ping", PING, proto=PROTOCOL_VERSION + 1)], ErrorCode.VERSION),
    "no-proto": ([msgpack.packb({"kind": "ping"})], ErrorCode.VERSION),
    "missing-key": ([msgpack.packb({"proto": PROTOCOL_VERSION, "kind": "ping"})], "malformed"),
    "id-not-int": ([_envelope("ping", PING, id="5")], ErrorCode.MALFORMED),
    "unknown-kind": ([_envelope("launch-missiles", {"kind": "launch-missiles"})], "unknown-kind"),
    "kind-not-str": ([_envelope(7, PING)], ErrorCode.MALFORMED),  # type: ignore[arg-type]
    "body-kind-mismatch": ([_envelope("pong", PING)], ErrorCode.SCHEMA),
    "body-not-map": ([_envelope("ping", [1])], ErrorCode.SCHEMA),
    "wrong-field-type": ([_envelope("ping", {**PING, "nonce": "one"})], ErrorCode.SCHEMA),
    "unknown-field": ([_envelope("ping", {**PING, "x": 1})], ErrorCode.SCHEMA),
    "schema-version": ([_envelope("ping", {**PING, "v": 99})], ErrorCode.SCHEMA),
    "missing-field": ([_envelope("ack", {"kind": "ack", "v": 1})], ErrorCode.SCHEMA),
    "bad-enum": (
        [_envelope("role-changed", {"kind": "role-changed", "v": 1, "worker": 1, "role": "boss"})],
        ErrorCode.SCHEMA,
    ),
}

SMALL = Limits(max_envelope=256, max_frame=1024, max_message=2048, max_frames=4)
OVERSIZE = {
    "envelope": [b"\x00" * 257],
    "frame": [_envelope("ping", PING), b"\x00" * 1025],
    "message": [_envelope("ping", PING), b"\x00" * 1000, b"\x00" * 1000],
    "frame-count": [_envelope("ping", PING), b"", b"", b"", b""],
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_input_is_a_bad_message_with_its_code(name: str) -> None:
    frames, code = BAD[name]
    with pytest.raises(BadMessage) as e:
        Codec().decode(frames)
    assert e.value.code == code, str(e.value)
    assert isinstance(e.value, ProtocolError)


@pytest.mark.parametrize("name", sorted(OVERSIZE))
def test_oversize_is_rejected_before_decoding(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    def unpack_called(*a: object, **k: object) -> None:
        raise AssertionError("unpacked an oversize message")

    monkeypatch.setattr(msgpack, "unpackb", unpack_called)
    with pytest.raises(BadMessage) as e:
        Codec(SMALL).decode(OVERSIZE[name])
    assert e.value.code == ErrorCode.TOO_LARGE


def test_msgpack_length_limits_apply_inside_the_envelope() -> None:
    # 200-byte frame whose map header claims 2**31 entries: refused without allocating.
    bomb = b"\xdf\x7f\xff\xff\xff" + b"\x00" * 195
    with pytest.raises(BadMessage) as e:
        Codec(SMALL).decode([bomb])
    assert e.value.code == ErrorCode.MALFORMED


def test_corr_is_recovered_from_a_readable_envelope() -> None:
    with pytest.raises(BadMessage) as e:
        Codec().decode([_envelope("nope", {}, id=42)])
    assert e.value.corr == 42


def test_encode_refuses_what_peers_could_not_decode() -> None:
    codec = Codec(SMALL)
    with pytest.raises(ProtocolError, match="not a registered kind"):
        codec.encode(object())
    with pytest.raises(ProtocolError, match="cannot encode"):
        codec.encode(Result(value={"x": object()}))
    with pytest.raises(ProtocolError, match="envelope"):
        codec.encode(Error(code="x", message="y" * 300))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=300), min_size=0, max_size=6))
def test_random_frames_never_escape_as_other_errors(frames: list[bytes]) -> None:
    with contextlib.suppress(BadMessage):
        Codec(SMALL).decode(frames)


@settings(max_examples=200, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.text() | st.binary(),
        lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(), c, max_size=4),
        max_leaves=20,
    )
)
def test_random_msgpack_bodies_are_rejected_cleanly(body: object) -> None:
    for kind in ("ping", "status", "event", "plan-begin"):
        with contextlib.suppress(BadMessage):
            Codec().decode([_envelope(kind, body)])


def test_ping_example_is_the_documented_envelope() -> None:
    env = msgpack.unpackb(Codec().encode(Ping(nonce=3), id=1, sender="cli")[0])
    assert env == {
        "proto": PROTOCOL_VERSION,
        "id": 1,
        "corr": 0,
        "sender": "cli",
        "kind": "ping",
        "body": {"kind": "ping", "v": 1, "nonce": 3},
    }
