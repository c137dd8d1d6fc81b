"""Eq. 1-3 against hand-computed values, and the §4.2 capacity constraints."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest

from pearl.core import makespan as ms
from pearl.core.profile import WorkloadProfile
from tests.core.profiles import HAND

# Round numbers so every expected value below can be checked by hand.
P = HAND


def test_eq1_colocation() -> None:
    # B/N = 8 per worker: prefill 8*1000*1e-4 = 0.8, decode 100*(0.01 + 0.001*8) = 1.8,
    # T_over 0.2 -> 2.8 per turn, times S = 10, plus T_start = 50 (the work is longer than the
    # slowest trajectory's own path with T_env = 0: see test_the_environment_is_on_the_path).
    assert ms.T_coloc(P, 8) == pytest.approx(78.0)
    assert ms.T_coloc(P, 4) == pytest.approx(10 * (1.6 + 100 * 0.026 + 0.2) + 50)


def test_concurrency_in_flight_and_prefilled_tokens_replace_B_and_delta_L() -> None:
    # 128 trajectories in flight (two batches), each turn prefilling 500 tokens (prefix reuse):
    # B/N = 16 per worker: prefill 16*500*1e-4 = 0.8, decode 100*(0.01 + 0.001*16) = 2.6.
    q = msgspec.structs.replace(P, B_flight=128.0, delta_P=500.0)
    assert ms.T_coloc(q, 8) == pytest.approx(10 * (0.8 + 2.6 + 0.2) + 50)
    assert ms.T_decode(q, 4) == pytest.approx(1000 * (0.01 + 0.001 * 128 / 8) * 2)
    # The KV of eq. 3 still ships delta_L tokens a turn: 128 x 1000 x 1e5 / 1e10 = 1.28 s, less
    # than the pool's 128 x 500 / 4 x 1e-4 = 1.6 s of compute, which it overlaps.
    assert ms.T_prefill(q, 4, 4) == pytest.approx(10 * 1.6)
    assert ms.T_prefill(q, 8, 4) == pytest.approx(10 * 1.28)
    assert ms.lambda_P(q) == 128 * 10 * 500


def test_eq2_decode_path() -> None:
    # S r (A + b B / (N_D (1 + theta))) (1 + theta) = 1000 * (0.01 + 0.001 * 64 / 8) * 2
    assert ms.T_decode(P, 4) == pytest.approx(36.0)
    assert ms.T_decode(P, 2) == pytest.approx(52.0)


def test_eq3_prefill_path_is_bound_by_compute_or_transfer() -> None:
    # S max(B dL / N_P t_prefill, B dL K / BW) = 10 * max(64000 / 4 * 1e-4, 64000 * 1e5 / 1e10):
    # the pool transfers one request's KV while it computes the next.
    assert ms.T_prefill(P, 4, 4) == pytest.approx(16.0)
    assert ms.T_prefill(P, 1, 7) == pytest.approx(64.0)
    assert ms.T_prefill(P, 16, 4) == pytest.approx(6.4)  # transfer-bound: 64 GB at 10 GB/s


def test_link_share_is_the_busiest_links_part_of_the_transfers() -> None:
    # No topology: one link carries everything (eq. 3 as written).
    assert ms.link_share(0, 4, 4) == 1.0
    # 4 workers a link, prefill packed first. 4P4D: node 0 sends everything to node 1.
    assert ms.link_share(4, 4, 4) == pytest.approx(1.0)
    # 2P6D: node 0 = P P D D, node 1 = D D D D. Node 0 sends 2 x 4 of the 12 pairs out,
    # node 1 receives 4 x 2 of them in: 2/3 of the volume on the busiest link.
    assert ms.link_share(4, 2, 6) == pytest.approx(8 / 12)
    # 3P5D: node 0 = P P P D sends 3 x 4 of 15 pairs; node 1 receives 4 x 3.
    assert ms.link_share(4, 3, 5) == pytest.approx(12 / 15)
    # 2P3D on 5 workers: node 0 = P P D D sends 2 x 1 of 6; node 1 = D receives 1 x 2.
    assert ms.link_share(4, 2, 3) == pytest.approx(2 / 6)
    # A link per worker: the smaller pool's links carry it all, 1 / min(N_P, N_D).
    assert ms.link_share(1, 3, 5) == pytest.approx(1 / 3)
    assert ms.link_share(1, 6, 2) == pytest.approx(1 / 2)
    # Vectorised over the splits of one budget, equal to the scalar form.
    n_p = np.arange(1.0, 8.0)
    got = ms.link_share(4, n_p, 8 - n_p)
    assert got == pytest.approx([ms.link_share(4, int(k), 8 - int(k)) for k in n_p])
    # The prefill path takes the share: 4P4D on 4-worker links moves it all over one link.
    q = msgspec.structs.replace(P, workers_per_link=4, t_prefill=1e-6)
    assert ms.T_prefill(q, 4, 4) == pytest.approx(10 * 0.64)
    assert ms.T_prefill(q, 2, 6) == pytest.approx(10 * 0.64 * 8 / 12)


def test_handoff_each_turn_waits_for_its_prefill_and_its_kv() -> None:
    # 4P4D: the pool is busy X = 16 s a step; a trajectory's cycle is the decode path (36 s), its
    # KV (S dL K / BW = 0.1 s) and its prefills (S dP t_prefill = 1 s, stretched 1 / (1 - rho)
    # by the queue). rho solves rho = 16 / (36.1 + 1 / (1 - rho)): 0.4229.
    rho = float(ms.prefill_utilization(P, 4, 4))
    assert rho == pytest.approx(16 / (36.1 + 1 / (1 - rho)), rel=1e-9)
    assert rho == pytest.approx(0.4229, abs=1e-4)
    # a turn waits 1000 * 1e-4 / (1 - rho) for its prefill and 1000 * 1e5 / 1e10 for its KV
    assert ms.T_handoff(P, 4, 4) == pytest.approx(10 * (0.1 / (1 - rho) + 0.01))
    # A saturated pool (1P7D: 64 s of prefill a step, rho 0.97) stretches it 10x at most.
    assert float(ms.prefill_utilization(P, 1, 7)) == pytest.approx(0.9726, abs=1e-4)
    assert ms.T_handoff(P, 1, 7) == pytest.approx(10 * (0.1 / (1 - 0.9) + 0.01))


def test_disaggregated_is_the_longest_of_the_pools_work_and_the_path() -> None:
    rho = float(ms.prefill_utilization(P, 4, 4))
    hand = 10 * (0.1 / (1 - rho) + 0.01)  # 1.83
    assert ms.T_dis(P, 4, 4) == pytest.approx(36.0 + hand + 50)  # decode-bound, with the handoff
    assert ms.T_dis(P, 1, 7) == pytest.approx(64.0 + 50)  # prefill-bound


def test_the_environment_is_on_the_path_not_added_to_the_work() -> None:
    """Work conservation (§4.3.1): other trajectories' work fills a worker while one waits for
    its tools, so T_env counts only on the slowest trajectory's own path."""
    q = msgspec.structs.replace(P, T_env=15.0, T_start=0.0)
    # Colocated, 8 workers: work 28 s (test_eq1_colocation); the path is the slowest
    # trajectory's own prefill 1000 * 1e-4 = 0.1, 100 iterations at 0.01 + 0.001 * 8 and the
    # stall 0.2 a turn: 10 * 2.1 = 21 s, + 15 s of environment = 36 s > 28 s.
    assert ms.T_path_coloc(q, 8) == pytest.approx(36.0)
    assert ms.T_coloc(q, 8) == pytest.approx(36.0)
    # On 2 workers the work (32 a worker: prefill 3.2, decode 100 * (0.01 + 0.032) = 4.2) is
    # longer than the path (10 * (0.1 + 4.2 + 0.2) + 15 = 60): 10 * 7.6 = 76 s, no environment.
    assert ms.T_coloc(q, 2) == pytest.approx(76.0)
    # 4P4D: decode 36 s + handoff 1.83 s of work; the path is 100 iterations a turn at the
    # active batch 64 / (4 x 2) = 8, 10 * 100 * 0.018 = 18 s, + the handoff + 15 s = 34.83 s.
    hand = float(ms.T_handoff(q, 4, 4))
    assert ms.T_path_dis(q, 4, 4) == pytest.approx(18.0 + hand + 15.0)
    assert ms.T_dis(q, 4, 4) == pytest.approx(36.0 + hand)
    far = msgspec.structs.replace(q, T_env=40.0)  # now the path: 18 + 1.83 + 40 > 37.83 s
    assert ms.T_dis(far, 4, 4) == pytest.approx(18.0 + hand + 40.0)
    s = ms.sweep(far, 8, 0.9)
    assert s.T_coloc == pytest.approx(61.0) and s.T_dis[3] == pytest.approx(18.0 + hand + 40.0)


def test_a_staggered_start_adds_to_either_mode() -> None:
    # A pipeline that starts the batch's last groups 0.7 s after its first: the batch lasts that
    # much longer whichever configuration runs it, so no comparison between them moves.
    q = msgspec.structs.replace(P, T_start=P.T_start + 0.7)
    assert ms.T_coloc(q, 8) == pytest.approx(ms.T_coloc(P, 8) + 0.7)
    assert ms.T_dis(q, 4, 4) == pytest.approx(ms.T_dis(P, 4, 4) + 0.7)
    s, t = ms.sweep(q, 8, 0.9), ms.sweep(P, 8, 0.9)
    assert s.T_coloc == pytest.approx(t.T_coloc + 0.7)
    assert s.T_dis == pytest.approx(t.T_dis + 0.7) and list(s.excluded) == list(t.excluded)


def test_bubbles_slow_the_decode_path_only() -> None:
    calm = WorkloadProfile(**{**_fields(P), "theta": 0.0})
    assert ms.T_decode(calm, 4) == pytest.approx(1000 * (0.01 + 0.001 * 16))
    assert ms.T_decode(P, 4) > ms.T_decode(calm, 4)
    assert ms.T_coloc(P, 8) == ms.T_coloc(calm, 8)  # work conservation: no bubble term


def test_monotone_in_worker_counts() -> None:
    n = np.arange(1.0, 65.0)
    assert np.all(np.diff(ms.T_coloc(P, n)) < 0)
    assert np.all(np.diff(ms.T_decode(P, n)) < 0)
    pre = ms.T_prefill(P, n, 64 - n)
    assert np.all(np.diff(pre) <= 0)  # compute falls until the transfer bounds it
    assert np.all(np.diff(pre[:9]) < 0) and np.all(pre[10:] == pytest.approx(6.4))


def test_decode_hbm_constraint() -> None:
    # B K_seq = 128 GB, resident on average half of it (64 GB); each decode worker holds 20 GB
    # -> at least 4 decode workers.
    assert ms.KV_RESIDENCY == 0.5
    assert not ms.decode_hbm_ok(P, 3)
    assert ms.decode_hbm_ok(P, 4)
    exact = WorkloadProfile(**{**_fields(P), "K_seq": 2.5e9})  # 64 x 2.5 / 2 = 80 GB = 4 x 20
    assert ms.decode_hbm_ok(exact, 4) and not ms.decode_hbm_ok(exact, 3.99)


def test_prefill_throughput_constraint() -> None:
    # lambda_P = 64 * 10 * 1000 tokens: the pool is busy 64 / N_P seconds a step, over a cycle
    # that includes the waits for the pool itself (rho solves rho = X / (D + 0.1 + 1 / (1 - rho))).
    assert ms.lambda_P(P) == 640_000
    for n_p, expected in ((4, 0.4229), (2, 0.8524), (1, 0.9726)):
        rho = float(ms.prefill_utilization(P, n_p, 8 - n_p))
        D = float(ms.T_decode(P, 8 - n_p))
        assert rho == pytest.approx(64 / n_p / (D + 0.1 + 1 / (1 - rho)), rel=1e-9)
        assert rho == pytest.approx(expected, abs=1e-4)
    assert ms.prefill_keeps_up(p=P, N_P=2, N_D=6, max_util=0.9)  # 85% busy
    assert not ms.prefill_keeps_up(p=P, N_P=2, N_D=6, max_util=0.85)
    assert not ms.prefill_keeps_up(p=P, N_P=1, N_D=7, max_util=0.9)  # 97%
    u = float(ms.prefill_utilization(P, 3, 5))
    assert ms.prefill_keeps_up(p=P, N_P=3, N_D=5, max_util=u * (1 + 1e-9))
    assert not ms.prefill_keeps_up(p=P, N_P=3, N_D=5, max_util=u * (1 - 1e-9))
    # Even a pool with more work than the decode path's time stays below 1: its queue grows.
    busy = msgspec.structs.replace(P, t_prefill=1e-3)
    assert 0.9 < float(ms.prefill_utilization(busy, 1, 7)) < 1.0


def test_sweep_excludes_exactly_the_violating_splits() -> None:
    s = ms.sweep(P, 8, 0.9)
    got = [ms.EXCLUDED_BY[c] for c in s.excluded]
    # N_P = 1: prefill cannot keep up; N_P = 5..7 leave fewer than 4 decode workers.
    assert got == [
        ms.PREFILL_THROUGHPUT,
        None,
        None,
        None,
        ms.DECODE_HBM,
        ms.DECODE_HBM,
        ms.DECODE_HBM,
    ]
    # N_P = 3: decode 1000 * (0.01 + 0.0064) * 2 = 32.8 > prefill 10 * max(6.4 / 3, 0.64) = 21.3;
    # the handoff adds 10 * (0.1 / (1 - rho) + 0.01) = 2.62 at rho 0.6024. 2P6D (87.54) and 4P4D
    # (87.83) are slower.
    assert s.best_split() == 2
    assert s.T_dis[2] == pytest.approx(32.8 + 10 * (0.1 / (1 - 0.6024) + 0.01) + 50, abs=1e-3)
    assert s.T_dis[1] == pytest.approx(87.54, abs=1e-2)
    assert s.T_dis[3] == pytest.approx(87.83, abs=1e-2)
    assert s.T_coloc == pytest.approx(78.0)


def test_sweep_matches_the_scalar_equations() -> None:
    for N in (2, 8, 33):
        s = ms.sweep(P, N, 0.9)
        assert list(s.N_P) == list(range(1, N))
        for i, n_p in enumerate(s.N_P):
            n_p = int(n_p)
            assert s.T_dis[i] == pytest.approx(ms.T_dis(P, n_p, N - n_p), rel=1e-12)
            ok = bool(ms.decode_hbm_ok(P, N - n_p)) and bool(
                ms.prefill_keeps_up(p=P, N_P=n_p, N_D=N - n_p, max_util=0.9)
            )
            assert bool(s.feasible[i]) == ok


def test_sweep_of_too_few_workers() -> None:
    one = ms.sweep(P, 1, 0.9)
    assert one.N_P.size == 0 and one.best_split() is None and one.T_coloc == ms.T_coloc(P, 1)
    none = ms.sweep(P, 0, 0.9)
    assert none.T_coloc == float("inf") and none.best_split() is None


def test_nothing_feasible() -> None:
    huge = WorkloadProfile(**{**_fields(P), "K_seq": 1e12})
    s = ms.sweep(huge, 8, 0.9)
    assert not s.feasible.any() and s.best_split() is None


def _fields(p: WorkloadProfile) -> dict[str, float]:
    return {f.name: getattr(p, f.name) for f in msgspec.structs.fields(p)}


def test_the_path_pays_the_batch_its_iterations_held() -> None:
    """kappa: the slowest trajectory's iterations held kappa times eq. 1-2's batch; the path pays
    that, the work (every iteration once) does not."""
    q = msgspec.structs.replace(P, T_env=15.0, T_start=0.0, kappa=1.5)
    # Colocated, 8 workers: the path's b term 10 x 100 x 0.001 x 8 = 8 s grows by half, 36 -> 40.
    assert ms.T_path_coloc(q, 8) == pytest.approx(36.0 + 4.0)
    assert ms.T_coloc(q, 8) == pytest.approx(40.0)
    # On 2 workers the work is unchanged (76 s); the path 60 + 0.5 x 10 x 100 x 0.001 x 32 = 76.
    assert ms.T_coloc(q, 2) == pytest.approx(76.0)
    # 4P4D: the decode path's b term 10 x 100 x 0.001 x 8 = 8 s grows to 12 s; the pool's work
    # (eq. 2, 36 s) does not, and the path with its tools (22 + 15 s) is now the longer.
    hand = float(ms.T_handoff(q, 4, 4))
    assert ms.T_path_dis(q, 4, 4) == pytest.approx(18.0 + 4.0 + hand + 15.0)
    assert ms.T_dis(q, 4, 4) == pytest.approx(37.0 + hand)
    far = msgspec.structs.replace(q, T_env=40.0)
    assert ms.T_dis(far, 4, 4) == pytest.approx(22.0 + hand + 40.0)
    s = ms.sweep(far, 8, 0.9)
    assert s.T_dis[3] == pytest.approx(22.0 + hand + 40.0)
