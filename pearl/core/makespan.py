"""Bubble-aware makespan models (§4.3.1, eq. 1-3) and the capacity constraints of §4.2.

Every function takes worker counts (a worker spans tp GPUs) as Python numbers or numpy arrays and
returns the same shape, so the decision engine evaluates all N_P in [1, N-1] in one pass.

B in the per-worker terms is the batch's concurrency, ``p.concurrency`` (B_flight: an asynchronous
pipeline keeps more than one batch in flight, so a worker decodes B_flight / N sequences at once;
B where it was not measured), and the prefilled tokens per turn are ``p.prefill_per_turn``
(delta_P: prefix reuse leaves only the new tokens of a turn; delta_L where not measured). The KV
transfer of eq. 3 still moves delta_L tokens' worth per turn, over the links the pools span.
T_env, the slowest trajectory's tool time, lies on that trajectory's path (``T_path_coloc``,
``T_path_dis``), not on the workers' work, which the other trajectories keep busy while it waits
(work conservation, §4.3.1): a makespan is the longer of the two. The work counts each decode
iteration once, at the mean batch B / N; the path counts the iterations its trajectory is in,
whose batch is ``p.kappa`` times that (the fuller iterations hold more sequences; measured).

Capacity constraints (a disaggregated configuration is feasible when both hold):

- decode HBM: the decode workers hold the whole batch's KV cache, ``B * K_seq <= N_D * H_max``
  (K_seq at its mean residency over the step);
- prefill throughput: per step the prefill pool receives ``lambda_P = B * S * delta_P`` tokens and
  is busy ``lambda_P * t_prefill / N_P`` seconds. Those tokens arrive once per trajectory cycle
  (decode path, then the wait for the pool and the KV), so prefill keeps up when its utilisation
  over that cycle (:func:`prefill_utilization`) is at most ``max_util``. Past it prefill queues
  grow and delay decode (an M/M/1 queue at 90% already waits 10 service times).

Colocation has no constraint here: it is the fallback the paper names when no split is feasible.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from pearl.core.profile import WorkloadProfile

# Worker counts and makespans: a number, or an array of them (one per configuration).
Count = float | npt.NDArray[np.float64]
Bools = bool | npt.NDArray[np.bool_]

DECODE_HBM = "decode-hbm"
PREFILL_THROUGHPUT = "prefill-throughput"
NO_WORKERS = "no-workers"
# Codes in :attr:`Sweep.excluded`: 0 feasible, then the first constraint a split violates.
EXCLUDED_BY: tuple[str | None, ...] = (None, DECODE_HBM, PREFILL_THROUGHPUT)


def T_coloc(p: WorkloadProfile, N: Count) -> Count:
    """Eq. 1: colocated makespan, the longer of the workers' work S [B dP / N t_prefill + r_c A +
    r b B / N + T_over] and the slowest trajectory's own path (:func:`T_path_coloc`, which holds
    T_env), plus T_start, the measured spread of the batch's start times (0 where it starts at
    once). B is the concurrency in flight, dP the tokens prefilled per turn, r_c the critical
    path's tokens per turn (its iterations, each costing A), r every trajectory's (the b term's
    work).

    The paper adds T_env to the work. Its own premise for eq. 1 is work conservation (§4.3.1:
    "when trajectories leave decode for environment interactions, prefill consumes the freed GPU
    capacity"), under which the environment overlaps the other trajectories' work and only the
    slowest trajectory's own turns wait for it; a sum counts it twice once the work fills the
    workers (docs/pd.md, "Environment time"; docs/results/pd.md compares the two against the
    simulator)."""
    per_worker, own, rest = _coloc_turn(p, N)
    work = p.S * (per_worker * own + rest)
    return np.maximum(work, T_path_coloc(p, N)) + p.T_start


def T_path_coloc(p: WorkloadProfile, N: Count) -> Count:
    """The slowest trajectory's path on a colocated worker: its S turns, each its own prefill (not
    the worker's), its r_c iterations (their per-sequence cost r b B / N as in the work: the batch
    thins as the others finish their turn; times kappa, the batch its iterations hold over the
    mean) and the switching stall, then its environment time,
    S [dP t_prefill + r_c A + kappa r b B / N + T_over] + T_env. With kappa 1, longer than the
    work exactly when T_env exceeds the other trajectories' prefill, S (B / N - 1) dP t_prefill,
    that fills its waits."""
    _, own, rest = _coloc_turn(p, N, p.kappa)
    return p.S * (own + rest) + p.T_env


def _coloc_turn(p: WorkloadProfile, N: Count, kappa: float = 1.0) -> tuple[Count, float, Count]:
    """A colocated turn's parts: trajectories per worker, one trajectory's prefill, and what
    every trajectory on the worker shares (r_c A + kappa r b B / N + T_over; the work counts
    the mean batch, kappa 1, a path the batch its iterations held)."""
    per_worker = p.concurrency / N
    rest = p.r_path * p.A + kappa * p.r * p.b * per_worker + p.T_over
    return per_worker, p.prefill_per_turn * p.t_prefill, rest


def T_decode(p: WorkloadProfile, N_D: Count) -> Count:
    """Eq. 2: decode-path makespan, S (r_c A + r b B / (N_D (1 + theta))) (1 + theta)."""
    k = 1.0 + p.theta
    return p.S * (p.r_path * p.A + p.r * p.b * p.concurrency / (N_D * k)) * k


def T_prefill(p: WorkloadProfile, N_P: Count, N_D: Count) -> Count:
    """Eq. 3: prefill-path makespan, S max(B dP / N_P t_prefill, B dL K / BW x share).

    Two departures from the paper's sum, both measured (docs/results/pd.md):

    - the pool computes and transfers at once (SGLang's prefill server moves a request's KV from
      its in-flight queue while the next batch runs), so the path is bound by the larger term;
    - BW is one link's rate, and the transfers spread over the links the two pools span:
      ``share`` is the busiest link's part of the volume (:func:`link_share`).
    """
    B = p.concurrency
    compute = B * p.prefill_per_turn / N_P * p.t_prefill
    transfer = B * p.delta_L * p.K / p.BW * link_share(p.workers_per_link, N_P, N_D)
    return p.S * np.maximum(compute, transfer)


def link_share(per_link: int, N_P: Count, N_D: Count) -> Count:
    """The busiest link's share of the prefill-to-decode KV volume.

    Workers are packed onto links ``per_link`` at a time (a node's NIC; prefill workers first,
    then decode) and every prefill worker sends to every decode worker alike (the router balances
    load). A link carries what its prefill workers send to decode workers elsewhere, or what its
    decode workers receive from prefill workers elsewhere; transfers within a link's node ride
    NVLink and are free here. ``per_link`` 0: both pools share one link (eq. 3 as written), 1.0.
    """
    if per_link <= 0:
        return 1.0
    n_p = np.asarray(N_P, dtype=np.float64)[..., None]
    n_d = np.asarray(N_D, dtype=np.float64)[..., None]
    n = n_p + n_d
    links = int(np.ceil(float(np.max(n)) / per_link))
    first = np.arange(links, dtype=np.float64) * per_link  # first worker on each link
    size = np.clip(n - first, 0.0, per_link)
    p_here = np.clip(n_p - first, 0.0, size)
    d_here = size - p_here
    out = p_here * (n_d - d_here)
    inn = d_here * (n_p - p_here)
    share = np.max(np.maximum(out, inn), axis=-1) / np.maximum(n_p * n_d, 1.0)[..., 0]
    return share if np.ndim(N_P) or np.ndim(N_D) else float(share)


# The prefill pool's utilisation at which its queue is taken to saturate (1 / (1 - rho) <= 10).
HANDOFF_MAX_UTILIZATION = 0.9


def T_handoff(p: WorkloadProfile, N_P: Count, N_D: Count) -> Count:
    """The latency a split adds to a trajectory's path beyond eq. 2, S [dP t_prefill / (1 - rho)
    + dL K / BW]: every turn waits for its own prefill on the prefill pool (stretched by the pool's
    queue, rho its utilisation, capped at ``HANDOFF_MAX_UTILIZATION``) and for its new tokens' KV
    before it decodes again. Under colocation that prefill is eq. 1's first term; eq. 2 with a
    theta measured colocated has no term for it."""
    rho = np.minimum(prefill_utilization(p, N_P, N_D), HANDOFF_MAX_UTILIZATION)
    # Sojourn in service times of an M/M/1 queue: prefills differ in size (observations vary),
    # so the queue is closer to exponential service than to M/D/1's 1 + rho / (2 (1 - rho)).
    return p.S * (p.prefill_per_turn * p.t_prefill / (1.0 - rho) + p.delta_L * p.K / p.BW)


def T_path_dis(p: WorkloadProfile, N_P: Count, N_D: Count) -> Count:
    """The slowest trajectory's path under disaggregation: its S turns, each its r_c iterations at
    the batch it sees on the decode pool, kappa B / (N_D (1 + theta)), and the hand-off
    (:func:`T_handoff`), then its environment time,
    S (r_c A + kappa r b B / (N_D (1 + theta))) + T_handoff + T_env: eq. 2 without its 1 + theta
    stretch, at the batch the trajectory sees, plus the hand-off and the tools."""
    return _decode_path(p, N_D) + T_handoff(p, N_P, N_D) + p.T_env


def _decode_path(p: WorkloadProfile, N_D: Count) -> Count:
    """The slowest trajectory's own decode iterations,
    S (r_c A + kappa r b B / (N_D (1 + theta)))."""
    return p.S * (p.r_path * p.A + p.kappa * p.r * p.b * p.concurrency / (N_D * (1.0 + p.theta)))


def _decode_leg(p: WorkloadProfile, N_D: Count) -> Count:
    """The longer of the decode pool's work (eq. 2) and the slowest trajectory's own iterations
    plus its tools (:func:`_decode_path` + T_env): the hand-off adds to either."""
    return np.maximum(T_decode(p, N_D), _decode_path(p, N_D) + p.T_env)


def T_dis(p: WorkloadProfile, N_P: Count, N_D: Count) -> Count:
    """Disaggregated makespan: the longest of the prefill pool's work (eq. 3), the decode pool's
    (eq. 2) with the hand-off latency, and the slowest trajectory's path (:func:`T_path_dis`,
    which holds T_env), + T_start as eq. 1. The paper adds T_env to the longer path; eq. 2's
    1 + theta already stretches the decode pool's work by the environment's bubbles, and the
    environment is on the slowest trajectory's path, as under colocation (:func:`T_coloc`)."""
    leg = _decode_leg(p, N_D) + T_handoff(p, N_P, N_D)
    return np.maximum(T_prefill(p, N_P, N_D), leg) + p.T_start


def lambda_P(p: WorkloadProfile) -> float:
    """Prefill tokens per step, B S delta_P (§4.2; B the concurrency, delta_P the prefilled)."""
    return p.concurrency * p.S * p.prefill_per_turn


# A trajectory's context grows from its first prompt to its final length over the step, and an
# asynchronous pipeline keeps trajectories at every stage: on average the batch holds half of
# its final KV. Requiring the final K_seq of all B at once rules out splits that run fine.
KV_RESIDENCY = 0.5


def decode_hbm_ok(p: WorkloadProfile, N_D: Count) -> Bools:
    """§4.2: the decode workers hold the KV cache of the trajectories in flight, B K_seq <= N_D
    H_max (K_seq at its mean residency over the step, ``KV_RESIDENCY`` of the final length)."""
    return p.concurrency * p.K_seq * KV_RESIDENCY <= N_D * p.H_max


def prefill_utilization(p: WorkloadProfile, N_P: Count, N_D: Count) -> Count:
    """The prefill pool's utilisation rho: its busy time lambda_P t_prefill / N_P over the time a
    trajectory's cycle takes, which includes the waits for the pool itself.

    Each turn of a trajectory decodes (eq. 2), then waits for its prefill, queued behind the
    others (``T_handoff``: a sojourn of 1 / (1 - rho) service times), and for its KV. The pool
    serves every turn once per cycle, so rho = X / (D + H1 + H0 / (1 - rho)) with X its busy
    time, D the decode path, H0 and H1 the per-trajectory prefill service and transfer over the
    step. The root in (0, 1) of (D + H1) rho^2 - (D + H1 + H0 + X) rho + X = 0 always exists; a
    pool that cannot keep up shows as rho near 1 (long queues), not as rho > 1.
    """
    X = lambda_P(p) * p.t_prefill / N_P
    H0 = p.S * p.prefill_per_turn * p.t_prefill
    a = T_decode(p, N_D) + p.S * p.delta_L * p.K / p.BW
    c = a + H0 + X
    # the smaller root, in the form that stays finite as a -> 0
    root = c + np.sqrt(np.maximum(c * c - 4.0 * a * X, 0.0))
    return np.where(root > 0, 2.0 * X / np.where(root > 0, root, 1.0), 0.0)


def prefill_keeps_up(p: WorkloadProfile, N_P: Count, N_D: Count, max_util: float) -> Bools:
    """§4.2: prefill handles lambda_P without queueing, utilisation <= max_util."""
    return prefill_utilization(p, N_P, N_D) <= max_util


@dataclass(frozen=True, slots=True)
class Sweep:
    """Colocation and every split N_P = 1 .. N-1 of N workers, evaluated at once.

    ``T_dis[i]``, ``excluded[i]`` describe N_P = i + 1; ``excluded`` indexes EXCLUDED_BY.
    """

    N: int
    T_coloc: float
    N_P: npt.NDArray[np.int64]
    T_dis: npt.NDArray[np.float64]
    excluded: npt.NDArray[np.int8]

    @property
    def feasible(self) -> npt.NDArray[np.bool_]:
        return self.excluded == 0

    def best_split(self) -> int | None:
        """Index of the feasible split with the least predicted makespan (ties: fewest N_P)."""
        if not self.N_P.size:
            return None
        masked = np.where(self.excluded == 0, self.T_dis, np.inf)
        i = int(np.argmin(masked))
        return i if masked[i] < np.inf else None


def sweep(p: WorkloadProfile, N: int, max_util: float) -> Sweep:
    """Evaluate eq. 1 for N workers and eq. 2-3 with the §4.2 constraints for every N_P."""
    if N < 1:
        empty = np.empty(0)
        return Sweep(
            N=N,
            T_coloc=float("inf"),
            N_P=empty.astype(np.int64),
            T_dis=empty,
            excluded=empty.astype(np.int8),
        )
    n_p = np.arange(1, N, dtype=np.int64)
    n_d = N - n_p
    f_p, f_d = n_p.astype(np.float64), n_d.astype(np.float64)
    leg = _decode_leg(p, f_d) + T_handoff(p, f_p, f_d)
    t_dis = np.maximum(T_prefill(p, f_p, f_d), leg) + p.T_start
    # Same quantities as decode_hbm_ok / prefill_keeps_up.
    hbm_bad = p.concurrency * p.K_seq * KV_RESIDENCY > n_d * p.H_max
    slow = prefill_utilization(p, f_p, f_d) > max_util
    excluded = np.where(hbm_bad, 1, np.where(slow, 2, 0)).astype(np.int8)
    return Sweep(N=N, T_coloc=float(T_coloc(p, float(N))), N_P=n_p, T_dis=t_dis, excluded=excluded)


__all__ = [
    "DECODE_HBM",
    "EXCLUDED_BY",
    "NO_WORKERS",
    "PREFILL_THROUGHPUT",
    "Sweep",
    "T_coloc",
    "T_decode",
    "T_dis",
    "T_handoff",
    "T_path_coloc",
    "T_path_dis",
    "T_prefill",
    "decode_hbm_ok",
    "lambda_P",
    "link_share",
    "prefill_keeps_up",
    "prefill_utilization",
    "sweep",
]
