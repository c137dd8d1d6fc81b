"""The paper's evaluation (§6) as simulator experiments.

- :func:`compare`: the end-to-end comparison on one trace window (Figures 5 and 6).
- :func:`ablation`: fixed 4-16 dedicated rollout GPUs; ROLL, then forced PD disaggregation at the
  best ratio (A), + ungated toggle (B), + the gate (C), and PEARL itself (Figure 7).
- :func:`ratio_selection`: the ratio PEARL's decision engine selects for 10/12/16 dedicated GPUs,
  with and without the 16 borrowed training GPUs, against the best ratio found by running every
  split in the simulator (Table 2).
- :func:`sensitivity`: PEARL vs RLBoost+ on 8 dedicated GPUs across batch sizes and maximum
  trajectory lengths (Figure 8).

Independent runs go to a process pool (``workers``); results do not depend on it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any

from pearl.core.state import Mode
from pearl.sim.availability import Availability
from pearl.sim.result import RunResult
from pearl.sim.runner import Simulation, history_profile
from pearl.sim.scenario import ABLATIONS, POLICIES, PolicySpec, Scenario
from pearl.sim.static import run_static

Progress = Callable[[float, str], None]


def _run(job: tuple[Scenario, PolicySpec, Availability]) -> RunResult:
    sc, spec, avail = job
    return Simulation(sc, spec, avail).run()


def run_many(
    jobs: Sequence[tuple[Scenario, PolicySpec, Availability]],
    workers: int = 1,
    progress: Progress | None = None,
    label: str = "",
) -> list[RunResult]:
    """Run simulations, in a process pool when ``workers`` > 1; results keep the jobs' order."""
    report = progress or (lambda f, s: None)
    if workers <= 1 or len(jobs) <= 1:
        out = []
        for i, (sc, spec, avail) in enumerate(jobs):

            def sub(f: float, i: int = i, name: str = spec.name) -> None:
                report((i + f) / len(jobs), f"{label}{name}")

            out.append(Simulation(sc=sc, spec=spec, avail=avail, progress=sub).run())
        return out
    results: list[RunResult | None] = [None] * len(jobs)
    with ProcessPoolExecutor(min(workers, len(jobs))) as pool:
        futures = {pool.submit(_run, job): i for i, job in enumerate(jobs)}
        for done, fut in enumerate(as_completed(futures), 1):
            results[futures[fut]] = fut.result()
            report(done / len(jobs), f"{label}{jobs[futures[fut]][1].name}")
    return [r for r in results if r is not None]


def compare(
    sc: Scenario,
    avail: Availability,
    names: Sequence[str],
    workers: int = 1,
    progress: Progress | None = None,
) -> dict[str, RunResult]:
    """Figures 5-6: every named policy on the same window."""
    runs = run_many([(sc, POLICIES[n], avail) for n in names], workers, progress)
    return dict(zip(names, runs, strict=True))


def _fixed(spec: PolicySpec, gpus: int) -> PolicySpec:
    return dataclasses.replace(spec, elastic=False, reserved_gpus=gpus)


def ablation(
    sc: Scenario,
    gpus: Sequence[int] = (4, 8, 12, 16),
    duration_s: float = 7200.0,
    workers: int = 1,
    progress: Progress | None = None,
) -> dict[int, dict[str, float]]:
    """Figure 7: throughput of each ablation step over ROLL on the same fixed GPUs."""
    avail = Availability.constant(0, duration_s)
    jobs, keys = [], []
    for g in gpus:
        for label, spec in ABLATIONS.items():
            jobs.append((sc, _fixed(spec, g), avail))
            keys.append((g, label))
    runs = run_many(jobs=jobs, workers=workers, progress=progress, label="ablation ")
    out: dict[int, dict[str, float]] = {}
    for (g, label), r in zip(keys, runs, strict=True):
        out.setdefault(g, {})[label] = r.throughput
    return {
        g: {k: v / row["roll"] if row["roll"] else 0.0 for k, v in row.items()}
        | {"roll_tok_s": row["roll"]}
        for g, row in out.items()
    }


def _split_makespan(
    sc: Scenario, n_p: int, n_d: int, n_c: int, seeds: Sequence[int], batches: int
) -> float:
    spans: list[float] = []
    for s in seeds:
        spans += run_static(
            model=sc.model,
            n_c=n_c,
            n_p=n_p,
            n_d=n_d,
            workload=sc.workload,
            engine=sc.engine,
            seed=s,
            batches=batches,
            balance=sc.balance,
        ).makespans
    return sum(spans) / len(spans)


def _ratio_job(args: tuple[Scenario, int, int, tuple[int, ...], int]) -> dict[str, Any]:
    sc, ded, ov, seeds, batches = args
    N = (ded + ov) // sc.tp
    policy = sc.policy(POLICIES["pearl"])
    profile = history_profile(sc, ded, workers=N)
    decision = policy.decide(profile, N, None)
    selected = decision.target
    spans = {"coloc": _split_makespan(sc=sc, n_p=0, n_d=0, n_c=N, seeds=seeds, batches=batches)}
    for n_p in range(1, N):
        spans[f"{n_p}P{N - n_p}D"] = _split_makespan(
            sc=sc, n_p=n_p, n_d=N - n_p, n_c=0, seeds=seeds, batches=batches
        )
    best = min(spans, key=lambda k: spans[k])
    sel = "coloc" if selected.mode is Mode.COLOCATED else str(selected)
    # The decision engine's prediction of every configuration (eq. 1-3 on the profile it
    # decided from) against the simulator's measured makespan of it.
    predicted: dict[str, float] = {}
    excluded: dict[str, str | None] = {}
    for a in decision.alternatives:
        key = "coloc" if a.mode is Mode.COLOCATED else str(a.target)
        predicted[key] = a.predicted_makespan_s
        excluded[key] = a.excluded_by
    return {
        "dedicated_gpus": ded,
        "overlap": bool(ov),
        "workers": N,
        "selected": sel,
        "empirical_best": best,
        "match": sel == best,
        "selected_vs_best": spans[best] / spans[sel] if sel in spans else None,
        "makespans_s": spans,
        "predicted_s": predicted,
        "excluded_by": excluded,
        "error": {k: predicted[k] / v - 1 for k, v in spans.items() if k in predicted},
    }


def ratio_selection(
    sc: Scenario,
    dedicated: Sequence[int] = (10, 12, 16),
    overlap_gpus: int = 16,
    seeds: Sequence[int] = (0, 1),
    batches: int = 3,
    workers: int = 1,
    progress: Progress | None = None,
) -> list[dict[str, Any]]:
    """Table 2: the decision engine's ratio vs the best of every split run in the simulator."""
    jobs = [(sc, d, ov, tuple(seeds), batches) for d in dedicated for ov in (0, overlap_gpus)]
    report = progress or (lambda f, s: None)
    if workers <= 1:
        out = []
        for i, j in enumerate(jobs):
            out.append(_ratio_job(j))
            report((i + 1) / len(jobs), "ratio selection")
        return out
    with ProcessPoolExecutor(min(workers, len(jobs))) as pool:
        res = list(pool.map(_ratio_job, jobs))
    report(1.0, "ratio selection")
    return res


def sensitivity(
    sc: Scenario,
    dedicated: int = 8,
    batches: Sequence[int] = (32, 64, 96, 128),
    lengths: Sequence[int] = (8192, 16384, 24576, 32768),
    duration_s: float = 7200.0,
    workers: int = 1,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Figure 8: PEARL over RLBoost+ on fixed dedicated GPUs as the workload changes."""
    avail = Availability.constant(0, duration_s)
    variants = [("batch", b, dataclasses.replace(sc.workload, batch=b)) for b in batches]
    variants += [("length", n, dataclasses.replace(sc.workload, max_tokens=n)) for n in lengths]
    jobs, keys = [], []
    for kind, value, wl in variants:
        for name in ("pearl", "rlboost+"):
            jobs.append(
                (dataclasses.replace(sc, workload=wl), _fixed(POLICIES[name], dedicated), avail)
            )
            keys.append((kind, value, name))
    runs = run_many(jobs=jobs, workers=workers, progress=progress, label="sensitivity ")
    out: dict[str, Any] = {"batch": {}, "length": {}}
    for (kind, value, name), r in zip(keys, runs, strict=True):
        out[kind].setdefault(value, {})[name] = r.throughput
    for kind in ("batch", "length"):
        for row in out[kind].values():
            row["gain"] = row["pearl"] / row["rlboost+"] - 1 if row["rlboost+"] else None
    return out


__all__ = ["ablation", "compare", "ratio_selection", "run_many", "sensitivity"]
