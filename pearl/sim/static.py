"""Rollout on a fixed set of workers, without the controller: the motivation experiments (§3),
the closed-form agreement check, and the brute-force ratio search of Table 2 run here.

Batches run back to back (batch k+1 starts when batch k's last trajectory finishes), so the
mean batch makespan is the rollout time of one step on that configuration.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pearl.core.profile import StepTelemetry, TrajectoryStats
from pearl.sim.clock import Clock
from pearl.sim.costs import EngineParams, worker_costs
from pearl.sim.rollout import Rollout
from pearl.sim.trajectory import Traj
from pearl.sim.worker import COLOCATED, DECODE, PREFILL, StepStats
from pearl.sim.workload import WorkloadParams, generate_batch


@dataclass
class StaticResult:
    """Per batch: makespan and what the workers measured."""

    makespans: list[float] = field(default_factory=list)
    stats: list[StepStats] = field(default_factory=list)
    telemetry: list[StepTelemetry] = field(default_factory=list)
    generated: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)

    @property
    def makespan(self) -> float:
        return sum(self.makespans) / len(self.makespans)

    def shares(self) -> tuple[float, float]:
        """(prefill share of tokens, prefill share of busy time) over all batches (§3.2)."""
        pt = sum(s.prefill_tokens for s in self.stats)
        dt = sum(s.decode_tokens for s in self.stats)
        ps = sum(s.prefill_time for s in self.stats)
        ds = sum(s.decode_time for s in self.stats)
        return pt / max(pt + dt, 1e-9), ps / max(ps + ds, 1e-9)


def telemetry_of(
    step: int,
    trs: list[Traj],
    stats: StepStats,
    f_active: float,
    makespan: float,
    in_flight: float = 0.0,
    env_scale: float = 1.0,
    start: float | None = None,
) -> StepTelemetry:
    """The raw telemetry a real deployment would record for one rollout step: per trajectory
    also the prompt tokens really prefilled (prefix reuse, recomputation after a move or an
    abort), and ``in_flight``, the mean number of the batch's trajectories not yet finished over
    its makespan (the concurrency the workers really share as stragglers thin the batch out),
    and colocation's switching stall per decode turn (eq. 1's T_over; the prefill seconds are
    then compute only). Environment seconds are those the tools really took: the workload's,
    dilated by the engine's ``env_scale`` as the rollout runs them. ``start``: when the batch's
    trajectories started (their latency is measured from it; None: not measured)."""
    dec = sorted(stats.decode.items())
    return StepTelemetry(
        step=step,
        trajectories=tuple(
            TrajectoryStats(
                turns=tr.spec.turns,
                new_tokens=sum(tr.spec.new),
                generated_tokens=sum(tr.spec.gen),
                env_s=sum(tr.spec.env) * env_scale,
                prefilled_tokens=tr.prefilled,
                seen_batch=tr.seen_sum / tr.seen_steps if tr.seen_steps > 0 else None,
                latency_s=None if start is None else tr.t_end - start,
            )
            for tr in trs
        ),
        decode_batch=tuple(n for n, _ in dec),
        decode_s=tuple(s / it for _, (s, it) in dec),
        prefill_tokens=(int(stats.prefill_tokens),) if stats.prefill_tokens else (),
        prefill_s=(stats.prefill_s,) if stats.prefill_tokens else (),
        active_fraction=(min(1.0, max(0.0, f_active)),),
        makespan_s=makespan,
        in_flight=in_flight,
        switch_s=stats.switch_stall / stats.colocated_turns if stats.colocated_turns else None,
        decode_weights=tuple(it for _, (_, it) in dec),  # one mean per batch size
    )


def run_static(
    model: str,
    n_c: int = 0,
    n_p: int = 0,
    n_d: int = 0,
    *,
    workload: WorkloadParams | None = None,
    engine: EngineParams | None = None,
    seed: int = 0,
    batches: int = 3,
    first_batch: int = 0,
    balance: int = 2,
) -> StaticResult:
    """Run ``batches`` rollout batches on n_c colocated or n_p prefill + n_d decode workers."""
    wl = workload or WorkloadParams()
    clock = Clock()
    eng = engine or EngineParams()
    ro = Rollout(
        clock=clock, costs=worker_costs(model, eng), balance=balance, env_scale=eng.time_scale
    )
    routable = {}
    roles = [COLOCATED] * n_c + [PREFILL] * n_p + [DECODE] * n_d
    for i, role in enumerate(roles):  # TP workers packed onto nodes in order
        ro.add_worker(i, role, tuple(range(i * eng.tp, (i + 1) * eng.tp)))
        routable[i] = role
    ro.set_routable(routable)
    out = StaticResult()
    for k in range(batches):
        specs = generate_batch(wl, seed, first_batch + k)
        ro.stats = StepStats()
        for w in ro.workers.values():
            w.stats = ro.stats
        t0 = clock.now
        env0, unf0 = ro.int_env, ro.int_unfinished
        done: list[Traj] = []
        ro.on_traj_done = done.append
        trs = ro.start(specs)
        while len(done) < len(trs):
            ev = clock.pop()
            if ev is None:
                raise RuntimeError("rollout stalled: no event pending with trajectories left")
            _, kind, obj, ver = ev
            ro.dispatch(kind, obj, ver)
        ro._acc()
        span = clock.now - t0
        unf = ro.int_unfinished - unf0
        f = 1.0 - (ro.int_env - env0) / unf if unf > 0 else 1.0
        out.makespans.append(span)
        out.stats.append(ro.stats)
        out.telemetry.append(
            telemetry_of(
                step=k + 1,
                trs=trs,
                stats=ro.stats,
                f_active=f,
                makespan=span,
                in_flight=unf / span if span > 0 else 0.0,
                env_scale=ro.env_scale,
                start=t0,
            )
        )
        out.generated.append(sum(tr.spec.gen[i] for tr in trs for i in range(tr.spec.turns)))
        out.tokens.append(sum(tr.spec.tokens for tr in trs))
    return out


__all__ = ["StaticResult", "run_static", "telemetry_of"]
