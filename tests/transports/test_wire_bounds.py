"""Integers on the wire are range-checked at the edge (issue 35): an ``event`` whose step,
version, GPU id or deadline is out of bounds is a one-line schema error when decoded (and when a
client builds it), a weights upload with an absurd version too, and the in-process path (the
embedded Runtime) is refused by the ElasticScheduler before the Orchestrator sees it."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from actors import names
from actors.control import ElasticScheduler
from actors.messages import WeightsUpload
from pearl.core import events as ev
from pearl.core.errors import SchemaError
from transports.codec import BadMessage, Codec
from transports.protocol import PROTOCOL_VERSION, ErrorCode, Event


def frames(kind: str, body: dict[str, Any]) -> list[bytes]:
    env = {"proto": PROTOCOL_VERSION, "id": 7, "corr": 0, "sender": "t", "kind": kind, "body": body}
    return [msgpack.packb(env)]


def event(record: dict[str, Any]) -> list[bytes]:
    return frames("event", {"kind": "event", "v": 1, "record": {"v": 1, **record}})


OUT_OF_RANGE = [
    ({"kind": "training-begin", "step": 2**64 - 1}, "training step 18446744073709551615 is out"),
    ({"kind": "training-begin", "step": 0}, "training step 0 is out of range"),
    ({"kind": "training-begin", "step": -1}, "training step -1 is out of range"),
    ({"kind": "training-finished", "step": 2**63}, "training step 9223372036854775808 is out"),
    ({"kind": "training-finished", "step": 3, "weights_version": -1}, "weights version -1"),
    ({"kind": "gpus-added", "gpus": [8, 2**40]}, "GPU id 1099511627776 is out of range"),
    ({"kind": "gpus-reclaimed", "gpus": [-3]}, "GPU id -3 is out of range"),
    ({"kind": "gpus-reclaiming", "gpus": [8], "deadline": float("inf")}, "deadline inf is out"),
    ({"kind": "gpus-reclaiming", "gpus": [8], "deadline": 1e300}, "deadline 1e+300 is out"),
]


@pytest.mark.parametrize(("record", "words"), OUT_OF_RANGE, ids=lambda x: str(x)[:40])
def test_an_event_out_of_bounds_is_a_one_line_schema_error(
    record: dict[str, Any], words: str
) -> None:
    with pytest.raises(BadMessage) as e:
        Codec().decode(event(record))
    msg = str(e.value)
    assert e.value.code == ErrorCode.SCHEMA and e.value.corr == 7
    assert msg.startswith("'event': ") and words in msg and "\n" not in msg, msg
    assert msg.endswith("nothing was logged"), msg


def test_events_within_bounds_decode() -> None:
    for record in (
        {"kind": "training-begin", "step": 2**63 - 1},
        {"kind": "training-finished", "step": 1, "weights_version": 0},
        {"kind": "gpus-added", "gpus": [0, 2**20 - 1]},
        {"kind": "gpus-reclaiming", "gpus": [8], "deadline": 1.8e9},
    ):
        assert Codec().decode(event(record)).msg.decoded.KIND == record["kind"]


VALID = {
    "gpus-added": {"gpus": [8, 9]},
    "gpus-reclaimed": {"gpus": [8]},
    "gpus-reclaiming": {"gpus": [8], "deadline": 1.8e9},
    "gpus-reclaim-cancelled": {"gpus": [8]},
    "training-begin": {"step": 2},
    "training-finished": {"step": 2, "weights_version": 2},
}


@pytest.mark.parametrize("cls", ev.ELASTIC_EVENTS, ids=lambda c: c.KIND)
def test_an_event_message_carries_every_elastic_event(cls: type[ev.ElasticEvent]) -> None:
    decoded = Codec().decode(event({"kind": cls.KIND, **VALID[cls.KIND]})).msg.decoded
    assert type(decoded) is cls


def test_an_event_message_refuses_a_record_that_is_not_elastic() -> None:
    with pytest.raises(BadMessage) as e:  # pearld logs weights-published once they are stored
        Codec().decode(event({"kind": "weights-published", "version": 3, "uri": "file:///w"}))
    assert e.value.code == ErrorCode.SCHEMA
    with pytest.raises(SchemaError, match="Event.record: expected one of"):
        Event.of(ev.WeightsPublished(version=3))


def test_a_client_cannot_build_an_event_out_of_bounds() -> None:
    with pytest.raises(SchemaError, match=r"^training step 0 is out of range"):
        Event.of(ev.TrainingBegin(step=0))
    with pytest.raises(SchemaError, match=r"^weights version 18446744073709551615 is out"):
        Event.of(ev.TrainingFinished(step=1, weights_version=2**64 - 1))


def test_a_weights_upload_with_an_absurd_version_is_refused_before_it_is_stored() -> None:
    body = {"kind": "weights-upload", "v": 1, "version": 2**64 - 1}
    with pytest.raises(BadMessage) as e:
        Codec().decode(frames("weights-upload", body))
    assert e.value.code == ErrorCode.SCHEMA
    assert "weights version 18446744073709551615 is out of range" in str(e.value)
    assert "nothing was stored or logged" in str(e.value)
    with pytest.raises(SchemaError):
        WeightsUpload(version=-1)
    assert Codec().decode(frames("weights-upload", {**body, "version": 3})).msg.version == 3


class Orchestrator:
    def __init__(self) -> None:
        self.asked: list[Any] = []

    def ask(self, record: Any, timeout: float | None = None) -> Any:
        self.asked.append(record)
        return "ack"


class Directory:
    def __init__(self) -> None:
        self.orchestrator = Orchestrator()

    def get(self, name: str) -> Any:
        assert name == names.ORCHESTRATOR
        return self.orchestrator


@pytest.mark.parametrize(
    "record",
    [
        ev.TrainingBegin(step=0),
        ev.TrainingBegin(step=2**64 - 1),
        ev.WeightsPublished(version=2**63),
        ev.GpusAdded(gpus=(-1,)),
    ],
    ids=str,
)
def test_the_scheduler_refuses_in_process_events_out_of_bounds(record: Any) -> None:
    directory = Directory()
    scheduler = ElasticScheduler(directory)  # type: ignore[arg-type]
    with pytest.raises(SchemaError, match="is out of range"):
        scheduler.event(record)
    assert directory.orchestrator.asked == []  # never reached the log
    assert scheduler.event(ev.TrainingBegin(step=1)) == "ack"
    assert directory.orchestrator.asked == [ev.TrainingBegin(step=1)]
