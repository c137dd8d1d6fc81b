"""A trajectory in flight: which turn, its context, where its request and its KV are."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pearl.sim.workload import TrajectorySpec

if TYPE_CHECKING:
    from pearl.sim.worker import SimWorker

WAIT, QUEUED, PREFILLING, XFER, DECODING, ENV, DONE = range(7)
INFLIGHT = (QUEUED, PREFILLING, XFER, DECODING)


class Traj:
    """A trajectory in flight (mutable, hot path)."""

    __slots__ = ("tid", "spec", "k", "ctx", "req_new", "req_gen", "phase", "w", "d", "owner",
                 "pf_rem", "pf_tokens", "t_tok", "V_start", "home", "home_tokens", "phome",
                 "phome_tokens", "kv_res", "pkv_res", "need", "t_end", "generated")

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
        self.V_start = 0.0
        self.home: SimWorker | None = None  # worker holding the full KV (colocated / decode)
        self.home_tokens = 0
        self.phome: SimWorker | None = None  # prefill worker holding a cached prefix
        self.phome_tokens = 0
        self.kv_res = 0  # KV tokens held on w (colocated) or d (decode)
        self.pkv_res = 0  # KV tokens held on the prefill worker
        self.need = 0  # tokens to reserve when admitted from an admit_q
        self.t_end = 0.0
        self.generated = 0

    def __hash__(self) -> int:
        return self.tid


__all__ = ["DECODING", "DONE", "ENV", "INFLIGHT", "PREFILLING", "QUEUED", "WAIT", "XFER", "Traj"]
