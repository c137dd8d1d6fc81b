"""The typed cluster status: its encoding is the documented ``pearl status --json`` object, it
crosses the wire codec as typed records, and a client reads it by attribute."""

from __future__ import annotations

import json

import msgspec

from pearl.core.status import ClusterStatus, status_of, status_plain
from pearl.core.view import ClusterView, cluster_status, cluster_view, status_json
from tests.core.test_view import STATUS_KEYS, borrowing
from transports.codec import Codec
from transports.protocol import Status

API_KEYS = ["endpoint", "pub_endpoint", "worker_metrics", "worker_nodes", "worker_faults"]


def test_the_typed_status_encodes_to_the_documented_object() -> None:
    for v in (cluster_view(borrowing().s, proceeded=3, boot_id="b", recoveries=1), ClusterView()):
        out = status_plain(cluster_status(v))
        assert list(out) == STATUS_KEYS + API_KEYS
        assert {k: out[k] for k in STATUS_KEYS} == json.loads(json.dumps(status_json(v)))
        assert status_of(out) == cluster_status(v)


def test_the_status_reply_crosses_the_codec_typed() -> None:
    h = borrowing()
    status = msgspec.structs.replace(
        cluster_status(cluster_view(h.s, proceeded=3)),
        endpoint="tcp://127.0.0.1:7440",
        worker_metrics={"3": "127.0.0.1:9100"},
    )
    back = Codec().decode(Codec().encode(Status(payload=status))).msg
    assert isinstance(back, Status) and isinstance(back.payload, ClusterStatus)
    s = back.payload
    assert s == status and s.training_may_proceed == 3 and s.seq == h.table.seq
    assert [w.id for w in s.workers] == sorted(h.table.workers)
    assert s.borrow.current is not None and s.borrow.current.step == 1
    assert s.budget.lent and s.transitions[0].plan == h.table.plan.plan  # type: ignore[union-attr]
    assert s.profile == h.s.profile and s.worker_metrics == {"3": "127.0.0.1:9100"}


def test_no_status_before_the_first_view() -> None:
    assert Codec().decode(Codec().encode(Status())).msg.payload is None


def test_a_newer_peers_extra_fields_are_ignored() -> None:
    out = status_plain(cluster_status(ClusterView()))
    assert status_of({**out, "added_later": 1, "budget": {**out["budget"], "x": 2}}) == status_of(
        out
    )
