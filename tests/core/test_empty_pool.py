"""No NaN or infinity leaves the core: every controller output crosses the API codec and reads
back equal, for an empty pool, a pool of one and a pool of borrowed workers only.

An empty pool is a normal state: its decision and the gate have no prediction (None, with the
reason), where ``inf`` would be JSON ``null`` and the API's own decoder would refuse it (issue 41:
pearld died on ``gpus-reclaimed`` of its last GPUs, and on every restart after).
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from actors.messages import StateChanged
from pearl import config
from pearl.core import commands as cmd
from pearl.core import events as ev
from pearl.core.decision import NO_PREDICTION
from pearl.core.policy import Borrow
from pearl.core.state import Activity, Zone
from pearl.core.status import ClusterStatus, status_of, status_plain
from pearl.core.view import cluster_status, cluster_view, status_json
from tests.core.test_controller import Harness
from transports.codec import Codec
from transports.protocol import Change, Snapshot, Status

CODEC = Codec()
SMALL = ["cluster.tp=1", "cluster.training_gpus=0-1", "cluster.preemptible_gpus=2-5"]


def cfg(*sets: str) -> config.Config:
    return config.load("configs/sim-32.toml", [*SMALL, *sets])


def finite_json(obj: Any) -> Any:
    """``obj`` as JSON types; raises ValueError on a NaN or an infinity anywhere in it."""
    return json.loads(json.dumps(msgspec.to_builtins(obj), allow_nan=False))


def across(msg: Any) -> Any:
    """``msg`` encoded by the API codec and decoded again (what a peer reads)."""
    return CODEC.decode(CODEC.encode(msg, id=1)).msg


class Checked(Harness):
    """A Harness that sends every controller output through the API codec as it comes."""

    def __init__(self, c: config.Config, borrow: Borrow) -> None:
        self.checked = 0
        self.statuses: list[ClusterStatus] = []
        super().__init__(borrow=borrow, cfg=c)

    def _take(self, out: Any) -> None:
        super()._take(out)
        for item in [*out.records, *out.commands]:
            finite_json(item)
            assert across(item) == item, type(item).__name__
        view = cluster_view(out.state, boot_id="b")
        finite_json(view)
        assert across(StateChanged(view=view)) == StateChanged(view=view)
        status = cluster_status(view)  # raised on an inf before issue 41's fix
        assert across(Status(payload=status)) == Status(payload=status)
        plain = finite_json(status)
        assert plain == status_plain(status)
        json.dumps(status_json(view), allow_nan=False)
        assert status_of(plain) == status  # what `pearl status --json` and `watch` decode
        for msg in (Snapshot(seq=out.state.table.seq, payload=plain), Change(seq=1, payload=plain)):
            assert across(msg) == msg
        d = out.state.last_decision
        if d is not None:
            json.dumps(d.to_json(), allow_nan=False)  # `pearl decide --json`
        self.statuses.append(status)
        self.checked += 1


def empty_pool(borrow: Borrow) -> Checked:
    """Preemptible GPUs only: all of them reclaimed, then training takes its GPUs back."""
    h = Checked(cfg("cluster.reserved_gpus=", "cluster.initial_preemptible="), borrow)
    h.send(ev.GpusAdded(gpus=(2, 3, 4, 5)))
    h.settle()
    assert len(h.table.routable()) >= 4
    h.send(ev.GpusReclaimed(gpus=(2, 3, 4, 5)), dt=1.0)
    h.settle()
    h.send(ev.TrainingBegin(step=1), dt=1.0)
    h.settle()
    return h


@pytest.mark.parametrize("borrow", list(Borrow))
def test_an_empty_pool_has_no_prediction_and_says_why(borrow: Borrow) -> None:
    h = empty_pool(borrow)
    assert h.table.routable() == []
    assert all(w.activity is Activity.INACTIVE for w in h.table.rollout_workers())
    s = h.statuses[-1]
    assert s.budget.workers == 0 and s.decision is not None
    assert s.decision.predicted_makespan_s is None and s.decision.reason == NO_PREDICTION
    # The status of every step in between crossed the codec too.
    assert h.checked >= 6
    h.send(
        ev.TrainingFinished(step=1, weights_version=1), dt=1.0
    )  # training idle again: lent or not, no crash
    h.settle()
    h.send(ev.GpusAdded(gpus=(2, 3)), dt=1.0)  # and it comes back
    h.settle()
    d = h.statuses[-1].decision
    assert d is not None and d.predicted_makespan_s is not None and d.predicted_makespan_s > 0


def test_a_pool_of_borrowed_workers_only_gates_without_infinity() -> None:
    """No dedicated worker: T_ded has no prediction, borrowing is the only capacity."""
    h = Checked(cfg("cluster.reserved_gpus=", "cluster.initial_preemptible="), Borrow.GATED)
    h.settle()
    h.send(ev.TrainingBegin(step=1), dt=1.0)
    h.settle()
    h.send(
        ev.TrainingFinished(step=1, weights_version=1), dt=1.0
    )  # the window opens: the gate runs on N_ded = 0
    h.settle()
    g = h.s.last_gate
    assert g is not None and g.T_ded is None and g.benefit_s is None and g.enabled
    assert g.T_full is not None and "no dedicated rollout worker" in g.reason
    rollout = h.table.rollout_workers()
    assert rollout and all(w.zone is Zone.OVERLAP for w in rollout)
    assert any(w.activity is Activity.ACTIVE for w in rollout)
    s = h.statuses[-1]
    assert s.gate == g and s.decision is not None and s.decision.predicted_makespan_s is not None


def test_a_pool_of_one() -> None:
    h = Checked(cfg("cluster.reserved_gpus=6", "cluster.initial_preemptible="), Borrow.GATED)
    h.settle()
    h.send(ev.TrainingBegin(step=1), dt=1.0)  # the borrowed workers go back
    h.settle()
    assert [w.gpus for w in h.table.routable()] == [(6,)]
    d = h.statuses[-1].decision
    assert d is not None and d.target == "1C" and d.predicted_makespan_s is not None
    h.send(ev.TrainingFinished(step=1, weights_version=1), dt=1.0)
    h.settle()
    h.settle()
    assert h.s.last_gate is not None and h.s.last_gate.T_ded is not None
    h.send(ev.TrainingBegin(step=2), dt=1.0)
    h.settle()
    # Its host is killed until its supervisor gives up (issue 41's second way to an empty pool).
    (one,) = h.table.routable()
    h.send(cmd.WorkerDown(worker=one.id, incarnation=one.incarnation, reason="exit -9"), dt=1.0)
    h.send(cmd.WorkerLost(worker=one.id, reason="4 restarts failed"), dt=1.0)
    h.settle()
    assert h.table.routable() == []
    d = h.statuses[-1].decision
    assert d is not None and d.predicted_makespan_s is None and d.reason == NO_PREDICTION
    h.send(
        ev.TrainingFinished(step=2, weights_version=2), dt=1.0
    )  # only borrowed workers left to gate on
    h.settle()
    g = h.s.last_gate
    assert g is not None and g.T_ded is None and g.benefit_s is None
