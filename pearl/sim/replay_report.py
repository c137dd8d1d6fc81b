"""Recorded vs counterfactual: per-step throughput, the comparison document, the printed table.

Throughput is (generated tokens) / (rollout makespan) over the rollout steps the log holds. A
step's tokens are B S r from its telemetry (S is the slowest trajectory's turns, so this bounds
the batch from above; it is the same for every policy and cancels out of the ratios). The
recorded makespan is the measured one; a counterfactual's is the measured one scaled by eq. 1-3:
``measured x T(counterfactual) / T(recorded)``, each T the makespan the step's profile predicts
for the workers that served during the step (time-weighted rates over the configurations held,
a worker being re-roled serving nothing). A log without telemetry has no measured makespans:
every figure is then eq. 1-3's on the config's priors, over the training steps it records.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pearl.core import events as ev
from pearl.core.makespan import T_coloc, T_dis
from pearl.core.policy import Policy
from pearl.core.profile import WorkloadProfile
from pearl.sim.counterfactual import Replayed
from pearl.sim.fromlog import Config, Recorded, Summary


@dataclass(frozen=True)
class RolloutStep:
    step: int
    t0: float
    t1: float
    measured_s: float | None  # None: no telemetry (model only)
    tokens: float
    profile: WorkloadProfile  # the tracker's fit after this step


def rollout_steps(rec: Recorded, policy: Policy, prior: WorkloadProfile) -> list[RolloutStep]:
    """The recorded rollout steps with the profile the tracker held after each (§4.3.2)."""
    out: list[RolloutStep] = []
    profile = prior
    tel = [(s, r) for s, r in rec.records if isinstance(r, ev.Telemetry)]
    for seq, r in tel:
        profile = policy.observe(profile, r)
        t1 = rec.times[seq]
        span = r.makespan_s if r.makespan_s > 0 else None
        t0 = t1 - span if span else (out[-1].t1 if out else 0.0)
        out.append(
            RolloutStep(
                step=r.step,
                t0=t0,
                t1=t1,
                measured_s=span,
                tokens=r.batch * r.S * r.r,
                profile=profile,
            )
        )
    if tel:
        return out
    t0 = rec.times.get(rec.start, 0.0)
    for seq, r in rec.records:
        if isinstance(r, ev.TrainingBegin) and seq >= rec.start:
            t1 = rec.times[seq]
            out.append(
                RolloutStep(
                    step=r.step,
                    t0=t0,
                    t1=t1,
                    measured_s=None,
                    tokens=prior.B * prior.S * prior.r,
                    profile=prior,
                )
            )
            t0 = t1
    return out


def model_s(p: WorkloadProfile, c: Config) -> float:
    """Eq. 1-3 for the workers of ``c`` (inf when they cannot serve a batch)."""
    if c.P and c.D and not c.C:
        return float(T_dis(p, c.P, c.D))
    if c.C and not (c.P or c.D):
        return float(T_coloc(p, c.C))
    if c.C and c.P and c.D:  # mid-switch: both pools serve; colocation bounds it
        return float(T_coloc(p, c.C + c.P + c.D))
    return math.inf


def predicted_s(
    p: WorkloadProfile, timeline: list[tuple[float, Config]], t0: float, t1: float
) -> float:
    """The makespan over [t0, t1] at the time-weighted rate of the configurations held."""
    if t1 <= t0:
        return model_s(p, _at(timeline, t1))
    rate = 0.0
    for i, (t, c) in enumerate(timeline):
        end = timeline[i + 1][0] if i + 1 < len(timeline) else math.inf
        lo, hi = max(t, t0), min(end, t1)
        if hi > lo:
            T = model_s(p, c)
            rate += (hi - lo) / T if T > 0 and math.isfinite(T) else 0.0
    rate /= t1 - t0
    return 1.0 / rate if rate > 0 else math.inf


def _at(timeline: list[tuple[float, Config]], t: float) -> Config:
    cur = timeline[0][1]
    for ts, c in timeline:
        if ts > t:
            break
        cur = c
    return cur


def throughput(
    steps: list[RolloutStep], run: Summary, recorded: Summary | None = None
) -> dict[str, Any]:
    """Per-step makespans and the mean throughput of ``run`` (``recorded`` None: it is the
    recorded run itself)."""
    rows, tokens, seconds = [], 0.0, 0.0
    for st in steps:
        own = predicted_s(p=st.profile, timeline=run.timeline, t0=st.t0, t1=st.t1)
        if st.measured_s is None:
            span = own
        elif recorded is None:
            span = st.measured_s
        else:
            base = predicted_s(p=st.profile, timeline=recorded.timeline, t0=st.t0, t1=st.t1)
            span = st.measured_s * own / base if math.isfinite(base) and base > 0 else own
        rows.append({"step": st.step, "t_s": round(st.t1, 3), "makespan_s": _num(span)})
        tokens += st.tokens
        seconds += span
    tput = tokens / seconds if steps and 0 < seconds < math.inf else None
    return {"throughput_tok_s": _num(tput), "per_step": rows}


def _num(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else round(x, 3)


def run_doc(s: Summary, tput: dict[str, Any]) -> dict[str, Any]:
    return {
        "throughput_tok_s": tput["throughput_tok_s"],
        "mode_changes": s.mode_changes,
        "ratio_changes": s.ratio_changes,
        "plans": s.plans,
        "borrow_windows": [
            {"from_s": round(a, 3), "to_s": round(b, 3), "workers": n}
            for a, b, n in s.borrow_windows
        ],
        "role_changes": s.role_changes,
        "aborted_plans": s.aborted,
        "per_step": tput["per_step"],
    }


def document(
    rec: Recorded,
    recorded: Summary,
    runs: dict[str, Replayed],
    steps: list[RolloutStep],
    notes: list[str],
) -> dict[str, Any]:
    """``{"recorded": {...}, "policies": {NAME: {...}}, ...}`` (the ``--json`` document)."""
    rec_t = throughput(steps, recorded)
    doc: dict[str, Any] = {
        "log": rec.path,
        "clock": rec.clock,
        "profile": "telemetry" if rec.telemetry else "priors",
        "notes": notes,
        "recorded": run_doc(recorded, rec_t),
        "policies": {},
    }
    base = rec_t["throughput_tok_s"]
    for name, r in runs.items():
        d = run_doc(r.summary, throughput(steps, r.summary, recorded))
        tp = d["throughput_tok_s"]
        d["vs_recorded"] = round(tp / base - 1.0, 4) if tp is not None and base else None
        d["same_decisions"] = r.summary.decisions() == recorded.decisions()
        d["diverged_at_s"] = None if r.diverged_at is None else round(r.diverged_at, 3)
        d["errors"] = r.errors[:20]
        doc["policies"][name] = d
    return doc


def render(doc: dict[str, Any]) -> str:
    """Side by side: recorded, then each policy, one row per measure."""
    cols = {"recorded": doc["recorded"], **doc["policies"]}
    unit = "s" if doc["clock"] == "telemetry" else "records"
    rows: list[tuple[str, list[str]]] = [
        ("throughput tok/s", [_f(c["throughput_tok_s"]) for c in cols.values()]),
        ("vs recorded", ["-"] + [_pct(c["vs_recorded"]) for c in doc["policies"].values()]),
        ("plans", [str(len(c["plans"])) for c in cols.values()]),
        ("mode changes", [str(len(c["mode_changes"])) for c in cols.values()]),
        ("ratio changes", [str(len(c["ratio_changes"])) for c in cols.values()]),
        ("role changes", [str(c["role_changes"]) for c in cols.values()]),
        ("aborted plans", [str(c["aborted_plans"]) for c in cols.values()]),
        ("borrow windows", [str(len(c["borrow_windows"])) for c in cols.values()]),
        (
            "borrowed " + unit,
            [_f(sum(w["to_s"] - w["from_s"] for w in c["borrow_windows"])) for c in cols.values()],
        ),  # fmt: skip
        (
            "same decisions",
            ["-"]
            + [
                "yes" if c["same_decisions"] else f"no, from {_f(c['diverged_at_s'])} {unit}"
                for c in doc["policies"].values()
            ],
        ),  # fmt: skip
    ]
    names = list(cols)
    w0 = max(len(r[0]) for r in rows)
    widths = [max(len(n), *(len(r[1][i]) for r in rows)) for i, n in enumerate(names)]
    lines = ["  ".join([" " * w0, *(n.rjust(w) for n, w in zip(names, widths, strict=True))])]
    for label, vals in rows:
        lines.append(
            "  ".join([label.ljust(w0), *(v.rjust(w) for v, w in zip(vals, widths, strict=True))])
        )
    for name, c in cols.items():
        modes = " -> ".join(f"{m['mode']}@{_f(m['t_s'])}" for m in c["mode_changes"][:8])
        ratios = " -> ".join(f"{r['ratio']}@{_f(r['t_s'])}" for r in c["ratio_changes"][:8])
        more = "" if len(c["mode_changes"]) <= 8 else " ..."
        lines.append(f"{name}: modes {modes or '-'}{more}; ratios {ratios or '-'}")
    return "\n".join(lines)


def _f(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.1f}%"


__all__ = [
    "RolloutStep",
    "compare",
    "document",
    "model_s",
    "predicted_s",
    "render",
    "rollout_steps",
    "throughput",
]


def compare(
    rec: Recorded, own: Policy, prior: WorkloadProfile, names: list[str]
) -> tuple[dict[str, Any], dict[str, Summary]]:
    """Replay ``rec`` under every named policy; the ``--json`` document and every run's summary
    (``recorded`` first) for the plots."""
    from pearl.sim.counterfactual import choice, recorded_summary, replay

    notes = []
    if not rec.telemetry:
        notes.append(
            "the log holds no telemetry: the profile is the config's priors and every "
            "throughput is eq. 1-3's prediction"
        )
    if rec.clock == "sequence":
        notes.append("the log holds no measured makespans: times count records, not seconds")
    failed = sum(isinstance(r, ev.WorkerFailed) for _, r in rec.records)
    if failed:
        notes.append(f"{failed} worker failures in the log are not replayed")
    recorded = recorded_summary(rec)
    runs: dict[str, Replayed] = {}
    for name in names:
        key, policy, elastic = choice(name, own)
        runs[key] = replay(rec=rec, name=key, policy=policy, elastic=elastic, prior=prior)
    steps = rollout_steps(rec, own, prior)
    doc = document(rec=rec, recorded=recorded, runs=runs, steps=steps, notes=notes)
    return doc, {"recorded": recorded, **{k: r.summary for k, r in runs.items()}}
