"""PlanHistory: plans timed from the Orchestrator's commits; mode switches told apart from
ratio changes, returns and aborted plans."""

from __future__ import annotations

from itertools import count

from pearl.core import events as ev
from pearl.core.state import Mode, Target
from pearl.core.view import ClusterView, DecisionView
from pearl.plans import Observers, PlanHistory


def coloc(n: int) -> Target:
    return Target(mode=Mode.COLOCATED, N_P=0, N_D=0, N_C=n)


def split(p: int, d: int) -> Target:
    return Target(mode=Mode.DISAGGREGATED, N_P=p, N_D=d, N_C=0)


def feed(h: PlanHistory, plans: list[tuple[Target, str, str]]) -> None:
    """Each plan begins (its decision in the view), then commits or aborts."""
    ids = count(1)
    for target, cause, end in plans:
        plan = next(ids)
        view = ClusterView(
            decision=DecisionView(target=target, predicted_makespan_s=1.5, reason=f"best: {target}")
        )
        h.committed([ev.PlanBegin(plan=plan, cause=cause, target=target, steps=())], view)
        done = ev.PlanCommit(plan=plan) if end == "commit" else ev.PlanAbort(plan=plan, reason=end)
        h.committed([done], ClusterView())


def test_switches_are_committed_plans_that_change_the_mode() -> None:
    clock = iter(float(t) for t in range(100))
    h = PlanHistory(clock=lambda: next(clock))
    feed(
        h,
        [
            (coloc(2), "expand", "commit"),  # the first configuration: not a switch
            (split(1, 2), "expand", "commit"),  # a switch
            (split(2, 1), "rebalance", "commit"),  # a ratio change
            (coloc(3), "rebalance", "training-begin"),  # aborted: not a switch
            (split(1, 1), "return", "commit"),  # a return: no decision of its own
            (coloc(2), "rebalance", "commit"),  # a switch back
        ],
    )
    plans = h.plans()
    assert [p.outcome for p in plans] == [
        "committed",
        "committed",
        "committed",
        "aborted: training-begin",
        "committed",
        "committed",
    ]
    # The return takes a prefill worker away: 2P1D -> 1P1D is a ratio change too.
    assert [p.ratio_change for p in plans] == [False, False, True, False, True, False]
    switches = h.switches()
    assert [(str(p.before), str(p.target)) for p in switches] == [("2C", "1P2D"), ("1P1D", "2C")]
    assert all(p.end is not None and p.end - p.begin == 1.0 for p in switches)
    assert switches[0].decision == "best: 1P2D" and switches[0].predicted_s == 1.5
    assert plans[4].decision == "" and plans[4].predicted_s is None  # a return decides nothing


def test_a_plan_begun_before_this_process_is_not_timed() -> None:
    h = PlanHistory()
    h.committed([ev.PlanCommit(plan=7)], ClusterView())
    assert h.plans() == []


def test_observers_fan_out_and_skip_none() -> None:
    a, b = PlanHistory(), PlanHistory()
    o = Observers(a, None, b)
    o.committed([ev.PlanBegin(plan=1, cause="expand", target=coloc(1), steps=())], ClusterView())
    assert len(a.plans()) == len(b.plans()) == 1
