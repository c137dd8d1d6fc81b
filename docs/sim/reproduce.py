"""Regenerate every number in docs/results/simulator.md (about 10 minutes on 2 cores).

    .venv/bin/python docs/sim/reproduce.py [--workers 2] [--seeds 5] [--out docs/sim]

Writes results.json and the PNGs into --out and prints the markdown tables.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from pearl.core.policy import PD, Borrow
from pearl.sim import availability as av
from pearl.sim import experiments as ex
from pearl.sim import plots
from pearl.sim.agreement import lockstep, prediction_errors, uniform
from pearl.sim.calibration import evaluate, scale_out, table
from pearl.sim.implied import FORMS, rollout_time, segment_range
from pearl.sim.report import PAPER_VS_RLBOOST, PAPER_VS_ROLL
from pearl.sim.runner import Simulation
from pearl.sim.scenario import (
    CALIBRATED,
    MAIN_POLICIES,
    MODELS,
    POLICIES,
    PolicySpec,
    Scenario,
    scenario,
)

SEGS = ("S1", "S2", "S3")


def _scale1(sc: Scenario) -> Scenario:
    """The same deployment at roofline speed: engine, tools and training all k times faster
    (every calibrated ratio unchanged); only Table 3's latencies keep their seconds."""
    k = sc.engine.time_scale
    return dataclasses.replace(
        sc, engine=dataclasses.replace(sc.engine, time_scale=1.0),
        training=dataclasses.replace(sc.training, tokens_per_gpu_s=sc.training.tokens_per_gpu_s * k,
                                     fixed_s=sc.training.fixed_s / k))


def e2e(models: tuple[str, ...], seeds: int, workers: int, scale1: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for model in models:
        for seg in SEGS:
            avail = av.load(segment_name=seg)
            rows = []
            for seed in range(seeds):
                sc = scenario(model, seed=seed)
                runs = ex.compare(_scale1(sc) if scale1 else sc, avail, MAIN_POLICIES, workers)
                tp = {k: r.throughput for k, r in runs.items()}
                rows.append({
                    "throughput": tp,
                    "steps": {k: len(r.window()) for k, r in runs.items()},
                    "violations": sum(r.invariant_violations for r in runs.values()),
                    "late": sum(r.late_returns for r in runs.values()),
                    "max_wait_s": max(max(r.return_waits, default=0.0) for r in runs.values()),
                    "plans_pearl": len(runs["pearl"].plans),
                    "ops_pearl": runs["pearl"].ops,
                })
                if seed == 0 and not scale1:
                    plots.per_step(runs, OUT / f"per-step-{model}-{seg}.png", f"{model}, {seg}")
            out[f"{model}/{seg}"] = rows
            print(f"  {model} {seg} done", file=sys.stderr)
    return out


VARIANTS = {  # what PEARL's gain over RLBoost+ is made of
    "pearl": POLICIES["pearl"],
    "pd only (no borrowing)": PolicySpec("pd-only", PD.ADAPTIVE, Borrow.NEVER, True),
    "borrowing only (colocated)": PolicySpec("borrow-only", PD.COLOCATED, Borrow.GATED, True),
}


def decomposition(models: tuple[str, ...], seeds: int) -> dict[str, Any]:
    """Throughput over RLBoost+ of PEARL, PD-only and borrow-only, and the borrowing duty."""
    out: dict[str, Any] = {}
    for model in models:
        for seg in SEGS:
            avail = av.load(segment_name=seg)
            gains: dict[str, list[float]] = {k: [] for k in VARIANTS}
            duty = []
            for seed in range(seeds):
                sc = scenario(model, seed=seed)
                base = Simulation(sc, POLICIES["rlboost+"], avail).run().throughput
                for k, spec in VARIANTS.items():
                    r = Simulation(sc, spec, avail).run()
                    gains[k].append(r.throughput / base - 1)
                    if k == "pearl":
                        duty.append(_borrowed_share(r))
            out[f"{model}/{seg}"] = {k: statistics.mean(v) for k, v in gains.items()} | {
                "borrowed_share": statistics.mean(duty)}
    return out


def _gain(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.1f}%"


def implied(doc: dict[str, Any]) -> dict[str, Any]:
    """What §3.1, Table 3 and §6.2's pools imply for borrowing (pearl/sim/implied.py), beside
    the paper's figure and the simulator's (from the e2e and decomposition sections), and the
    simulator's colocated scale-out against the two readings of §3.1."""
    cal = CALIBRATED["qwen3-8b"]
    eng = dataclasses.replace(cal.engine, time_scale=1.0)
    rel = scale_out("qwen3-8b", (4, 5, 6, 7, 8, 12, 15, 16), cal.workload, eng)
    scaling = {2 * n: {"simulator": r} | {f: rollout_time(2 * n, f) for f in FORMS}
               for n, r in rel.items()}
    gains: dict[str, Any] = {}
    lines = ["| model | segment | mean pool | implied by §3.1 + Table 3 | paper (PEARL) | "
             "simulator PEARL | simulator borrowing only |", "|---|---|---:|---:|---:|---:|---:|"]
    for model in MODELS:
        for seg in SEGS:
            lo, hi = segment_range(seg, model)
            key = f"{model}/{seg}"
            rows = doc.get("e2e", {}).get(key, [])
            sim = statistics.mean(r["throughput"]["pearl"] / r["throughput"]["rlboost+"] - 1
                                  for r in rows) if rows else None
            dec = doc.get("decomposition", {}).get(key, {}).get("borrowing only (colocated)")
            gains[key] = {"least": lo.gain, "most": hi.gain, "paper": PAPER_VS_RLBOOST[model][seg],
                          "simulator_pearl": sim, "simulator_borrow_only": dec}
            lines.append(f"| {model} | {seg} | {lo.pool_gpus:.1f} | {_gain(lo.gain)} to "
                         f"{_gain(hi.gain)} | {_gain(PAPER_VS_RLBOOST[model][seg])} | "
                         f"{_gain(sim)} | {_gain(dec)} |")
    print("## Borrowing gain implied by the paper's own figures\n" + "\n".join(lines) + "\n")
    return {"scaling": scaling, "gains": gains}


def _borrowed_share(r: Any) -> float:
    """Share of the window during which overlap workers were routable."""
    tl, end, total = r.timeline, r.availability.duration_s, 0.0
    for (t0, _, ovl, _), nxt in zip(tl, [*tl[1:], (end, 0, 0, "")], strict=True):
        lo, hi = max(t0, 0.0), min(nxt[0], end)
        if hi > lo and ovl > 0:
            total += hi - lo
    return total / end


def _ms(xs: list[float]) -> str:
    m = statistics.mean(xs)
    return f"{m:.2f} ± {statistics.stdev(xs):.2f}" if len(xs) > 1 else f"{m:.2f}"


def _pct(xs: list[float]) -> str:
    m = statistics.mean(xs)
    return (f"{100 * m:+.1f}% ± {100 * statistics.stdev(xs):.1f}" if len(xs) > 1
            else f"{100 * m:+.1f}%")


def e2e_table(res: dict[str, Any]) -> str:
    lines = ["| model | segment | PEARL / ROLL (paper) | simulator | PEARL vs RLBoost+ (paper) | "
             "simulator | ROLL-Large / ROLL | RLBoost+ / ROLL | steps PEARL/ROLL |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for key, rows in res.items():
        model, seg = key.split("/")
        vs_roll = [r["throughput"]["pearl"] / r["throughput"]["roll"] for r in rows]
        vs_rlb = [r["throughput"]["pearl"] / r["throughput"]["rlboost+"] - 1 for r in rows]
        large = [r["throughput"]["roll-large"] / r["throughput"]["roll"] for r in rows]
        rlb = [r["throughput"]["rlboost+"] / r["throughput"]["roll"] for r in rows]
        lo, hi = PAPER_VS_ROLL[model]
        steps = f"{statistics.mean(r['steps']['pearl'] for r in rows):.1f}/" \
                f"{statistics.mean(r['steps']['roll'] for r in rows):.1f}"
        lines.append(
            f"| {model} | {seg} | {lo:.2f}–{hi:.2f}x | {_ms(vs_roll)}x | "
            f"{100 * PAPER_VS_RLBOOST[model][seg]:+.1f}% | {_pct(vs_rlb)} | {_ms(large)}x | "
            f"{_ms(rlb)}x | {steps} |")
    return "\n".join(lines)


def main() -> int:
    global OUT
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--out", default="docs/sim")
    ap.add_argument("--skip", default="", help="comma list of sections to skip")
    a = ap.parse_args()
    OUT = Path(a.out)
    OUT.mkdir(parents=True, exist_ok=True)
    skip = set(a.skip.split(","))
    t0 = time.time()
    path = OUT / "results.json"
    doc: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    if "calibration" not in skip:
        cal = CALIBRATED["qwen3-8b"]
        r = evaluate(cal.workload, dataclasses.replace(cal.engine, time_scale=1.0),
                     seeds=(0, 1, 2, 3), batches=3, workers=a.workers)
        r["train_s"] = 163.8 * 1.0  # by construction at the calibrated time_scale
        doc["calibration"] = r
        print("## Calibration\n" + table(r) + "\n")
    if "agreement" not in skip:
        # without tools (eq. 1 exact), and with them (every trajectory waits at once: the
        # simulator lies near the paper's sum, eq. 1's work + T_env; docs/pd.md)
        doc["lockstep"] = {f"{m}/{n}": lockstep(m, n, uniform(turns=6, batch=16, env_s=0.0))
                           for m in MODELS for n in (1, 2, 4, 8)}
        doc["lockstep_env"] = {f"{m}/{n}": lockstep(m, n, uniform(turns=6, batch=16))
                               for m in MODELS for n in (1, 2, 4, 8)}
        doc["prediction_errors"] = {
            m: prediction_errors(scenario(m), [(2, 0, 0), (4, 0, 0), (8, 0, 0), (12, 0, 0),
                                              (0, 2, 2), (0, 3, 5), (0, 4, 4), (0, 5, 7),
                                              (0, 4, 12)])
            for m in MODELS}
    if "e2e" not in skip:
        doc["e2e"] = e2e(MODELS, a.seeds, a.workers, scale1=False)
        print("## End to end\n" + e2e_table(doc["e2e"]) + "\n")
    if "scale1" not in skip:
        doc["e2e_scale1"] = e2e(MODELS, 1, a.workers, scale1=True)  # ~40x the events
        print("## End to end at time_scale 1\n" + e2e_table(doc["e2e_scale1"]) + "\n")
    if "decomposition" not in skip:
        doc["decomposition"] = decomposition(MODELS, min(a.seeds, 3))
    if "implied" not in skip:
        doc["implied"] = implied(doc)
    if "experiments" not in skip:
        for m in MODELS:
            sc = scenario(m)
            doc[f"ablation/{m}"] = ex.ablation(sc, workers=a.workers)
            plots.ablation(doc[f"ablation/{m}"], OUT / f"ablation-{m}.png", f"Ablation, {m}")
        sc = scenario("qwen3-8b")
        doc["ratio_selection"] = ex.ratio_selection(sc, workers=a.workers)
        plots.ratio_selection(doc["ratio_selection"], OUT / "ratio-qwen3-8b.png")
        doc["sensitivity"] = ex.sensitivity(sc, workers=a.workers)
        plots.sensitivity(doc["sensitivity"], OUT / "sensitivity-qwen3-8b.png")
    doc["wall_s"] = time.time() - t0
    path.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    print(f"wall {doc['wall_s']:.0f} s", file=sys.stderr)
    return 0


OUT = Path("docs/sim")

if __name__ == "__main__":
    sys.exit(main())
