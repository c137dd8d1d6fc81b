"""A live pearld refuses a step out of bounds in one line and logs nothing (issue 35: step
2**64 - 1 was accepted and bricked the state dir; step 0 was accepted at step 0), and keeps
accepting the events that follow."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
import zmq

from pearl.core import events as ev
from tests.daemon.conftest import Pearld
from tests.daemon.test_cli_training_begin import cli
from transports.codec import Codec
from transports.protocol import PROTOCOL_VERSION, Error, ErrorCode

pytestmark = pytest.mark.slow


def raw_event(endpoint: str, record: dict[str, Any]) -> Any:
    """Send an ``event`` the client library would refuse to build; pearld's reply."""
    env = {
        "proto": PROTOCOL_VERSION,
        "id": 1,
        "corr": 0,
        "sender": "raw",
        "kind": "event",
        "body": {"kind": "event", "v": 1, "record": {"v": 1, **record}},
    }
    with zmq.Context() as ctx, ctx.socket(zmq.DEALER) as sock:
        sock.linger = 0
        sock.connect(endpoint)
        sock.send_multipart([msgpack.packb(env)])
        assert sock.poll(10_000), "no reply"
        return Codec().decode(sock.recv_multipart()).msg


def test_a_step_out_of_bounds_is_refused_in_one_line_and_never_logged(
    pearld_factory: Any,
) -> None:
    d: Pearld = pearld_factory("daemon.borrow=never")
    seq = d.settled()["seq"]
    for step in ("18446744073709551615", "0", "-1"):
        r = cli("event", "training-begin", "--step", step, endpoint=d.endpoint)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 1 and len(lines) == 1, r.stderr
        assert f"training step {step} is out of range: training steps run from 1" in lines[0]
    for record in (
        {"kind": "training-begin", "step": 2**64 - 1},
        {"kind": "training-begin", "step": 0},
        {"kind": "training-finished", "step": 1, "weights_version": 2**63},
        {"kind": "gpus-added", "gpus": [2**30]},
    ):
        reply = raw_event(d.endpoint, record)
        assert isinstance(reply, Error) and reply.code == ErrorCode.SCHEMA, reply
        assert "is out of range" in reply.message and "\n" not in reply.message, reply.message
    assert d.status()["seq"] == seq
    assert not any(isinstance(r, ev.TrainingBegin | ev.TrainingFinished) for _, r in d.records())

    # Training goes on: the steps that follow are accepted, and so is the one after.
    for args in (("training-begin", "--no-wait"), ("training-finished",), ("training-begin",)):
        r = cli("event", *args, endpoint=d.endpoint)
        assert r.returncode == 0, r.stderr
    s = d.status()
    assert (s["training_step"], s["phase"]) == (2, "training"), s
