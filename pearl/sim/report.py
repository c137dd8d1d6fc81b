"""Text tables and the ``--json`` document of ``pearl simulate``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pearl.sim.availability import RESERVED_ROLLOUT_GPUS, Availability
from pearl.sim.result import RunResult

PAPER_VS_ROLL = {  # §6.2: PEARL / ROLL, the range over S1-S3
    "qwen3-8b": (2.17, 2.37),
    "qwen3-30b-a3b": (2.43, 2.79),
}
PAPER_VS_RLBOOST = {  # §6.2: PEARL over RLBoost+ per segment
    "qwen3-8b": {"S1": 0.059, "S2": 0.269, "S3": 0.106},
    "qwen3-30b-a3b": {"S1": 0.074, "S2": 0.363, "S3": 0.190},
}


def ratios(runs: Mapping[str, RunResult]) -> dict[str, float | None]:
    """Each policy's throughput over ROLL's (None without a ROLL run)."""
    base = runs.get("roll")
    if base is None or base.throughput <= 0:
        return {}
    return {name: r.throughput / base.throughput for name, r in runs.items()}


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def main_table(runs: Mapping[str, RunResult]) -> str:
    rel = ratios(runs)
    lines = [
        f"{'policy':<11} {'tok/s':>10} {'vs ROLL':>8} {'steps':>5} {'step s':>7} "
        f"{'rollout s':>9} {'train s':>7} {'viol':>4} {'late':>4} {'wall s':>6}"
    ]
    for name, r in runs.items():
        w = r.window()
        n = len(w)
        ratio = f"{rel[name]:.2f}x" if name in rel else "-"
        lines.append(
            f"{name:<11} {r.throughput:>10.0f} {ratio:>8} {n:>5} "
            f"{_mean([s.duration_s for s in w]):>7.0f} {_mean([s.rollout_s for s in w]):>9.0f} "
            f"{_mean([s.train_s for s in w]):>7.0f} {r.invariant_violations:>4} "
            f"{r.late_returns:>4} {r.wall_s:>6.1f}"
        )
    if "pearl" in runs and "rlboost+" in runs and runs["rlboost+"].throughput > 0:
        gain = runs["pearl"].throughput / runs["rlboost+"].throughput - 1
        lines.append(f"PEARL over RLBoost+: {100 * gain:+.1f}%")
    return "\n".join(lines)


def trace_summary(avail: Availability) -> dict[str, Any]:
    return {
        "source": avail.source,
        "duration_s": avail.duration_s,
        "mean_rollout_gpus": round(RESERVED_ROLLOUT_GPUS + avail.mean(), 3),
        "changes": len(avail.changes()),
        "min_rollout_gpus": RESERVED_ROLLOUT_GPUS + min(avail.gpus),
        "max_rollout_gpus": RESERVED_ROLLOUT_GPUS + max(avail.gpus),
    }


def document(
    model: str,
    avail: Availability,
    runs: Mapping[str, RunResult],
    extras: Mapping[str, Any] | None = None,
    seed: int = 0,
    segment: str | None = None,
) -> dict[str, Any]:
    """The ``--json`` document: {"policies": {NAME: {...}}, ...}."""
    rel = ratios(runs)
    doc: dict[str, Any] = {
        "model": model,
        "seed": seed,
        "segment": segment,
        "trace": trace_summary(avail),
        "policies": {name: r.to_json() | {"vs_roll": rel.get(name)} for name, r in runs.items()},
    }
    if "pearl" in runs and "rlboost+" in runs and runs["rlboost+"].throughput > 0:
        doc["pearl_over_rlboost"] = runs["pearl"].throughput / runs["rlboost+"].throughput - 1
    if model in PAPER_VS_ROLL:
        doc["paper"] = {
            "pearl_vs_roll_range": PAPER_VS_ROLL[model],
            "pearl_over_rlboost": PAPER_VS_RLBOOST[model].get(segment or ""),
        }
    for key, value in (extras or {}).items():
        doc[key] = value
    return doc


def ablation_table(abl: Mapping[int, Mapping[str, float]]) -> str:
    labels = [k for k in next(iter(abl.values())) if k != "roll_tok_s"]
    lines = [f"{'GPUs':>4} " + " ".join(f"{k[:22]:>22}" for k in labels)]
    for g, row in abl.items():
        lines.append(f"{g:>4} " + " ".join(f"{row[k]:>21.2f}x" for k in labels))
    return "\n".join(lines)


def ratio_table(rows: list[Mapping[str, Any]]) -> str:
    lines = [f"{'dedicated':>9} {'overlap':>7} {'selected':>9} {'best':>9} {'sel/best':>8}"]
    for r in rows:
        q = r["selected_vs_best"]
        lines.append(
            f"{r['dedicated_gpus']:>9} {'yes' if r['overlap'] else 'no':>7} "
            f"{r['selected']:>9} {r['empirical_best']:>9} "
            f"{'-' if q is None else f'{q:.3f}':>8}"
        )
    return "\n".join(lines)


def sensitivity_table(sens: Mapping[str, Any]) -> str:
    lines = []
    for kind in ("batch", "length"):
        for value, row in sens[kind].items():
            gain = row.get("gain")
            lines.append(
                f"{kind:>6} {value:>6}: PEARL {row['pearl']:>9.0f} tok/s, RLBoost+ "
                f"{row['rlboost+']:>9.0f} tok/s, "
                f"gain {'-' if gain is None else f'{100 * gain:+.1f}%'}"
            )
    return "\n".join(lines)


__all__ = [
    "PAPER_VS_RLBOOST",
    "PAPER_VS_ROLL",
    "ablation_table",
    "document",
    "main_table",
    "ratio_table",
    "ratios",
    "sensitivity_table",
    "trace_summary",
]
