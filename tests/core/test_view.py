"""The typed view between actors: the table survives the snapshot, the message codec carries the
view, consumers get the routable workers from it, and the edge renders ``pearl status --json``
in its documented shape (key order included)."""

from __future__ import annotations

import json
from typing import Any

import msgpack
from msgspec.structs import replace as msgspec_replace

from actors.messages import StateChanged
from pearl.core import commands as cmd
from pearl.core import events as ev
from pearl.core.policy import Borrow
from pearl.core.schema import to_wire
from pearl.core.state import Activity, Mode, Role, Target, Worker, Zone
from pearl.core.view import ClusterView, TableSnapshot, cluster_view, status_json
from tests.core.test_controller import Harness
from transports.protocol import MESSAGES

# `pearl status --json`, in order (the API adds endpoint and pub_endpoint after these).
STATUS_KEYS = [
    "seq",
    "workers",
    "mode",
    "N_P",
    "N_D",
    "N_C",
    "tp",
    "gpus",
    "phase",
    "training_step",
    "weights_version",
    "plan",
    "budget",
    "transitions",
    "training_may_proceed",
    "profile",
    "decision",
    "measured_makespan_s",
    "gate",
    "borrow",
    "failed",
    "quarantined_gpus",
    "boot_id",
    "controller_recoveries",
]


def borrowing() -> Harness:
    """A controller in the middle of things: GPUs added, a plan in flight, a borrow cycle."""
    h = Harness(borrow=Borrow.ALWAYS)
    h.settle()
    h.send(ev.TrainingBegin(step=1))
    h.settle()
    h.send(
        ev.TrainingFinished(step=1, weights_version=1)
    )  # the next borrow plan begins: lent, activating
    h.answer(lambda c: isinstance(c, cmd.LendTraining))
    h.send(ev.GpusAdded(gpus=(8, 9)))  # its expansion waits for that plan
    return h


def test_the_snapshot_gives_the_table_back() -> None:
    h = borrowing()
    snap = TableSnapshot.of(h.table)
    assert snap.state() == h.table
    assert [w.id for w in snap.workers] == sorted(h.table.workers)


def test_the_view_crosses_the_message_codec_unchanged() -> None:
    h = borrowing()
    msg = StateChanged(view=cluster_view(h.s, proceeded=2, boot_id="b", recoveries=1))
    back = MESSAGES.decode(msgpack.unpackb(msgpack.packb(to_wire(msg))))
    assert back == msg and back.seq == h.table.seq
    assert back.view.table.state() == h.table


def test_routable_and_serving_follow_the_table() -> None:
    h = borrowing()
    v = cluster_view(h.s)
    assert list(v.routable) == h.table.routable()
    assert v.serving == h.table.role_counts()
    assert all(w.role is not Role.TRAINING for w in v.rollout)
    assert {w.id for w in v.rollout} == {w.id for w in h.table.rollout_workers()}
    assert v.weights_version == h.table.weights_version and v.profile == h.s.profile


def test_a_hand_built_view_needs_only_its_workers() -> None:
    w = (
        Worker(id=1, gpus=(1,), role=Role.PREFILL, activity=Activity.ACTIVE, zone=Zone.DEDICATED),
        Worker(id=2, gpus=(2,), role=Role.DECODE, activity=Activity.INACTIVE, zone=Zone.DEDICATED),
        Worker(id=0, gpus=(0,), role=Role.TRAINING, activity=Activity.ACTIVE, zone=Zone.OVERLAP),
    )
    v = ClusterView(table=TableSnapshot(seq=4, workers=w))
    assert v.seq == 4 and [x.id for x in v.routable] == [1]
    assert v.serving == Target(mode=Mode.DISAGGREGATED, N_P=1, N_D=0, N_C=0)
    assert [x.id for x in v.rollout] == [1, 2]


def test_status_json_keeps_the_documented_shape() -> None:
    h = borrowing()
    out = status_json(cluster_view(h.s, proceeded=3, boot_id="boot", recoveries=1))
    assert list(out) == STATUS_KEYS
    json.dumps(out)  # plain JSON all the way down
    table: dict[str, Any] = h.table.to_json()
    assert {k: out[k] for k in table} == table
    p = h.table.plan
    assert p is not None and out["transitions"] == [
        {
            "plan": p.plan,
            "cause": p.cause,
            "target": str(p.target),
            "steps": len(p.steps),
            "done": len(p.done),
            "aborting": h.s.aborting,
        }
    ]
    assert out["budget"] == {
        "dedicated_gpus": len(h.table.dedicated_gpus),
        "training_gpus": len(h.table.training_gpus),
        "lent": True,
        "workers": p.target.N,  # a plan in flight: its target's
        "stranded_gpus": [],
    }
    assert out["training_may_proceed"] == 3 and out["boot_id"] == "boot"
    assert out["controller_recoveries"] == 1
    assert out["borrow"]["current"] == h.s.cycle.to_json()  # type: ignore[union-attr]
    assert out["decision"]["target"] == str(h.s.last_decision.target)


def test_status_json_of_an_empty_view() -> None:
    out = status_json(ClusterView())
    assert list(out) == STATUS_KEYS
    assert out["transitions"] == [] and out["profile"] is None and out["decision"] is None
    assert out["gate"] is None and out["borrow"] == {"current": None, "last": None}
    assert out["budget"] == {
        "dedicated_gpus": 0,
        "training_gpus": 0,
        "lent": False,
        "workers": 0,
        "stranded_gpus": [],
    }


def test_status_names_stranded_gpus_and_the_budget_of_its_decision() -> None:
    """TP2 workers on 8-11 and ``gpus-reclaimed 10``: GPU 11 is present and no worker can use
    it; the decision shown says which budget it was made for, and whether that is today's."""
    h = Harness()
    h.settle()
    h.send(ev.GpusAdded(gpus=(8, 9, 10, 11)))
    h.settle()
    out = status_json(cluster_view(h.s))
    assert out["budget"]["stranded_gpus"] == [] and out["budget"]["workers"] == 4
    assert out["decision"]["workers"] == 4 and out["decision"]["current"] is True
    h.send(ev.GpusReclaimed(gpus=(10,)))
    h.settle()
    out = status_json(cluster_view(h.s))
    assert out["budget"]["stranded_gpus"] == [11] and out["budget"]["workers"] == 3
    d = out["decision"]
    # Once the return is done, the controller decides for the budget after it (a decision that
    # plans nothing is still the one status shows).
    assert d["workers"] == 3 and d["current"] is True
    h.send(ev.GpusAdded(gpus=(10,)))  # back: 10 and 11 form a group again
    h.settle()
    assert status_json(cluster_view(h.s))["budget"]["stranded_gpus"] == []


def test_status_carries_the_last_measured_makespan() -> None:
    """What `pearl top` and operators compare the prediction with: the last batch's makespan
    from its telemetry; None before the first batch, kept when a telemetry has none."""
    from tests.core.test_controller import _telemetry

    h = Harness()
    h.settle()
    assert status_json(cluster_view(h.s))["measured_makespan_s"] is None
    h.send(_telemetry(h, 1))
    assert status_json(cluster_view(h.s))["measured_makespan_s"] == 60.0
    h.send(msgspec_replace(_telemetry(h, 2), makespan_s=0.0))
    assert status_json(cluster_view(h.s))["measured_makespan_s"] == 60.0
