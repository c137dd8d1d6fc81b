"""Plots of a demo run: throughput per step against available workers, role allocation over
time, and predicted vs measured step makespan (PNG, matplotlib without a display)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plots(out: Path, records: list[Any], timeline: Any) -> list[Path]:
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
        t = [s["t"] for s in samples]
        ax.stackplot(
            t,
            [s["prefill"] for s in samples],
            [s["decode"] for s in samples],
            [s["colocated"] for s in samples],
            labels=["prefill", "decode", "colocated"],
            colors=["#ddaa33", "#228833", "#4477aa"],
            step="post",
        )
        ax.plot(
            t,
            [s["overlap"] for s in samples],
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
    return paths


def _spans(samples: list[dict[str, Any]], phase: str) -> list[tuple[float, float]]:
    out, start = [], None
    for s in samples:
        if s["phase"] == phase and start is None:
            start = s["t"]
        elif s["phase"] != phase and start is not None:
            out.append((start, s["t"]))
            start = None
    if start is not None:
        out.append((start, samples[-1]["t"]))
    return out


def _save(fig: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


__all__ = ["plots"]
