"""PNG reports like the paper's Figures 6, 7 and 8 and Table 2 (matplotlib, Agg backend)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pearl.sim.availability import RESERVED_ROLLOUT_GPUS
from pearl.sim.result import RunResult

COLORS = {"pearl": "tab:red", "rlboost+": "tab:blue", "roll": "tab:gray", "roll-large": "tab:green"}


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def role_timelines(runs: Mapping[str, Any], path: Path, unit: str = "s", title: str = "") -> Path:
    """Recorded and counterfactual role timelines on one axis: routable workers over time (solid),
    of them decode workers (dashed) and borrowed ones (dotted). ``runs`` maps a name to a
    :class:`pearl.sim.fromlog.Summary`; the recorded run is drawn black."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 4.2))
    end = max((s.timeline[-1][0] for s in runs.values() if s.timeline), default=1.0) or 1.0
    for i, (name, s) in enumerate(runs.items()):
        color = "black" if name == "recorded" else COLORS.get(name, f"C{i}")
        ts = [t for t, _ in s.timeline] + [end]
        cs = [c for _, c in s.timeline]
        cs.append(cs[-1])
        ax.step(ts, [c.P + c.D + c.C for c in cs], where="post", color=color, label=name)
        if any(c.D for c in cs):
            ax.step(ts, [c.D for c in cs], where="post", color=color, ls="--", lw=0.9)
        if any(c.overlap for c in cs):
            ax.step(ts, [c.overlap for c in cs], where="post", color=color, ls=":", lw=0.9)
    ax.set_xlabel(f"time ({unit})")
    ax.set_ylabel("routable workers (-- decode, : borrowed)")
    ax.legend(loc="best", fontsize=8)
    ax.set_title(title or "recorded vs counterfactual roles")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def per_step(runs: Mapping[str, RunResult], path: Path, title: str = "") -> Path:
    """Figure 6: per-step throughput over time against the GPU budget in the background."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 4.2))
    first = next(iter(runs.values()))
    avail = first.availability
    ax2 = ax.twinx()
    times = [*avail.times, avail.duration_s]
    ded = [RESERVED_ROLLOUT_GPUS + g for g in avail.gpus] + [RESERVED_ROLLOUT_GPUS + avail.gpus[-1]]
    m = [t / 60 for t in times]
    ax2.fill_between(m, 0, 16, step="post", color="0.92", label="training GPUs (16)")
    ax2.fill_between(
        m, 16, [16 + d for d in ded], step="post", color="0.82", label="dedicated rollout GPUs"
    )
    ax2.set_ylim(0, 34)
    ax2.set_ylabel("GPUs")
    ax.set_zorder(ax2.get_zorder() + 1)
    ax.patch.set_visible(False)
    for name, r in runs.items():
        w = r.window()
        ax.plot(
            [s.t_done / 60 for s in w],
            [s.throughput for s in w],
            marker="o",
            ms=3,
            color=COLORS.get(name),
            label=f"{name} ({r.throughput:.0f} tok/s)",
        )
    ax.set_xlabel("time (min)")
    ax.set_ylabel("per-step throughput (tok/s)")
    ax.set_xlim(0, avail.duration_s / 60)
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper left", fontsize=8)
    ax2.legend(loc="upper right", fontsize=8)
    ax.set_title(title or "Per-step system throughput (Figure 6)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def ablation(abl: Mapping[int, Mapping[str, float]], path: Path, title: str = "") -> Path:
    """Figure 7: each ablation step's throughput over ROLL at each fixed GPU count."""
    plt = _plt()
    labels = [k for k in next(iter(abl.values())) if k != "roll_tok_s"]
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(labels)
    for i, label in enumerate(labels):
        xs = [j + i * width for j in range(len(abl))]
        ax.bar(xs, [abl[g][label] for g in abl], width, label=label)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(abl))], [f"{g} GPUs" for g in abl])
    ax.axhline(1.0, color="k", lw=0.5)
    ax.set_ylabel("throughput / ROLL")
    ax.legend(fontsize=8)
    ax.set_title(title or "Ablation (Figure 7)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def ratio_selection(rows: list[Mapping[str, Any]], path: Path, title: str = "") -> Path:
    """Table 2: predicted-best ratio vs brute-force best, with every split's makespan."""
    plt = _plt()
    fig, axes = plt.subplots(1, len(rows), figsize=(3.2 * len(rows), 3.6), squeeze=False)
    for ax, r in zip(axes[0], rows, strict=True):
        names = list(r["makespans_s"])
        vals = [r["makespans_s"][n] for n in names]
        colors = [
            "tab:red" if n == r["selected"] else "tab:blue" if n == r["empirical_best"] else "0.7"
            for n in names
        ]
        ax.bar(range(len(names)), vals, color=colors)
        ax.set_xticks(range(len(names)), names, rotation=90, fontsize=6)
        ax.set_title(
            f"{r['dedicated_gpus']} GPUs{' + overlap' if r['overlap'] else ''}\n"
            f"sel {r['selected']} / best {r['empirical_best']}",
            fontsize=8,
        )
        ax.set_ylabel("rollout makespan (s)", fontsize=7)
    fig.suptitle(title or "PD ratio: selected (red) vs empirical best (blue) (Table 2)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def sensitivity(sens: Mapping[str, Any], path: Path, title: str = "") -> Path:
    """Figure 8: PEARL and RLBoost+ throughput across batch sizes and length limits."""
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    for ax, kind, label in (
        (axes[0], "batch", "rollout batch size"),
        (axes[1], "length", "max trajectory length (tokens)"),
    ):
        xs = list(sens[kind])
        for name in ("pearl", "rlboost+"):
            ax.plot(
                xs, [sens[kind][x][name] for x in xs], marker="o", color=COLORS[name], label=name
            )
        ax.set_xlabel(label)
        ax.set_ylabel("throughput (tok/s)")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    fig.suptitle(title or "Workload sensitivity (Figure 8)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


__all__ = ["ablation", "per_step", "ratio_selection", "sensitivity"]
