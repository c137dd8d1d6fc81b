"""The main job, ``pearl demo``: asynchronous agentic RL on an elastic pool, end to end.
This module holds what a run records, predicts and reports; :mod:`pearl.demo.job` runs it.

PEARL runs in this process on the embedded default (``configs/local-cpu.toml``): worker hosts
serve a tiny Qwen3 on the torch engine, the Pipeline Scheduler runs the tool-use environment, the
demo trainer takes real GRPO steps and publishes every version, and a scaled Bamboo segment makes
preemptible workers come and go while training "GPUs" are borrowed between steps. A live line shows
mode, ratio, workers by role, step, throughput and the last event; at the end a report with plots
is written under ``runs/<time>/``.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pearl.core import events as ev
from pearl.core.borrow import Verdict
from pearl.core.profile import WorkloadProfile
from pearl.core.status import BorrowCycleStatus, ClusterStatus
from pearl.demo.live import Counts
from pearl.runtime import RuntimeStats

if TYPE_CHECKING:
    from pearl.config import Config
    from pearl.rl.pipeline import StepReport


@dataclass
class BorrowRecord:
    """The training-idle window before a step: what the borrowing gate said and what happened
    (seconds; None where it did not occur)."""

    window_s: float | None = None
    gate: Verdict = Verdict.NONE
    gate_reason: str = ""
    window_left_s: float | None = None
    lent: int = 0
    activated: int = 0
    activation_s: float | None = None
    served_s: float | None = None
    aborted: bool = False
    abort_reason: str | None = None
    returning: int = 0
    returned_after_s: float | None = None
    # Generations aborted while the step trained, resumed from their prefix elsewhere, and the
    # prompt tokens those resumptions prefilled again (:func:`count_cut_short`).
    migrated: int = 0
    recomputed_tokens: int = 0


@dataclass(kw_only=True)
class StepRecord:
    step: int
    end_s: float  # since the job started
    duration_s: float  # since the previous step ended (async: rollout overlaps training)
    wait_batch_s: float
    train_s: float
    return_s: float  # Training Begin -> every borrowed worker back
    generated_tokens: int
    trained_tokens: int
    throughput_tok_s: float
    reward: float
    loss: float
    version: int
    mode: str
    N_P: int
    N_D: int
    N_C: int
    workers: int  # routable when the batch was taken
    # Eq. 1-3 on the profile fitted from the steps before this one, for the workers and the
    # concurrency this batch really ran with (means over its span).
    predicted_makespan_s: float | None
    measured_makespan_s: float | None
    # The training-idle window before this step: what the borrowing gate said and what happened.
    borrow: BorrowRecord = field(default_factory=BorrowRecord)
    # The pure forecast, made before the batch was handed out: the same profile with its own
    # B_flight, for the configuration in place then.
    forecast_makespan_s: float | None = None
    in_flight: float | None = None  # B_flight of this batch: mean trajectories in flight
    mean_workers: dict[str, float] = field(default_factory=dict)  # by role, over its span


def borrow_record(cycle: BorrowCycleStatus | None) -> BorrowRecord:
    """A borrow cycle of ``pearl status`` as a report record (no cycle: nothing happened)."""
    if cycle is None:
        return BorrowRecord()
    return BorrowRecord(
        window_s=cycle.window_s,
        gate=cycle.gate,
        gate_reason=cycle.gate_reason,
        window_left_s=cycle.window_left_s,
        lent=cycle.lent,
        activated=cycle.activated,
        activation_s=cycle.activation_s,
        served_s=cycle.served_s,
        aborted=bool(cycle.aborted),
        abort_reason=cycle.aborted,
        returning=cycle.returning,
        returned_after_s=cycle.return_s,
    )


def migrated_between(
    moved: Sequence[tuple[float, int]], begin: float, end: float
) -> tuple[int, int]:
    """The generations aborted in [begin, end] and the prompt tokens prefilled again for them."""
    during = [n for t, n in moved if begin <= t <= end]
    return len(during), sum(during)


def count_cut_short(
    moved: Sequence[tuple[float, int]],
    records: list[StepRecord],
    training: list[tuple[float, float]],
) -> None:
    """Adds to each record's borrow the generations aborted while its step trained (Training
    Begin -> the step's end: the lent workers' return, and any worker removal then), each resumed
    from its prefix elsewhere, and the prompt tokens those resumptions prefilled again."""
    for r, (begin, end) in zip(records, training, strict=False):
        r.borrow.migrated, r.borrow.recomputed_tokens = migrated_between(moved, begin, end)


def borrow_summary(records: list[StepRecord]) -> dict[str, Any]:
    """Borrow windows of the run: how many the gate approved, and in how many lent workers
    really served, and how many plans Training Begin cut short."""
    windows = [r.borrow for r in records if r.borrow.window_s is not None]
    approved = [b for b in windows if b.gate is Verdict.APPROVED]
    served = [b for b in approved if (b.served_s or 0) > 0]
    return {
        "windows": len(windows),
        "approved": len(approved),
        "served": len(served),
        "served_fraction": len(served) / len(approved) if approved else None,
        "aborted_by_training_begin": sum(
            b.abort_reason == ev.AbortCause.TRAINING_BEGIN for b in windows
        ),
        "served_s": sum(b.served_s or 0.0 for b in windows),
        "migrated": sum(r.borrow.migrated for r in records),
        "recomputed_tokens": sum(r.borrow.recomputed_tokens for r in records),
    }


def returned_line(step: int, cycle: BorrowCycleStatus | None, waited_s: float) -> str:
    """What the return did, in words: never a return that did not happen."""
    n, why = (0, None) if cycle is None else (cycle.returning, cycle.aborted)
    back = f"back in {waited_s * 1e3:.0f} ms"
    if n and why:  # the plan had begun handing the GPUs over when it was cut short
        return (
            f"training step {step}: borrow cut short before serving ({why}); "
            f"{n} workers on their way in {back}"
        )
    if n:
        return f"training step {step}: {n} borrowed workers {back}"
    if why:
        return f"training step {step}: borrow cancelled before serving ({why})"
    return f"training step {step}: nothing was lent"


@dataclass(frozen=True)
class Sample:
    """One live-view sample: seconds since the job started, the workers then, the phase."""

    t: float
    prefill: int
    decode: int
    colocated: int
    overlap: int
    workers: int
    reserved: int
    preemptible: int
    phase: str

    @classmethod
    def of(cls, t: float, c: Counts, phase: str) -> Sample:
        return cls(t=t, **asdict(c), phase=phase)


@dataclass
class Timeline:
    """What the live view samples: time, roles, available workers, events."""

    t0: float
    samples: list[Sample] = field(default_factory=list)
    events: list[tuple[float, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def event(self, what: str) -> None:
        with self.lock:
            self.events.append((time.monotonic() - self.t0, what))

    def last_event(self) -> str:
        with self.lock:
            return self.events[-1][1] if self.events else ""


def predict(status: ClusterStatus) -> float | None:
    """The makespan eq. 1-3 predict for the current configuration from the current profile."""
    if status.profile is None:
        return None
    return predict_for(
        profile=status.profile, mode=status.mode, N_P=status.N_P, N_D=status.N_D, N_C=status.N_C
    )


def predict_for(
    profile: WorkloadProfile,
    mode: str,
    N_P: float,
    N_D: float,
    N_C: float,
    in_flight: float | None = None,
) -> float | None:
    """Eq. 1-3 on ``profile`` for a configuration, with B_flight replaced by ``in_flight`` when
    given."""
    import msgspec

    from pearl.core.makespan import T_coloc, T_dis

    p = profile
    if in_flight is not None and in_flight > 0:
        p = msgspec.structs.replace(p, B_flight=in_flight)
    if mode == "colocated":
        return float(T_coloc(p, N_C)) if N_C > 0 else None
    if N_P > 0 and N_D > 0:
        return float(T_dis(p, N_P, N_D))
    return None


def predict_batch(profile: WorkloadProfile | None, report: StepReport) -> float | None:
    """Eq. 1-3 for the workers (mean by role over the batch's span) and the concurrency
    (B_flight) the batch really ran with; the mode is the one most workers were in."""
    if profile is None:
        return None
    w = report.workers
    c, n_p, n_d = w.get("colocated", 0.0), w.get("prefill", 0.0), w.get("decode", 0.0)
    if c <= 0 and n_p + n_d <= 0:
        return None
    mode = "colocated" if c >= n_p + n_d else "disaggregated"
    return predict_for(
        profile=profile, mode=mode, N_P=n_p, N_D=n_d, N_C=c, in_flight=report.in_flight
    )


def virtual_devices(
    config: str | Path | None, overrides: tuple[str, ...] = ()
) -> tuple[tuple[str, ...], dict[str, Any]]:
    """The demo's virtual devices (:mod:`pearl.engines.device`): ``engine.torch.device_share`` as
    configured, else sized so that all slots together stay within 90% of the cores found. Returns
    the overrides that set it, and what it is (``slots``, ``share``, ``cores``, ``line``)."""
    from pearl import config as config_mod
    from pearl.engines.device import available_cores, default_share

    cfg = config_mod.load(config, list(overrides))
    c = cfg.cluster
    slots = len(c.training_gpus) + len(c.reserved_gpus) + len(c.preemptible_gpus)
    cores = available_cores()
    share = cfg.engine.torch.device_share
    if cfg.engine.kind is not config_mod.EngineKind.TORCH:
        line = f"virtual devices: none (engine.kind = {cfg.engine.kind})"
        return overrides, {"slots": slots, "share": None, "cores": cores, "line": line}
    sized = share is None
    if share is None:
        share = default_share(slots, cores)
        overrides = (*overrides, f"engine.torch.device_share={share}")
    line = (
        f"virtual devices: {slots} slots x {share:g} core = {slots * share:.3g} of {cores} cores"
        + (" (sized to this machine)" if sized else "")
    )
    return overrides, {"slots": slots, "share": share, "cores": cores, "line": line}


def mode_switches(stats: RuntimeStats, t0: float) -> list[dict[str, Any]]:
    """Each committed plan that changed the PD mode: when (s since the job started), from and to,
    plan begin -> commit, the generations it migrated (aborted and resumed from their prefix
    elsewhere) and the prompt tokens those resumptions prefilled again, and the decision's
    reason (its hysteresis arithmetic) and predicted makespan."""
    moved = stats.pipeline.migrations if stats.pipeline is not None else ()
    out = []
    for sp in stats.switches:
        end = sp.end if sp.end is not None else sp.begin
        migrated, recomputed = migrated_between(moved, sp.begin, end)
        out.append(
            {
                "at_s": sp.begin - t0,
                "from": str(sp.before),
                "to": str(sp.target),
                "plan_s": end - sp.begin,
                "migrated": migrated,
                "recomputed_tokens": recomputed,
                "cause": sp.cause,
                "decision": sp.decision,
                "predicted_s": sp.predicted_s,
            }
        )
    return out


def pipeline_counts(stats: RuntimeStats) -> dict[str, int]:
    """GRPO groups the pipeline started, delivered, dropped as stale, and lost to a failure."""
    p = stats.pipeline
    if p is None:
        return {}
    return {**p.groups, "failed_trajectories": p.failed_trajectories}


def write_report(
    out: Path,
    cfg: Config,
    records: list[StepRecord],
    timeline: Timeline,
    interrupted: bool,
    deaths: dict[str, int] | None = None,
    evals: list[dict[str, Any]] | None = None,
    learning: dict[str, Any] | None = None,
    groups: dict[str, int] | None = None,
    switches: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    from pearl.demo.report import plots

    total_tokens = sum(r.generated_tokens + r.trained_tokens for r in records)
    elapsed = records[-1].end_s if records else 0.0
    returns = [r.return_s for r in records]
    summary: dict[str, Any] = {
        "steps": len(records),
        "interrupted": interrupted,
        "elapsed_s": elapsed,
        "throughput_tok_s": total_tokens / elapsed if elapsed else 0.0,
        "mean_return_s": sum(returns) / len(returns) if returns else 0.0,
        "max_return_s": max(returns, default=0.0),
        "policy": {"pd": cfg.daemon.pd, "borrow": cfg.daemon.borrow},
        "device_share": cfg.engine.torch.device_share,  # of one core per slot; None: unthrottled
        # No fault is injected: every host declared dead for silence was a false alarm.
        "missed_heartbeats": (deaths or {}).get("missed heartbeats", 0),
        "host_deaths": deaths or {},
        "borrow": borrow_summary(records),
        "seed": cfg.rl.seed,
        # Held-out accuracy (0-1, greedy) after each evaluated step; step 0 = the starting policy.
        "evals": evals or [],
        "warm_start": learning or {},
        "groups": groups or {},  # failed: groups lost (a member's generation could not finish)
        "switches": switches or [],  # committed plans that changed the PD mode, with their cost
        "records": [asdict(r) for r in records],
        "timeline": [asdict(s) for s in timeline.samples],
        "events": timeline.events,
    }
    (out / "report.json").write_text(json.dumps(summary, indent=1))
    summary["plots"] = [
        str(p) for p in plots(out=out, records=records, timeline=timeline, evals=summary["evals"])
    ]
    return summary


__all__ = ["StepRecord", "Timeline", "write_report"]
