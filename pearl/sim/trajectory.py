"""A trajectory in flight: which turn, its context, where its request and its KV are."""

from __future__ import annotations

from enum import IntEnum
from typing import TYPE_CHECKING

from pearl.core.errors import InvariantViolation
from pearl.sim.workload import TrajectorySpec

if TYPE_CHECKING:
    from pearl.sim.worker import SimWorker


class Phase(IntEnum):
    """Where a trajectory is: at the router, on a worker, in its environment, or done."""

    WAIT = 0  # at the router (new, between turns, or withdrawn from a worker)
    QUEUED = 1  # admitted to a worker, waiting for KV pages
    PREFILLING = 2
    XFER = 3  # prefilled on a prefill worker, KV on its way to the decode worker
    DECODING = 4
    ENV = 5  # the environment runs the turn's tool call
    DONE = 6


WAIT, QUEUED, PREFILLING, XFER, DECODING, ENV, DONE = Phase
INFLIGHT = (QUEUED, PREFILLING, XFER, DECODING)
# Every in-flight phase may go back to WAIT: an abort keeps the tokens and routes it again.
NEXT: dict[Phase, frozenset[Phase]] = {
    WAIT: frozenset({WAIT, QUEUED}),
    QUEUED: frozenset({PREFILLING, WAIT}),
    PREFILLING: frozenset({DECODING, XFER, WAIT}),  # colocated decodes; a prefill worker ships
    XFER: frozenset({DECODING, WAIT}),
    DECODING: frozenset({ENV, DONE, WAIT}),
    ENV: frozenset({WAIT}),
    DONE: frozenset(),
}


class Traj:
    """A trajectory in flight (mutable, hot path)."""

    __slots__ = (
        "tid",
        "spec",
        "k",
        "ctx",
        "req_new",
        "req_gen",
        "phase",
        "w",
        "d",
        "owner",
        "pf_rem",
        "pf_tokens",
        "t_tok",
        "t_ins",
        "V_start",
        "W_start",
        "seen_sum",
        "seen_steps",
        "home",
        "home_tokens",
        "phome",
        "phome_tokens",
        "kv_res",
        "pkv_res",
        "need",
        "t_end",
        "generated",
        "prefilled",
    )

    def __init__(self, tid: int, spec: TrajectorySpec) -> None:
        self.tid = tid
        self.spec = spec
        self.k = 0
        self.ctx = 0  # tokens in the context, prefilled or generated (kept across aborts)
        self.req_new = spec.new[0]  # prompt tokens the current request appends
        self.req_gen = spec.gen[0]  # tokens the current request still has to generate
        self.phase = WAIT
        self.w: SimWorker | None = None  # colocated or prefill worker serving the request
        self.d: SimWorker | None = None  # decode worker (disaggregated)
        self.owner: SimWorker | None = None  # the worker whose routing load counts it
        self.pf_rem = 0.0
        self.pf_tokens = 0
        self.t_tok = 0.0
        self.t_ins = 0.0  # of t_tok x tokens: the colocated insertion cost
        self.V_start = 0.0
        self.W_start = 0.0
        self.seen_sum = 0.0  # decode iterations it was in, summed over their batch sizes
        self.seen_steps = 0.0  # and how many they were
        self.home: SimWorker | None = None  # worker holding the full KV (colocated / decode)
        self.home_tokens = 0
        self.phome: SimWorker | None = None  # prefill worker holding a cached prefix
        self.phome_tokens = 0
        self.kv_res = 0  # KV tokens held on w (colocated) or d (decode)
        self.pkv_res = 0  # KV tokens held on the prefill worker
        self.need = 0  # tokens to reserve when admitted from an admit_q
        self.t_end = 0.0
        self.generated = 0
        self.prefilled = 0  # prompt tokens computed for it (not reused from a cached prefix)

    def to(self, phase: Phase) -> None:
        if phase not in NEXT[self.phase]:
            raise InvariantViolation(
                f"trajectory {self.tid}: {self.phase.name} -> {phase.name} "
                "is not a phase transition"
            )
        self.phase = phase

    def __hash__(self) -> int:
        return self.tid


__all__ = [
    "DECODING",
    "DONE",
    "ENV",
    "INFLIGHT",
    "NEXT",
    "PREFILLING",
    "QUEUED",
    "WAIT",
    "XFER",
    "Phase",
    "Traj",
]
