"""Plots of a demo run: throughput per step against available workers, role allocation over
time, predicted vs measured step makespan, training reward and held-out accuracy per step
(``reward.png``), and the one-look ``summary.png`` (workers, roles, throughput and reward on a
shared time axis); and the end-of-run summary table (PNG, matplotlib without a display)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pearl.demo.app import Sample, StepRecord, Timeline


def plots(
    out: Path,
    records: list[StepRecord],
    timeline: Timeline,
    evals: list[dict[str, Any]] | None = None,
) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths: list[Path] = []
    if records:
        fig, ax = plt.subplots(figsize=(8, 3.5))
        steps = [r.step for r in records]
        ax.bar(steps, [r.throughput_tok_s for r in records], color="#4477aa", label="throughput")
        ax.set_xlabel("training step")
        ax.set_ylabel("tokens/s (generated + trained)")
        ax2 = ax.twinx()
        ax2.step(
            steps,
            [r.workers for r in records],
            where="mid",
            color="#cc6677",
            label="routable workers",
        )
        ax2.set_ylabel("rollout workers")
        ax2.set_ylim(bottom=0)
        fig.legend(loc="upper left")
        ax.set_title("Throughput per step against available workers")
        paths.append(_save(fig, out / "throughput.png"))

    samples = list(timeline.samples)
    if samples:
        fig, ax = plt.subplots(figsize=(8, 3.5))
        t = [s.t for s in samples]
        ax.stackplot(
            t,
            [s.prefill for s in samples],
            [s.decode for s in samples],
            [s.colocated for s in samples],
            labels=["prefill", "decode", "colocated"],
            colors=["#ddaa33", "#228833", "#4477aa"],
            step="post",
        )
        ax.plot(
            t,
            [s.overlap for s in samples],
            color="black",
            lw=1,
            drawstyle="steps-post",
            label="of which borrowed (overlap)",
        )
        for s0, s1 in _spans(samples, "training"):
            ax.axvspan(s0, s1, color="grey", alpha=0.15, lw=0)
        ax.set_xlabel("seconds")
        ax.set_ylabel("active workers")
        ax.set_title("Role allocation over time (grey: training steps)")
        ax.legend(loc="upper left", fontsize=8)
        paths.append(_save(fig, out / "roles.png"))

    pairs = [
        (r.step, r.predicted_makespan_s, r.measured_makespan_s)
        for r in records
        if r.predicted_makespan_s is not None and r.measured_makespan_s is not None
    ]
    if pairs:
        fig, ax = plt.subplots(figsize=(8, 3.5))
        ax.plot([p[0] for p in pairs], [p[1] for p in pairs], "o-", label="predicted (eq. 1-3)")
        ax.plot([p[0] for p in pairs], [p[2] for p in pairs], "s-", label="measured")
        ax.set_xlabel("training step")
        ax.set_ylabel("rollout batch makespan (s)")
        ax.set_title("Predicted vs measured step makespan")
        ax.legend()
        paths.append(_save(fig, out / "makespan.png"))
    if records:
        paths.append(reward_plot(out / "reward.png", records, evals or []))
    if records or samples:
        paths.append(
            summary_plot(
                path=out / "summary.png", records=records, samples=samples, evals=evals or []
            )
        )
    return paths


def reward_plot(path: Path, records: list[StepRecord], evals: list[dict[str, Any]]) -> Path:
    """Mean training reward of every step and held-out accuracy where it was measured."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.5))
    steps = [r.step for r in records]
    ax.plot(
        steps,
        [r.reward for r in records],
        "o-",
        color="#4477aa",
        ms=4,
        label="training reward (mean of the step's batch)",
    )
    if evals:
        ax.plot(
            [e["step"] for e in evals],
            [e["accuracy"] for e in evals],
            "s--",
            color="#ee6677",
            label=f"held-out accuracy ({evals[0].get('tasks', '?')} tasks, greedy)",
        )
    ax.set_ylim(-0.03, 1.03)
    ax.set_xlabel("training step (0: the starting policy)")
    ax.set_ylabel("reward / accuracy (0-1)")
    ax.set_title("Does the policy learn? Training reward and held-out accuracy")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    return _save(fig, path)


def summary_plot(
    path: Path, records: list[StepRecord], samples: list[Sample], evals: list[dict[str, Any]]
) -> Path:
    """Available workers by kind, roles, throughput and reward on one time axis."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        4, 1, figsize=(9, 8.5), sharex=True, gridspec_kw={"height_ratios": [1, 1, 1, 1.1]}
    )
    t = [s.t for s in samples]
    ax = axes[0]
    if samples:
        ax.stackplot(
            t,
            [s.reserved for s in samples],
            [s.preemptible for s in samples],
            [s.overlap for s in samples],
            labels=["reserved", "preemptible (trace)", "borrowed from training"],
            colors=["#4477aa", "#ccbb44", "#aa3377"],
            step="post",
        )
    ax.set_ylabel("workers")
    ax.set_title("Available rollout workers by kind")
    ax.legend(loc="upper left", fontsize=7, ncol=3)
    ax = axes[1]
    if samples:
        ax.stackplot(
            t,
            [s.prefill for s in samples],
            [s.decode for s in samples],
            [s.colocated for s in samples],
            labels=["prefill", "decode", "colocated"],
            colors=["#ddaa33", "#228833", "#66ccee"],
            step="post",
        )
        for s0, s1 in _spans(samples, "training"):
            for a in axes:
                a.axvspan(s0, s1, color="grey", alpha=0.12, lw=0)
    ax.set_ylabel("workers")
    ax.set_title("Roles (PD mode and ratio); grey: training steps")
    ax.legend(loc="upper left", fontsize=7, ncol=3)
    ax = axes[2]
    ends = [r.end_s for r in records]
    if records:
        ax.step(ends, [r.throughput_tok_s for r in records], where="pre", color="#4477aa")
    ax.set_ylabel("tokens/s")
    ax.set_title("Throughput per step (generated + trained tokens)")
    ax = axes[3]
    if records:
        ax.plot(
            ends, [r.reward for r in records], "o-", ms=4, color="#4477aa", label="training reward"
        )
    at = {r.step: r.end_s for r in records}
    points = [(at.get(e["step"], 0.0 if e["step"] == 0 else None), e["accuracy"]) for e in evals]
    points = [(x, a) for x, a in points if x is not None]
    if points:
        ax.plot(
            [x for x, _ in points],
            [a for _, a in points],
            "s--",
            color="#ee6677",
            label="held-out accuracy",
        )
    ax.set_ylim(-0.03, 1.03)
    ax.set_ylabel("0-1")
    ax.set_title("Training reward and held-out accuracy")
    ax.legend(loc="lower right", fontsize=7)
    ax.set_xlabel("seconds since the job started")
    for a in axes:
        a.grid(alpha=0.3)
    return _save(fig, path)


_TRACE = re.compile(r"([+-])(\d+) preemptible")


def makespan_errors(
    records: list[dict[str, Any]], field: str = "predicted_makespan_s", first_step: int = 3
) -> list[float]:
    """predicted / measured - 1 of each step from ``first_step`` on (priors may rule before),
    ``field`` the prediction (``forecast_makespan_s``: the one made before the batch was handed
    out). Steps without a prediction or a measurement are left out."""
    out = []
    for r in records[first_step - 1 :]:
        predicted, measured = r.get(field), r.get("measured_makespan_s")
        if predicted is not None and measured:
            out.append(predicted / measured - 1)
    return out


def _quarter_means(values: list[float]) -> tuple[float, float] | None:
    if not values:
        return None
    q = max(1, len(values) // 4)
    return sum(values[:q]) / q, sum(values[-q:]) / q


def summary_table(report: dict[str, Any]) -> str:
    """The end-of-run story in a few lines: learning, throughput, elasticity, the model."""
    recs = report.get("records", [])
    rows: list[tuple[str, str]] = [("steps", f"{len(recs)} in {report.get('elapsed_s', 0):.0f} s")]
    rewards = [r["reward"] for r in recs]
    if (qm := _quarter_means(rewards)) is not None:
        rows.append(
            (
                "training reward",
                f"{qm[0]:.2f} -> {qm[1]:.2f} (mean of the first -> last "
                f"quarter of steps; step 1 {rewards[0]:.2f}, last "
                f"{rewards[-1]:.2f})",
            )
        )
    evals = report.get("evals") or []
    if evals:
        a, b = evals[0], evals[-1]
        rows.append(
            (
                "held-out accuracy",
                f"{a['accuracy']:.2f} -> {b['accuracy']:.2f} (step "
                f"{a['step']} -> {b['step']}; {b.get('tasks')} tasks, "
                "greedy)",
            )
        )
    rows.append(
        ("throughput", f"{report.get('throughput_tok_s', 0):.0f} tokens/s (generated + trained)")
    )
    configs = [(r["mode"], r["N_P"], r["N_D"], r["N_C"]) for r in recs]
    modes = sum(a[0] != b[0] for a, b in zip(configs, configs[1:], strict=False))
    ratios = sum(
        a[0] == b[0] == "disaggregated" and a[1] != b[1]
        for a, b in zip(configs, configs[1:], strict=False)
    )
    rows.append(("mode changes", f"{modes} between steps ({ratios} P/D ratio changes)"))
    for sw in report.get("switches") or []:  # each live mode switch and what it cost
        rows.append(
            (
                "mode switch",
                f"at {sw['at_s']:.0f} s {sw['from']} -> {sw['to']} in {sw['plan_s']:.1f} s; "
                f"{sw['migrated']} generations migrated, {sw['recomputed_tokens']} tokens "
                f"recomputed ({sw.get('decision') or sw.get('cause', '')})",
            )
        )
    joined = reclaimed = 0
    for _, what in report.get("events") or []:  # the trace driver's "+2 preemptible (...)"
        m = _TRACE.match(what)
        if m:
            n = int(m.group(2))
            joined, reclaimed = (
                (joined + n, reclaimed) if m.group(1) == "+" else (joined, reclaimed + n)
            )
    bw = report.get("borrow") or {}
    rows.append(
        (
            "elastic events",
            f"preemptible workers joined {joined}, reclaimed {reclaimed} "
            f"(trace); training slots lent in {bw.get('approved', 0)} of "
            f"{bw.get('windows', 0)} idle windows (served in "
            f"{bw.get('served', 0)})",
        )
    )
    groups = report.get("groups") or {}
    if groups:
        rows.append(
            (
                "trajectories",
                f"{groups.get('failed_trajectories', 0)} lost; GRPO groups "
                f"{groups.get('started', 0)} started, "
                f"{groups.get('delivered', 0)} trained on, "
                f"{groups.get('stale', 0)} dropped as too stale",
            )
        )
    errors = sorted(abs(e) for e in makespan_errors(recs))
    if errors:
        median = errors[len(errors) // 2]
        rows.append(
            (
                "makespan error",
                f"predicted vs measured: median {median:.0%}, max "
                f"{errors[-1]:.0%} (steps 3-{len(recs)})",
            )
        )
    ws = report.get("warm_start") or {}
    if ws.get("path"):
        how = (
            f"cached ({ws['seconds']:.1f} s)"
            if ws.get("cached")
            else f"trained now: {ws.get('steps')} steps in {ws['seconds']:.0f} s"
        )
        rows.append(
            ("warm start", f"{how}; validation reproduced {(ws.get('validation') or 0):.0%}")
        )
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"  {k:<{width}}  {v}" for k, v in rows)


def _spans(samples: list[Sample], phase: str) -> list[tuple[float, float]]:
    out, start = [], None
    for s in samples:
        if s.phase == phase and start is None:
            start = s.t
        elif s.phase != phase and start is not None:
            out.append((start, s.t))
            start = None
    if start is not None:
        out.append((start, samples[-1].t))
    return out


def _save(fig: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


__all__ = ["plots", "reward_plot", "summary_plot", "summary_table"]
