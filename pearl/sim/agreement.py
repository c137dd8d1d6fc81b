"""The closed-form makespan models (eq. 1-3) against the simulator, with no elasticity.

Two checks:

- :func:`lockstep`: a uniform workload (every trajectory the same turns, tokens and environment
  time) on fixed colocated workers, where eq. 1's assumptions hold, against eq. 1 evaluated with
  the simulator's own cost coefficients. They must agree within a stated tolerance.
- :func:`prediction_errors`: the calibrated (heterogeneous) workload on each configuration; the
  decision engine predicts the makespan from the profile the Runtime Tracker fitted on that
  configuration's telemetry, and the simulator measures it. The error is reported, not bounded:
  the closed forms ignore stragglers, queueing and the chunked-prefill interleaving.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from pearl.core.makespan import T_coloc, T_dis
from pearl.core.profile import RuntimeTracker, WorkloadProfile
from pearl.sim.costs import EngineParams, worker_costs
from pearl.sim.runner import transfer_bandwidth
from pearl.sim.scenario import Scenario
from pearl.sim.static import run_static
from pearl.sim.workload import WorkloadParams


def uniform(
    turns: int = 8, new: int = 1000, gen: int = 50, env_s: float = 0.5, batch: int = 16
) -> WorkloadParams:
    """Every trajectory identical: ``turns`` turns of ``new`` prompt and ``gen`` generated
    tokens, ``env_s`` seconds of environment after each turn but the last."""
    return WorkloadParams(
        batch=batch,
        group_size=batch,
        max_tokens=1 << 20,
        prompt_tokens=new,
        prompt_cv=0.0,
        turns=turns,
        turns_cv=0.0,
        task_sigma=0.0,
        max_turns=turns,
        obs_tokens=new,
        obs_cv=0.0,
        gen_tokens=gen,
        gen_cv=0.0,
        env_s=env_s,
        env_cv=0.0,
    )


def engine_profile(model: str, wl: WorkloadParams, N: int, eng: EngineParams) -> WorkloadProfile:
    """Eq. 1's parameters computed from the simulator's cost model for a uniform workload."""
    c = worker_costs(model, eng)
    S, dL, r = wl.turns, wl.obs_tokens, wl.gen_tokens
    per = wl.batch / N
    mean_ctx = S * (dL + r) / 2
    # decode at the mean context; prefill of one turn's tokens after the mean prefix
    return WorkloadProfile(
        B=wl.batch,
        S=S,
        delta_L=dL,
        r=r,
        theta=0.0,
        A=c.A(max(1, round(per))) + c.overhead_s,
        b=c.c_seq + c.c_ctx * mean_ctx,
        t_prefill=c.prefill_token(mean_ctx - dL / 2, dL),
        T_env=(S - 1) * wl.env_s * eng.time_scale,
        T_over=0.0,
        K=c.K,
        K_seq=c.K * S * (dL + r),
        H_max=c.kv_tokens * c.K,
        BW=c.link_Bps,
        T_toggle=0.0,
    )


def lockstep(
    model: str = "qwen3-8b",
    N: int = 4,
    wl: WorkloadParams | None = None,
    eng: EngineParams | None = None,
) -> tuple[float, float]:
    """(simulated makespan, eq. 1) for a uniform workload on N colocated workers."""
    wl = wl or uniform()
    eng = eng or EngineParams()
    sim = run_static(model, N, workload=wl, engine=eng, batches=1).makespans[0]
    return sim, float(T_coloc(engine_profile(model=model, wl=wl, N=N, eng=eng), float(N)))


def prediction_errors(
    sc: Scenario,
    configs: Sequence[tuple[int, int, int]],
    seeds: Sequence[int] = (0,),
    batches: int = 8,
) -> list[dict[str, Any]]:
    """Per (N_C, N_P, N_D): simulated mean makespan, the closed form's prediction from the
    profile the tracker fitted on that configuration's telemetry, and the relative error.

    The EMA (alpha 0.3) starts from the catalog priors, so it needs about eight steps to forget
    them; fewer batches report the priors' error more than the model's."""
    rows = []
    prior = sc.prior(4)
    for n_c, n_p, n_d in configs:
        spans, tracker = (
            [],
            RuntimeTracker(prior, sc.decision.ema_alpha, float(sc.workload.max_tokens)),
        )
        for s in seeds:
            res = run_static(
                model=sc.model,
                n_c=n_c,
                n_p=n_p,
                n_d=n_d,
                workload=sc.workload,
                engine=sc.engine,
                seed=s,
                batches=batches,
                balance=sc.balance,
            )
            spans += res.makespans
            for raw in res.telemetry:
                tracker.observe(tracker.summarize(raw))
        # eq. 1-3 take the fitted profile (the EMA has converged over the batches; T_over is the
        # switching stall measured on colocated workers, the prior's on split ones) and the KV
        # link at the rate the deployment pays, as the decision engine's history profile does
        p = msgspec.structs.replace(tracker.profile, BW=transfer_bandwidth(sc, tracker.profile))
        pred = float(T_coloc(p, float(n_c))) if n_c else float(T_dis(p, float(n_p), float(n_d)))
        sim = sum(spans) / len(spans)
        name = f"{n_c}C" if n_c else f"{n_p}P{n_d}D"
        rows.append(
            {"config": name, "simulated_s": sim, "predicted_s": pred, "error": pred / sim - 1}
        )
    return rows


__all__ = ["engine_profile", "lockstep", "prediction_errors", "uniform"]
