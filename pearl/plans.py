"""Every plan pearld began, timed: what a report needs to say what each mode switch cost.

The event log holds the plans (``plan-begin`` with its target, ``plan-commit``/``plan-abort``) but
no clock: it is replayed, not read as a timeline. :class:`PlanHistory` is fed, like the metrics,
by the Orchestrator after every logged change (the records just appended and the view after
them) and keeps, per plan, when it began and ended on this process's monotonic clock, its cause,
the configuration it left and the one it reached, and the decision behind it (the reason string
carries the hysteresis arithmetic: "best: 1P2D over 3C (gain 12.0% > 10.0%)").

:meth:`PlanHistory.switches` lists the committed plans that changed the PD mode; the demo report
joins them with the requests migrated and the tokens recomputed while each ran.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from pearl.core import events as ev
from pearl.core.state import Mode, Target
from pearl.core.view import ClusterView


@dataclass
class PlanSpan:
    """One plan: begun at ``begin`` (monotonic s), ended at ``end`` (None: still running)."""

    plan: int
    cause: str
    before: Target | None  # the configuration serving when it began (None: none yet)
    target: Target
    begin: float
    decision: str = ""  # the decision engine's reason ("" for a return: no decision)
    predicted_s: float | None = None  # the decision's predicted makespan of ``target``
    end: float | None = None
    outcome: str = ""  # "committed", "aborted: REASON", or "" while it runs

    @property
    def mode_switch(self) -> bool:
        """A committed plan that moved the cluster to the other PD mode (both sides non-empty)."""
        return (
            self.outcome == "committed"
            and self.before is not None
            and self.before.N > 0
            and self.target.N > 0
            and self.before.mode is not self.target.mode
        )

    @property
    def ratio_change(self) -> bool:
        b, t = self.before, self.target
        return (
            self.outcome == "committed"
            and b is not None
            and b.mode is t.mode is Mode.DISAGGREGATED
            and b.N_P != t.N_P
        )


class PlanHistory:
    """The plans of this pearld's life, in order (thread-safe; the Orchestrator feeds it)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, keep: int = 10_000) -> None:
        self.clock, self.keep = clock, keep
        self._lock = threading.Lock()
        self._plans: dict[int, PlanSpan] = {}
        self._serving: Target | None = None

    def committed(
        self,
        records: Sequence[ev.Record],
        view: ClusterView,
        received: float | None = None,
        append_s: float | None = None,
    ) -> None:
        """Records were appended and ``view`` is the state after them (the Metrics signature)."""
        now = self.clock()
        with self._lock:
            for rec in records:
                if isinstance(rec, ev.PlanBegin):
                    d = view.decision
                    own = d is not None and d.target == rec.target and rec.cause != "return"
                    self._plans[rec.plan] = PlanSpan(
                        plan=rec.plan,
                        cause=rec.cause,
                        before=self._serving,
                        target=rec.target,
                        begin=now,
                        decision=d.reason if own and d is not None else "",
                        predicted_s=d.predicted_makespan_s if own and d is not None else None,
                    )
                    if len(self._plans) > self.keep:
                        del self._plans[min(self._plans)]
                elif isinstance(rec, ev.PlanCommit | ev.PlanAbort):
                    span = self._plans.get(rec.plan)
                    if span is None:  # begun before this process (recovery): untimed
                        continue
                    span.end = now
                    if isinstance(rec, ev.PlanCommit):
                        span.outcome = "committed"
                        self._serving = span.target
                    else:
                        span.outcome = f"aborted: {rec.reason}"
            if self._serving is None and view.serving.N:
                self._serving = view.serving  # the configuration recovery or the first plan left

    def plans(self) -> list[PlanSpan]:
        with self._lock:
            return [PlanSpan(**vars(p)) for p in self._plans.values()]

    def switches(self) -> list[PlanSpan]:
        """Committed plans that changed the PD mode, in order."""
        return [p for p in self.plans() if p.mode_switch]


class CommitObserver(Protocol):
    """Told of every commit by the Orchestrator (:class:`pearl.metrics.Metrics`, a history)."""

    def committed(
        self,
        records: Sequence[ev.Record],
        view: ClusterView,
        received: float | None = None,
        append_s: float | None = None,
    ) -> None: ...


class Observers:
    """Fans the Orchestrator's ``committed`` call out to several observers (metrics, history)."""

    def __init__(self, *observers: CommitObserver | None) -> None:
        self.observers = [o for o in observers if o is not None]

    def committed(
        self,
        records: Sequence[ev.Record],
        view: ClusterView,
        received: float | None = None,
        append_s: float | None = None,
    ) -> None:
        for o in self.observers:
            o.committed(records, view, received, append_s)


__all__ = ["CommitObserver", "Observers", "PlanHistory", "PlanSpan"]
