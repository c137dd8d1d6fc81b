"""The hand-checked workload profile the core's tests share: round numbers, so every expected
makespan can be checked by hand. For N = 8: colocation 78 s, 3P5D 85.42 s, 4P4D 87.83 s, 2P6D
87.54 s (eq. 2 plus the hand-off); N_P = 1 fails prefill throughput, N_P >= 5 decode HBM."""

from __future__ import annotations

from pearl.core.profile import WorkloadProfile

HAND = WorkloadProfile(
    B=64,
    S=10.0,
    delta_L=1000.0,
    r=100.0,
    theta=1.0,
    A=0.01,
    b=0.001,
    t_prefill=1e-4,
    T_env=0.0,
    T_start=50.0,  # an additive constant; the environment is on the critical path
    T_over=0.2,
    K=1e5,
    K_seq=2e9,
    H_max=2e10,
    BW=1e10,
    T_toggle=5.0,
)
