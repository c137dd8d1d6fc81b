"""Preemption notices in the pure core: the table and its fold, the controller's plan for the
budget after the deadline, the deadline treated as the reclaim, withdrawal, recovery, and the
Router's rule for which turns finish in place."""

from __future__ import annotations

import dataclasses
from types import MappingProxyType

import pytest

from pearl.core import commands as cmd
from pearl.core import events as ev
from pearl.core import notice
from pearl.core.errors import InvalidEvent, InvalidNotice, PearlError
from pearl.core.fold import apply, replay
from pearl.core.profile import prior_profile
from pearl.core.state import Activity, StepOp, validate
from pearl.core.view import TableSnapshot
from pearl.log import snapshot
from tests.core.test_controller import CFG, Harness

T0 = 1_800_000_000.0  # the simulated wall clock: Unix seconds


class Clocked(Harness):
    """The Harness with a wall clock beside the controller's (``wall = T0 + now``)."""

    def send(self, event: object, dt: float = 0.0) -> None:
        self.now += dt
        self._take(self.ctl.handle(s=self.s, event=event, now=self.now, wall=T0 + self.now))

    @property
    def wall(self) -> float:
        return T0 + self.now


def grown() -> Clocked:
    """4 reserved-zone + preemptible workers serving: 2 on GPUs 4-7, 2 on 8-11."""
    h = Clocked()
    h.settle()
    h.send(ev.GpusAdded(gpus=(8, 9, 10, 11)))
    h.settle()
    assert len(h.table.routable()) == 4
    return h


def on(h: Harness, gpu: int) -> int:
    return next(w.id for w in h.table.rollout_workers() if gpu in w.gpus)


# -- the table -------------------------------------------------------------------------------


def test_notice_marks_gpus_leaving_and_stops_new_turns_then_cancel_clears() -> None:
    h = grown()
    t = apply(h.table, ev.GpusReclaiming(gpus=(8, 9), deadline=T0 + 30), h.table.seq + 1)
    validate(t)
    w = t.workers[on(h, 8)]
    assert w.activity is Activity.TRANSITIONING and dict(t.leaving_gpus) == {8: T0 + 30, 9: T0 + 30}
    assert t.to_json()["gpus"]["leaving"] == [{"gpus": [8, 9], "deadline": T0 + 30}]
    assert 8 in t.present_gpus  # usable until the deadline
    t2 = apply(t, ev.GpusReclaimCancelled(gpus=(8, 9)))
    assert not t2.leaving_gpus and t2.to_json()["gpus"]["leaving"] == []


@pytest.mark.parametrize(
    ("record", "match"),
    [
        (ev.GpusReclaiming(gpus=(12, 13), deadline=T0 + 30), "GPU 12 is not present"),
        (ev.GpusReclaiming(gpus=(4, 5), deadline=T0 + 30), "GPU 4 is reserved, not preemptible"),
        (ev.GpusReclaiming(gpus=(0,), deadline=T0 + 30), "GPU 0 is a training GPU"),
        (ev.GpusReclaiming(gpus=(8, 8), deadline=T0 + 30), "names a GPU twice"),
        (ev.GpusReclaiming(gpus=(), deadline=T0 + 30), "names no GPU"),
        (ev.GpusReclaimCancelled(gpus=(10,)), "GPU 10 has no pending reclaim notice"),
    ],
)
def test_bad_notices_are_refused_and_change_nothing(record: object, match: str) -> None:
    h = grown()
    before = h.table
    with pytest.raises(InvalidNotice, match=match):
        h.send(record)
    assert h.table == before


def test_second_notice_for_the_same_gpus_is_an_error() -> None:
    h = grown()
    h.send(ev.GpusReclaiming(gpus=(8, 9), deadline=h.wall + 30))
    with pytest.raises(InvalidNotice, match="already has a reclaim notice.*cancelled"):
        h.send(ev.GpusReclaiming(gpus=(9, 10), deadline=h.wall + 60))
    assert set(h.table.leaving_gpus) == {8, 9}


def test_deadline_in_the_past_or_over_an_hour_is_an_error() -> None:
    h = grown()
    with pytest.raises(InvalidNotice, match="in the past"):
        h.send(ev.GpusReclaiming(gpus=(8, 9), deadline=h.wall - 1))
    with pytest.raises(InvalidNotice, match="more than the 3600 s"):
        h.send(ev.GpusReclaiming(gpus=(8, 9), deadline=h.wall + 3601))
    assert not h.table.leaving_gpus
    assert issubclass(InvalidNotice, InvalidEvent) and issubclass(InvalidNotice, PearlError)


def test_notice_survives_snapshot_and_view_round_trips() -> None:
    h = grown()
    h.send(ev.GpusReclaiming(gpus=(8, 9), deadline=h.wall + 30))
    t = h.table
    assert snapshot.state_from_snapshot(snapshot.state_to_snapshot(t)) == t
    assert TableSnapshot.of(t).state() == t
    m = snapshot.state_to_snapshot(t)
    del m["leaving_gpus"]  # a snapshot from before notices existed: none pending
    none = dataclasses.replace(t, leaving_gpus=MappingProxyType({}))
    assert snapshot.state_from_snapshot(m) == none


# -- the controller --------------------------------------------------------------------------


def test_notice_plans_for_the_budget_after_the_deadline_at_once() -> None:
    h = grown()
    leaving = {on(h, 8), on(h, 10)}
    h.send(ev.GpusReclaiming(gpus=(8, 9, 10, 11), deadline=h.wall + 30))
    p = h.table.plan
    # The replacement plan begins now (a re-role of the survivors, or nothing to change) and
    # never names the leaving workers: they finish their turns where they are.
    assert p is None or not {st.worker for st in p.steps} & leaving
    assert not any(isinstance(c, cmd.StopWorker) and c.worker in leaving for c in h.pending)
    h.settle()
    assert {w.id for w in h.table.routable()} & leaving == set()
    assert leaving <= set(h.table.workers)  # still there, serving what they had
    assert h.table.role_counts().N == 2


def test_deadline_is_treated_as_the_reclaim_and_nothing_waits_for_it() -> None:
    h = grown()
    leaving = {on(h, 8), on(h, 10)}
    h.send(ev.GpusReclaiming(gpus=(8, 9, 10, 11), deadline=h.wall + 30))
    h.settle()
    h.send(cmd.Tick(), dt=10)
    assert h.table.leaving_gpus and not h.table.reclaiming_gpus  # not yet
    h.send(cmd.Tick(), dt=30 - 10 - notice.STOP_LEAD_S)  # deadline less the stop lead
    assert isinstance(h.records[-1], ev.PlanBegin) or any(
        isinstance(r, ev.GpusReclaimed) for r in h.records[-3:]
    )
    stops = [c for c in h.pending if isinstance(c, cmd.StopWorker)]
    assert {c.worker for c in stops} == leaving and all(c.keep_partial for c in stops)
    h.settle()
    assert not leaving & set(h.table.workers)
    assert not h.table.leaving_gpus and not {8, 9, 10, 11} & h.table.present_gpus
    # The switch was made at the notice: the reclaim changed no role.
    p = [r for r in h.records if isinstance(r, ev.PlanBegin)][-1]
    assert p.cause == "return" and {s.op for s in p.steps} == {StepOp.REMOVE}


def test_the_clouds_reclaim_after_the_deadline_is_the_same_reclaim() -> None:
    # The deadline reclaimed GPUs 8-9; the cloud's own gpus-reclaimed then arrives: it is
    # acknowledged and changes nothing. A second one, or one after the GPUs came back and left
    # for good, is an error again.
    h = grown()
    h.send(ev.GpusReclaiming(gpus=(8, 9), deadline=h.wall + 30))
    h.settle()
    h.send(cmd.Tick(), dt=30 - notice.STOP_LEAD_S)
    h.settle()
    before = len(h.records)
    h.send(ev.GpusReclaimed(gpus=(8, 9)), dt=1)
    assert len(h.records) == before and {8, 9}.isdisjoint(h.table.present_gpus)
    with pytest.raises(InvalidEvent, match="not present"):
        h.send(ev.GpusReclaimed(gpus=(8,)), dt=1)


def test_reclaim_before_the_deadline_ends_the_notice() -> None:
    h = grown()
    h.send(ev.GpusReclaiming(gpus=(8, 9), deadline=h.wall + 120))
    h.settle()
    h.send(ev.GpusReclaimed(gpus=(8, 9)), dt=5)
    h.settle()
    assert not h.table.leaving_gpus and {8, 9}.isdisjoint(h.table.present_gpus)
    assert len(h.table.routable()) == 3


def test_withdrawn_notice_returns_the_workers_to_service() -> None:
    h = grown()
    leaving = {on(h, 8), on(h, 10)}
    h.send(ev.GpusReclaiming(gpus=(8, 9, 10, 11), deadline=h.wall + 60))
    h.settle()
    h.send(ev.GpusReclaimCancelled(gpus=(8, 9, 10, 11)), dt=5)
    h.settle()
    assert leaving <= {w.id for w in h.table.routable()}
    assert len(h.table.routable()) == 4 and not h.table.leaving_gpus
    h.send(cmd.Tick(), dt=120)  # the old deadline passes: nothing happens
    assert {8, 9, 10, 11} <= h.table.present_gpus


def test_a_joiner_on_noticed_gpus_never_serves_and_leaves_at_the_deadline() -> None:
    h = Clocked()
    h.settle()
    h.send(ev.GpusAdded(gpus=(8, 9, 10, 11)))
    joiner = next(c.worker for c in h.pending if isinstance(c, cmd.StartWorker) and 8 in c.gpus)
    h.send(ev.GpusReclaiming(gpus=(8, 9), deadline=h.wall + 30))
    h.settle()  # its host comes up meanwhile: not admitted
    assert all(8 not in w.gpus for w in h.table.routable()) and len(h.table.routable()) == 3
    h.send(cmd.Tick(), dt=31)
    h.settle()
    assert joiner not in h.table.workers and {8, 9}.isdisjoint(h.table.present_gpus)


def test_recovery_restores_pending_notices_and_their_deadlines() -> None:
    h = grown()
    deadline = h.wall + 30
    h.send(ev.GpusReclaiming(gpus=(8, 9), deadline=deadline))
    h.settle()
    table = replay(h.records)
    assert dict(table.leaving_gpus) == {8: deadline, 9: deadline}
    # pearld restarts 5 s later: the notice is pending, its worker is not taken for failed.
    out = h.ctl.recover(table=table, profile=prior_profile(CFG), now=100.0, wall=deadline - 25)
    assert on(h, 8) not in out.state.failed
    # ... and after the deadline passed while it was down, the first tick reclaims.
    out = h.ctl.recover(table=table, profile=prior_profile(CFG), now=100.0, wall=deadline + 5)
    out = h.ctl.handle(s=out.state, event=cmd.Tick(), now=100.1, wall=deadline + 5.1)
    assert any(isinstance(r, ev.GpusReclaimed) and 8 in r.gpus for r in out.records)
    assert not out.state.table.leaving_gpus


def test_leaving_worker_that_restarts_is_not_readmitted() -> None:
    h = grown()
    wid = on(h, 8)
    h.send(ev.GpusReclaiming(gpus=(8, 9), deadline=h.wall + 60))
    h.settle()
    inc = h.table.workers[wid].incarnation
    h.send(cmd.WorkerDown(worker=wid, incarnation=inc, reason="crashed"))
    h.send(cmd.WorkerUp(worker=wid, incarnation=inc))
    assert h.table.workers[wid].activity is Activity.TRANSITIONING


# -- the pure rules ----------------------------------------------------------------------------


def test_parse_duration() -> None:
    assert notice.parse_duration("30s") == 30.0
    assert notice.parse_duration("2m") == 120.0
    assert notice.parse_duration("90") == 90.0
    assert notice.parse_duration("1.5m") == 90.0
    assert notice.parse_duration("500ms") == 0.5
    with pytest.raises(InvalidNotice, match="expected a duration such as 30s"):
        notice.parse_duration("soon")


def test_turns_that_finish_before_the_deadline_stay_the_rest_migrate() -> None:
    turns = {"a": 100.0, "b": 108.0, "c": 111.0}
    # turn time 10 s, deadline 120 (cutoff 119): a ends 110, b 118 (stay), c 121 (migrate)
    assert notice.to_migrate(turns=turns, turn_s=10.0, deadline=120.0, now=111.5, lead=0.5) == ["c"]
    assert notice.to_migrate(turns=turns, turn_s=10.0, deadline=120.0, now=119.0, lead=0.5) == [
        "a",
        "b",
        "c",
    ]
    assert notice.to_migrate(turns={}, turn_s=10.0, deadline=120.0, now=100.0) == []


def test_turn_seconds_follows_eq1_turn_term() -> None:
    p = prior_profile(CFG)
    one, many = notice.turn_seconds(p, 1), notice.turn_seconds(p, 16)
    assert 0 < one < many
    assert notice.worker_deadline((8, 9), {9: 5.0, 8: 7.0}) == 5.0
    assert notice.worker_deadline((4, 5), {9: 5.0}) is None
