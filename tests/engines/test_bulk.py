"""The KV channels (ZeroMQ and in-process) and the tensor wire format."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
import zmq

from pearl.engines.base import KVTimeout
from pearl.engines.torch.wire import from_frames, to_frames
from transports.bulk import LocalKVHub, ZmqKVChannel, bulk_recv, bulk_send, make_socket


@pytest.fixture(params=["zmq", "local"])
def pair(request: pytest.FixtureRequest) -> Iterator[tuple[Any, Any]]:
    if request.param == "zmq":
        a, b = ZmqKVChannel(ttl_s=0.3), ZmqKVChannel(max_buffered_bytes=1 << 20, ttl_s=0.3)
    else:
        hub = LocalKVHub(max_buffered_bytes=1 << 20, ttl_s=0.3)
        a, b = hub.channel("a"), hub.channel("b")
    yield a, b
    a.close()
    b.close()


def test_a_transfer_sent_before_receive_is_buffered(pair: tuple[Any, Any]) -> None:
    a, b = pair
    payload = np.arange(1000, dtype=np.float32)
    a.send(b.address, "t1", {"tokens": 3}, [payload, b"xyz"])  # before b asks for it
    meta, frames = b.receive("t1", timeout_s=2)
    assert meta["tokens"] == 3 and meta["arrived_at"] >= meta["sent_at"] > 0
    assert np.array_equal(np.frombuffer(frames[0], dtype=np.float32), payload)
    assert bytes(frames[1]) == b"xyz"
    assert b.poll("t1") is None  # taken once


def test_transfers_are_keyed_by_id(pair: tuple[Any, Any]) -> None:
    a, b = pair
    for i in range(5):
        a.send(b.address, f"t{i}", {"i": i}, [bytes([i]) * 10])
    got = [b.receive(f"t{i}", 2)[0]["i"] for i in (3, 0, 4, 1, 2)]
    assert got == [3, 0, 4, 1, 2]


def test_receive_times_out_with_kvtimeout(pair: tuple[Any, Any]) -> None:
    _, b = pair
    t0 = time.monotonic()
    with pytest.raises(KVTimeout, match="nothing-here"):
        b.receive("nothing-here", 0.2)
    assert 0.15 < time.monotonic() - t0 < 2


def test_unclaimed_transfers_expire_and_the_inbox_is_bounded(pair: tuple[Any, Any]) -> None:
    a, b = pair
    a.send(b.address, "old", {}, [b"x"])
    time.sleep(0.5)  # no event: expiry is by age, so the transfer must grow older than the TTL
    a.send(b.address, "new", {}, [b"y"])
    b.receive("new", 2)
    assert b.poll("old") is None
    big = bytes(400_000)
    for i in range(3):  # 1.2 MB into a 1 MiB inbox: the oldest goes
        a.send(b.address, f"big{i}", {}, [big])
    b.receive("big2", 2)
    assert b.poll("big0") is None and b.poll("big1") is not None


def test_a_large_transfer_arrives_intact() -> None:
    a, b = ZmqKVChannel(), ZmqKVChannel()
    try:
        kv = torch.randn(28, 2, 512, 8, 128)  # ~60 MB, a qwen3-0.6b prompt's K/V
        meta, frames = to_frames({"kv": kv})
        a.send(b.address, "big", meta, frames)
        m, f = b.receive("big", 10)
        assert torch.equal(from_frames(m, f)["kv"], kv)
    finally:
        a.close()
        b.close()


def test_malformed_messages_are_dropped_and_the_inbox_keeps_working() -> None:
    b = ZmqKVChannel()
    push = make_socket(zmq.Context.instance(), zmq.PUSH)
    try:
        push.connect(b.address)
        push.send_multipart([b"\xc1not msgpack"])
        push.send_multipart([b"\x81\xa1v\x09"])  # {"v": 9}: wrong version
        bulk_send(sock=push, transfer_id="ok", meta={"n": 1}, frames=[b"abc"])
        meta, frames = b.receive("ok", 2)
        assert meta["n"] == 1 and bytes(frames[0]) == b"abc"
        assert b.dropped == 2
    finally:
        push.close()
        b.close()


def test_raw_bulk_send_and_recv() -> None:
    ctx = zmq.Context.instance()
    pull, push = make_socket(ctx, zmq.PULL), make_socket(ctx, zmq.PUSH)
    try:
        pull.bind("tcp://127.0.0.1:*")
        push.connect(pull.getsockopt_string(zmq.LAST_ENDPOINT))
        state = {"w": torch.randn(64, 32).to(torch.bfloat16), "b": torch.arange(5)}
        meta, frames = to_frames(state)
        assert (
            bulk_send(sock=push, transfer_id="weights-v3", meta=meta, frames=frames)
            == 64 * 32 * 2 + 5 * 8
        )
        tid, m, f = bulk_recv(pull, 2)
        back = from_frames(m, f)
        assert tid == "weights-v3" and back.keys() == state.keys()
        assert all(
            torch.equal(back[k], state[k]) and back[k].dtype == state[k].dtype for k in state
        )
        with pytest.raises(KVTimeout):
            bulk_recv(pull, 0.05)
    finally:
        push.close()
        pull.close()
