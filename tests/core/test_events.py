"""The record codec: every kind round-trips; malformed input is a SchemaError, never a crash."""

from __future__ import annotations

import copy
import typing
from typing import Any

import msgpack
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pearl.core import events as ev
from pearl.core.errors import SchemaError
from pearl.core.schema import SCHEMA_VERSION, from_plain, to_plain
from pearl.core.state import Activity, Mode, Role, Step, StepOp, Target, Zone

EXAMPLES: list[Any] = [
    ev.ClusterInit(tp=2, training_gpus=(0, 1), reserved_gpus=(2, 3), preemptible_gpus=(4, 5, 6)),
    ev.GpusAdded(gpus=(4, 5)),
    ev.GpusReclaimed(gpus=(5,)),
    ev.TrainingBegin(step=3),
    ev.TrainingFinished(step=3, weights_version=4),
    ev.TrainingFinished(step=3),
    ev.WeightsPublished(version=4, uri="file:///w/4"),
    ev.WorkerAdded(worker=1, gpus=(2, 3), role=Role.DECODE, zone=Zone.DEDICATED),
    ev.WorkerRemoved(worker=1, reason="reclaimed"),
    ev.RoleChanged(worker=1, role=Role.PREFILL),
    ev.ActivityChanged(worker=1, activity=Activity.TRANSITIONING),
    ev.WorkerFailed(worker=1, reason="heartbeat lost", incarnation=7),
    ev.PlanBegin(
        plan=9,
        cause="gpus-added",
        target=Target(mode=Mode.DISAGGREGATED, N_P=1, N_D=2, N_C=0),
        steps=(
            Step(op=StepOp.ADD, worker=4, role=Role.DECODE, gpus=(4, 5), zone=Zone.DEDICATED),
            Step(op=StepOp.SET_ROLE, worker=1, role=Role.PREFILL),
            Step(op=StepOp.LEND, worker=0),
        ),
        mandatory=True,
    ),
    ev.StepDone(plan=9, step=0),
    ev.PlanCommit(plan=9),
    ev.PlanAbort(plan=9, reason="worker 4 failed to start"),
    ev.Telemetry(
        step=1,
        batch=64,
        S=12.0,
        delta_L=300.0,
        r=120.5,
        theta=0.2,
        A=0.01,
        b=2e-5,
        t_prefill=1e-5,
        T_env=1.5,
        makespan_s=88.0,
        toggle_s=2.5,
    ),
]
# After the list: tests above pick examples by position (EXAMPLES[-1] is the telemetry).
NOTICES: list[Any] = [
    ev.GpusReclaiming(gpus=(5, 6), deadline=1_800_000_030.5),
    ev.GpusReclaimCancelled(gpus=(5, 6)),
]


def wire(record: Any) -> dict[str, Any]:
    return msgpack.unpackb(msgpack.packb(ev.encode(record), use_bin_type=True))


def test_examples_cover_every_kind() -> None:
    assert {type(r).KIND for r in EXAMPLES + NOTICES} == set(ev.RECORDS.kinds)


@pytest.mark.parametrize("record", EXAMPLES + NOTICES, ids=lambda r: type(r).KIND)
def test_round_trip_through_msgpack(record: Any) -> None:
    m = wire(record)
    assert m["kind"] == type(record).KIND and m["v"] == SCHEMA_VERSION
    assert ev.decode(m) == record
    assert ev.decode(copy.deepcopy(m)) is not record


def test_enums_and_structs_travel_as_plain_values() -> None:
    m = wire(EXAMPLES[12])
    assert m["target"] == {"mode": "disaggregated", "N_P": 1, "N_D": 2, "N_C": 0}
    assert m["steps"][2] == {"op": "lend", "worker": 0, "role": None, "gpus": [], "zone": None}
    assert from_plain(Target, m["target"]) == Target(mode=Mode.DISAGGREGATED, N_P=1, N_D=2, N_C=0)
    assert to_plain(Target(mode=Mode.COLOCATED, N_P=0, N_D=0, N_C=3))["mode"] == "colocated"


def test_int_is_accepted_where_a_float_is_declared() -> None:
    m = wire(EXAMPLES[-1])
    m["S"] = 12
    r = ev.decode(m)
    assert r.S == 12.0 and type(r.S) is float


def bad(record: Any, **changes: Any) -> dict[str, Any]:
    m = wire(record)
    for k, v in changes.items():
        if v is KeyError:
            del m[k]
        else:
            m[k] = v
    return m


@pytest.mark.parametrize(
    ("mapping", "message"),
    [
        ([1, 2], "expected a mapping, got list"),
        ({"v": 1}, "unknown record kind None"),
        ({"kind": "gpus-eaten", "v": 1}, "unknown record kind 'gpus-eaten'"),
        (bad(EXAMPLES[3], v=2), "schema version 2"),
        (bad(EXAMPLES[3], v=KeyError), "schema version None"),
        (bad(EXAMPLES[3], colour="red"), "TrainingBegin: Object contains unknown field `colour`"),
        (bad(EXAMPLES[3], step=KeyError), "TrainingBegin: Object missing required field `step`"),
        (bad(EXAMPLES[3], step="3"), r"Expected `int`, got `str` - at `\$.step`"),
        (bad(EXAMPLES[3], step=True), r"Expected `int`, got `bool` - at `\$.step`"),
        (bad(EXAMPLES[3], step=3.0), r"Expected `int`, got `float` - at `\$.step`"),
        (bad(EXAMPLES[1], gpus=[1, "2"]), r"Expected `int`, got `str` - at `\$.gpus\[1\]`"),
        (bad(EXAMPLES[1], gpus=5), r"Expected `array`, got `int` - at `\$.gpus`"),
        (bad(EXAMPLES[10], activity="asleep"), "Invalid enum value 'asleep'"),
        (bad(EXAMPLES[10], activity=["active"]), r"Expected `str`, got `array` - at `\$.activity`"),
        (bad(EXAMPLES[4], weights_version="4"), r"null`, got `str` - at `\$.weights_version`"),
        (bad(EXAMPLES[-1], S="fast"), r"Telemetry: Expected `float`, got `str` - at `\$.S`"),
        (bad(EXAMPLES[12], target={"mode": "colocated"}), r"field `N_P` - at `\$.target`"),
        (bad(EXAMPLES[12], target=[1]), r"Expected `object`, got `array` - at `\$.target`"),
        (bad(EXAMPLES[12], steps=[{"op": "fly", "worker": 1}]), r"'fly' - at `\$.steps\[0\].op`"),
    ],
)
def test_malformed_records_raise_schema_errors(mapping: Any, message: str) -> None:
    with pytest.raises(SchemaError, match=message):
        ev.decode(mapping)


# Two decoders read records: RECORDS.decode (a mapping, msgspec.convert) and the log's
# msgspec.msgpack decoder (bytes, one tagged union). They must agree on every input, valid or not.

_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 9),
    st.floats(allow_nan=False),
    st.text(max_size=3),
    st.sampled_from(["active", "decode", "dedicated", "add", "colocated"]),
    st.lists(st.integers(0, 9), max_size=3),
    st.lists(st.text(max_size=2), max_size=2),
)


@st.composite
def mutated(draw: st.DrawFn) -> tuple[type, dict[str, Any]]:
    record = draw(st.sampled_from(EXAMPLES))
    m = wire(record)
    del m["kind"], m["v"]
    for _ in range(draw(st.integers(0, 3))):
        op = draw(st.sampled_from(["set", "drop", "add"]))
        if op == "set" and m:
            m[draw(st.sampled_from(sorted(m)))] = draw(_values)
        elif op == "drop" and m:
            del m[draw(st.sampled_from(sorted(m)))]
        elif op == "add":
            m[draw(st.text(min_size=1, max_size=4))] = draw(_values)
    return type(record), m


def outcome(fn: Any, m: dict[str, Any]) -> tuple[str, Any]:
    try:
        return "ok", fn(copy.deepcopy(m))
    except SchemaError as e:
        return "error", str(e)


@settings(max_examples=400, deadline=None)
@given(mutated())
def test_mapping_and_bytes_decoders_agree(case: tuple[type, dict[str, Any]]) -> None:
    cls, m = case
    m = {"kind": cls.KIND, "v": SCHEMA_VERSION, **m}
    by_map = outcome(ev.decode, m)
    try:
        by_bytes: tuple[str, Any] = ("ok", ev.decode_bytes(msgpack.packb(m, use_bin_type=True)))
    except msgspec.MsgspecError:
        by_bytes = ("error", None)
    assert by_map[0] == by_bytes[0]
    if by_map[0] == "ok":
        assert by_map[1] == by_bytes[1]
        assert type(by_map[1]) is cls


def test_the_record_union_is_every_registered_kind() -> None:
    assert set(typing.get_args(ev.Record)) == set(ev.RECORDS.kinds.values())


def test_every_elastic_event_is_in_the_one_list() -> None:
    subclasses = {c for c in ev.RECORDS.kinds.values() if issubclass(c, ev.ElasticEvent)}
    assert subclasses == set(ev.ELASTIC_EVENTS)
    assert len(ev.ELASTIC_EVENTS) == len(subclasses)  # no class listed twice
    assert {c.KIND for c in ev.ELASTIC_EVENTS} == {
        "gpus-added",
        "gpus-reclaimed",
        "gpus-reclaiming",
        "gpus-reclaim-cancelled",
        "training-begin",
        "training-finished",
    }


def test_a_plan_cause_is_written_as_its_word_and_any_older_word_still_reads() -> None:
    target = Target(mode=Mode.COLOCATED, N_P=0, N_D=0, N_C=1)
    written = ev.PlanBegin(plan=1, cause=ev.PlanCause.REBALANCE, target=target, steps=())
    plain = ev.PlanBegin(plan=1, cause="rebalance", target=target, steps=())
    assert msgspec.msgpack.encode(written) == msgspec.msgpack.encode(plain)
    assert ev.decode_bytes(msgspec.msgpack.encode(written)).cause == ev.PlanCause.REBALANCE
    older = msgspec.msgpack.encode(msgspec.structs.replace(plain, cause="startup"))
    assert ev.decode_bytes(older).cause == "startup"


@pytest.mark.parametrize("kind", [[], {}, 3, None])
def test_a_kind_that_is_not_a_string_is_a_schema_error(kind: Any) -> None:
    with pytest.raises(SchemaError, match="unknown record kind"):
        ev.decode({"kind": kind, "v": SCHEMA_VERSION})
