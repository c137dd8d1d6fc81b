"""A pearld state dir's event log as the input of a counterfactual replay.

The log is the single source of truth: it holds the elastic events (``gpus-added``,
``gpus-reclaimed``, ``training-begin``/``-finished``, ``weights-published``), the telemetry that
fed the Runtime Tracker, and everything the controller decided (plans, steps, roles). This module
splits it into the *inputs* a replay feeds a controller and the *outputs* to compare with, and
summarises any record stream (recorded or replayed) as plans, mode and ratio changes, borrow
windows and per-step throughput.

Records carry no wall-clock time, so times are reconstructed: rollout steps ran back to back,
each telemetry record closing a step ``makespan_s`` after the previous one, and the records between
two telemetry records are spread evenly over that step. A log without telemetry has no clock at
all; its time unit is then one record (``clock == "sequence"``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pearl.core import events as ev
from pearl.core.errors import LogCorrupted, LogError
from pearl.core.fold import apply_to, replay
from pearl.core.state import ClusterState, Mode, Role, Zone
from pearl.log.file import FileLog
from pearl.log.segments import log_dir
from pearl.log.verify import verify

# What the world tells the controller; everything else in the log is what it answered.
INPUTS: tuple[type[ev.LogRecord], ...] = (*ev.ELASTIC_EVENTS, ev.WeightsPublished, ev.Telemetry)
# Inputs about preemptible GPUs: a fixed pool (ROLL) ignores them.
PREEMPTIBLE = tuple(k for k in INPUTS if k.KIND.startswith("gpus-"))


@dataclass(frozen=True)
class Recorded:
    """One log: every record with its reconstructed time, and where the controller began."""

    path: str
    records: tuple[tuple[int, Any], ...]  # (seq, record), seq 1.. in order
    times: dict[int, float]  # seq -> reconstructed seconds
    clock: str  # "telemetry" (seconds from measured makespans) or "sequence" (one per record)
    start: int  # records 1..start-1 are set-up (cluster-init and inputs before any decision)

    @property
    def init(self) -> ClusterState:
        """The table before the controller's first answer (what pearld recovered at start)."""
        return replay(r for s, r in self.records if s < self.start)

    @property
    def telemetry(self) -> list[ev.Telemetry]:
        return [r for _, r in self.records if isinstance(r, ev.Telemetry)]

    @property
    def inputs(self) -> list[tuple[int, Any]]:
        return [(s, r) for s, r in self.records if s >= self.start and isinstance(r, INPUTS)]

    @property
    def outputs(self) -> list[tuple[int, Any]]:
        return [(s, r) for s, r in self.records if s >= self.start and not isinstance(r, INPUTS)]

    @property
    def end(self) -> float:
        return self.times[self.records[-1][0]] if self.records else 0.0


def read(path: str | os.PathLike[str]) -> Recorded:
    """Verify and read a log (a pearld state dir or its ``log/``) without changing it.

    A log ``pearl log verify`` rejects is refused here with the same error: damage that stops
    opening raises :class:`LogCorrupted` from the reader, a torn tail (which a writer would
    repair) is raised with verify's verdict."""
    path = log_dir(str(path))  # the same rule as ``pearl log``: DIR or DIR/log
    try:
        verdict = verify(path)
        if not verdict.ok:
            raise LogCorrupted(str(verdict))
        with FileLog(path, readonly=True) as log:
            records = tuple(log.read())
    except OSError as e:  # as ``pearl log`` words it
        raise LogError(f"{e.filename or path}: {e.strerror or e}") from None
    if not records or not isinstance(records[0][1], ev.ClusterInit):
        raise LogCorrupted(f"{path}: the log does not begin with cluster-init; nothing to replay")
    start = next((s for s, r in records[1:] if not isinstance(r, INPUTS)), records[-1][0] + 1)
    times, clock = reconstruct_times(records)
    return Recorded(path=path, records=records, times=times, clock=clock, start=start)


def reconstruct_times(records: Sequence[tuple[int, Any]]) -> tuple[dict[int, float], str]:
    """Seconds for every record: telemetry k at the sum of makespans up to k, records between
    spread evenly (see the module docstring); by sequence number when there is no telemetry."""
    anchors = [
        (i, r.makespan_s)
        for i, (_, r) in enumerate(records)
        if isinstance(r, ev.Telemetry) and r.makespan_s > 0
    ]
    if not anchors:
        return {s: float(s) for s, _ in records}, "sequence"
    times: dict[int, float] = {}
    prev_i, prev_t = -1, 0.0
    for i, span in anchors:
        t = prev_t + span
        for j in range(prev_i + 1, i + 1):
            times[records[j][0]] = prev_t + span * (j - prev_i) / (i - prev_i)
        prev_i, prev_t = i, t
    # After the last step: the pace of the steps before.
    per_record = prev_t / (prev_i + 1)
    for j in range(prev_i + 1, len(records)):
        times[records[j][0]] = prev_t + per_record * (j - prev_i)
    return times, "telemetry"


# -- summaries of a record stream -------------------------------------------------------------

# Records after which the routable set or the plan in flight may differ.
_MOVES = (ev.ActivityChanged, ev.WorkerRemoved, ev.RoleChanged, ev.PlanCommit, ev.PlanAbort)


@dataclass(frozen=True)
class Config:
    """The routable rollout workers by role: what serves at one moment."""

    P: int
    D: int
    C: int
    overlap: int  # of them on borrowed training GPUs

    @property
    def mode(self) -> str:
        if self.P or self.D:
            return Mode.DISAGGREGATED.value
        return Mode.COLOCATED.value if self.C else "none"

    @property
    def ratio(self) -> str:
        return f"{self.P}P{self.D}D" if self.mode == Mode.DISAGGREGATED.value else f"{self.C}C"


def config_of(table: ClusterState) -> Config:
    n = {Role.PREFILL: 0, Role.DECODE: 0, Role.COLOCATED: 0}
    overlap = 0
    for w in table.routable():
        n[w.role] += 1
        overlap += w.zone is Zone.OVERLAP
    return Config(P=n[Role.PREFILL], D=n[Role.DECODE], C=n[Role.COLOCATED], overlap=overlap)


@dataclass
class Summary:
    """What one run (recorded or replayed) did, in the terms the comparison prints."""

    plans: list[dict[str, Any]] = field(default_factory=list)
    mode_changes: list[dict[str, Any]] = field(default_factory=list)
    ratio_changes: list[dict[str, Any]] = field(default_factory=list)
    timeline: list[tuple[float, Config]] = field(default_factory=list)  # config from t on
    borrow_windows: list[tuple[float, float, int]] = field(default_factory=list)
    role_changes: int = 0
    aborted: int = 0

    def decisions(self) -> dict[str, list[Any]]:
        """The sequences self-replay must reproduce: modes, ratios and plans, without times."""
        return {
            "modes": [m["mode"] for m in self.mode_changes],
            "ratios": [r["ratio"] for r in self.ratio_changes],
            "plans": [(p["plan"], p["cause"], p["target"], p["steps"]) for p in self.plans],
        }


def summarize(table: ClusterState, stream: Iterable[tuple[float, Any]], end: float) -> Summary:
    """Fold ``stream`` ((time, record) in order) into ``table`` and note every change."""
    out = Summary()
    b = table.thaw()
    cur = config_of(table)
    out.timeline.append((0.0, cur))
    mode, ratio = cur.mode, cur.ratio  # the last serving ones: "none" mid-plan is no change
    borrow_from: float | None = 0.0 if cur.overlap else None
    peak = cur.overlap
    for t, r in stream:
        apply_to(b, r)
        if isinstance(r, ev.PlanBegin):
            out.plans.append(
                {
                    "t_s": round(t, 3),
                    "plan": r.plan,
                    "cause": r.cause,
                    "target": str(r.target),
                    "steps": [f"{s.op.value}:{s.worker}" for s in r.steps],
                }
            )
        elif isinstance(r, ev.PlanAbort):
            out.aborted += 1
        elif isinstance(r, ev.RoleChanged):
            out.role_changes += 1
        if not isinstance(r, _MOVES):
            continue
        table = b.freeze()
        new = config_of(table)
        if table.plan is None and new.mode != "none":  # settled: no plan half done
            if new.mode != mode:
                out.mode_changes.append({"t_s": round(t, 3), "mode": new.mode})
                mode = new.mode
            if new.mode == Mode.DISAGGREGATED.value and new.ratio != ratio:
                out.ratio_changes.append({"t_s": round(t, 3), "ratio": new.ratio})
                ratio = new.ratio
        if new == cur:
            continue
        if new.overlap and borrow_from is None:
            borrow_from, peak = t, new.overlap
        elif new.overlap:
            peak = max(peak, new.overlap)
        elif borrow_from is not None:
            out.borrow_windows.append((borrow_from, t, peak))
            borrow_from, peak = None, 0
        out.timeline.append((t, new))
        cur = new
    if borrow_from is not None:
        out.borrow_windows.append((borrow_from, end, peak))
    return out


__all__ = [
    "INPUTS",
    "PREEMPTIBLE",
    "Config",
    "Recorded",
    "Summary",
    "config_of",
    "read",
    "summarize",
]
