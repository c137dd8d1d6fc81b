"""One simulated rollout worker as a fluid model of iteration-level continuous batching.

Between two events a worker's batch is constant, so its progress is analytic: each iteration
takes ``tau`` seconds and gives every decoding sequence one token; a colocated worker with
prefill waiting also pushes ``chunk_tokens`` prefill tokens through the same iteration (chunked
prefill piggybacks on decode and slows it: Sarathi-style mixed batches), a prefill worker runs
prefill chunks alone, a decode worker decodes only. ``V`` counts iterations since the decode batch
was last empty; a sequence admitted at ``V0`` with ``m`` tokens to generate finishes at
``V0 + m``, so the next completion is a heap lookup.

KV memory is counted in tokens: requests reserve their full context plus the tokens they will
generate; a finished turn's KV stays resident (prefix cache) and is evicted least recently used
when a new request needs room; a request that still does not fit waits in ``admit_q``.
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import TYPE_CHECKING

from pearl.core.state import Role
from pearl.sim.costs import WorkerCosts

if TYPE_CHECKING:
    from pearl.sim.trajectory import Traj

COLOCATED, PREFILL, DECODE = Role.COLOCATED, Role.PREFILL, Role.DECODE


class StepStats:
    """What the workers measured during one rollout step (telemetry and §3.2 shares)."""

    __slots__ = (
        "decode",
        "prefill_tokens",
        "prefill_s",
        "decode_tokens",
        "prefill_time",
        "decode_time",
        "switch_stall",
        "colocated_turns",
    )

    def __init__(self) -> None:
        self.decode: dict[int, list[float]] = {}  # batch size -> [seconds, iterations]
        self.prefill_tokens = 0.0
        self.prefill_s = 0.0  # pure prefill compute seconds of those tokens
        self.decode_tokens = 0.0
        self.prefill_time = 0.0  # worker-seconds spent on prefill chunks
        self.decode_time = 0.0  # worker-seconds spent on decode
        # Colocation's switching overhead as the decoding sequences pay it: sequence-seconds a
        # prefill's insertion stalled them, and the decode turns started on colocated workers.
        self.switch_stall = 0.0
        self.colocated_turns = 0


class SimWorker:
    """A rollout worker (TP GPUs) serving one role."""

    __slots__ = (
        "wid",
        "role",
        "costs",
        "accepting",
        "t_last",
        "V",
        "W",
        "tau",
        "tau_dec",
        "n",
        "ctx_off",
        "dec",
        "pq",
        "kv_cap",
        "kv_used",
        "idle",
        "admit_q",
        "load",
        "version",
        "stats",
        "_seq",
        "busy_s",
        "alive",
        "node",
        "stalled_until",
    )

    def __init__(
        self, wid: int, role: Role, costs: WorkerCosts, now: float, stats: StepStats
    ) -> None:
        self.wid = wid
        self.role = role
        self.costs = costs
        self.accepting = False
        self.alive = True
        self.t_last = now
        self.V = 0.0
        self.W = 0.0  # sum over the decode iterations since V was 0 of their batch size
        self.tau = 0.0
        self.tau_dec = 0.0
        self.n = 0
        self.ctx_off = 0.0  # sum over decoding sequences of (context at admission - V0)
        self.dec: list[tuple[float, int, Traj]] = []
        self.pq: deque[Traj] = deque()
        self.kv_cap = costs.kv_tokens
        self.kv_used = 0
        self.idle: dict[Traj, int] = {}  # resident, evictable KV (LRU order)
        self.admit_q: deque[Traj] = deque()
        self.load = 0  # trajectories routed here (router balance)
        self.version = 0
        self.stats = stats
        self._seq = 0
        self.busy_s = 0.0
        self.node = 0
        self.stalled_until = float("-inf")  # loading a published weight version: no progress

    # -- the fluid clock --------------------------------------------------------------------------

    def advance(self, now: float) -> None:
        """Progress decode and prefill from t_last to now at the current rates."""
        dt = now - self.t_last
        if dt <= 0.0:
            return
        self.t_last = now
        if self.tau <= 0.0:
            return
        iters = dt / self.tau
        st = self.stats
        self.busy_s += dt
        if self.n:
            self.V += iters
            self.W += iters * self.n
            d = st.decode.get(self.n)
            if d is None:
                st.decode[self.n] = [iters * self.tau_dec, iters]
            else:
                d[0] += iters * self.tau_dec
                d[1] += iters
            st.decode_tokens += iters * self.n
            st.decode_time += iters * self.tau_dec
        if self.pq:
            head = self.pq[0]
            tokens = iters * self.costs.chunk_tokens
            head.pf_rem -= tokens
            st.prefill_time += tokens * head.t_tok
            if self.n and head.t_ins:
                # the insertion's share of these iterations stalls every decoding sequence
                st.switch_stall += tokens * head.t_ins / head.pf_tokens * self.n

    def recompute(self) -> None:
        """Iteration time for the current batch (call after any change, once advanced)."""
        c = self.costs
        if self.n:
            self.tau_dec = c.decode_iteration(self.n, self.ctx_off + self.n * self.V)
        else:
            self.tau_dec = 0.0
            self.V = self.W = 0.0
            self.ctx_off = 0.0
        if self.pq:
            base = self.tau_dec if self.n else c.A_prefill + c.overhead_s
            self.tau = base + c.chunk_tokens * self.pq[0].t_tok
        else:
            self.tau = self.tau_dec
        if self.stalled_until > self.t_last:
            self.tau = 0.0  # no iteration runs while the weights are being replaced

    @property
    def stalled(self) -> bool:
        return self.stalled_until > self.t_last

    def next_time(self, now: float) -> float:
        """When the next decode or prefill completion happens at the current rates."""
        t = float("inf")
        if self.n:
            t = (self.dec[0][0] - self.V) * self.tau
        if self.pq:
            t = min(t, self.pq[0].pf_rem / self.costs.chunk_tokens * self.tau)
        return now + (t if t > 0.0 else 0.0)

    # -- queues ---------------------------------------------------------------------------------

    def start_decode(self, tr: Traj, tokens: int) -> None:
        self._seq += 1
        tr.V_start, tr.W_start = self.V, self.W
        if self.role == COLOCATED:
            self.stats.colocated_turns += 1
        heapq.heappush(self.dec, (self.V + tokens, self._seq, tr))
        self.n += 1
        self.ctx_off += tr.ctx - self.V

    def pop_decoded(self) -> Traj | None:
        """The sequence whose generation is complete at the current V, if any."""
        # A completion closer than a nanosecond counts as reached: float rounding of event times
        # must not leave a sequence one ulp short of done forever.
        if self.dec and (self.dec[0][0] - self.V) * self.tau <= 1e-9:
            _, _, tr = heapq.heappop(self.dec)
            tr.seen_sum += self.W - tr.W_start
            tr.seen_steps += self.V - tr.V_start
            self.n -= 1
            self.ctx_off -= tr.ctx - tr.V_start
            return tr
        return None

    def generated(self, tr: Traj) -> int:
        """Tokens a decoding sequence produced so far in its current request."""
        return int(self.V - tr.V_start + 1e-6)

    def enqueue_prefill(self, tr: Traj, tokens: int, prefix: int) -> None:
        tr.pf_rem = float(tokens)
        tr.pf_tokens = tokens
        colocated = self.role == COLOCATED
        tr.t_tok = self.costs.prefill_token(prefix, tokens, colocated)
        tr.t_ins = self.costs.insert_s if colocated and tokens > 0 else 0.0
        self.pq.append(tr)

    def pop_prefilled(self) -> Traj | None:
        if self.pq and self.pq[0].pf_rem * self.tau <= 1e-9 * self.costs.chunk_tokens:
            tr = self.pq.popleft()
            st = self.stats
            st.prefill_tokens += tr.pf_tokens
            st.prefill_s += tr.pf_tokens * tr.t_tok - tr.t_ins  # compute only: no insertion
            tr.prefilled += tr.pf_tokens
            return tr
        return None

    # -- KV memory ------------------------------------------------------------------------------

    def reserve(self, tokens: int, keep: Traj | None = None) -> bool:
        """Reserve KV for ``tokens`` more tokens, evicting idle prefixes LRU; False if full."""
        if self.kv_used + tokens <= self.kv_cap:
            self.kv_used += tokens
            return True
        for tr in list(self.idle):
            if self.kv_used + tokens <= self.kv_cap:
                break
            if tr is not keep:
                self.drop_idle(tr)
        if self.kv_used + tokens <= self.kv_cap:
            self.kv_used += tokens
            return True
        return False

    def drop_idle(self, tr: Traj) -> None:
        """Evict a resident prefix: the trajectory will prefill it again wherever it goes."""
        tokens = self.idle.pop(tr)
        self.kv_used -= tokens
        if tr.home is self:
            tr.home = None
            tr.home_tokens = 0
        if tr.phome is self:
            tr.phome = None
            tr.phome_tokens = 0

    def pin(self, tr: Traj) -> int:
        """Take a resident prefix out of the evictable set; returns its tokens (0: none)."""
        return self.idle.pop(tr, 0)

    def make_idle(self, tr: Traj, tokens: int) -> None:
        self.idle[tr] = tokens

    def release(self, tokens: int) -> None:
        self.kv_used -= tokens

    def clear(self) -> list[Traj]:
        """Drop every request and resident prefix (abort); returns the trajectories in flight."""
        inflight = [tr for _, _, tr in self.dec] + list(self.pq) + list(self.admit_q)
        for tr in list(self.idle):
            self.drop_idle(tr)
        self.dec.clear()
        self.pq.clear()
        self.admit_q.clear()
        self.n = 0
        self.V = self.W = 0.0
        self.ctx_off = 0.0
        self.kv_used = 0
        self.tau = self.tau_dec = 0.0
        return inflight


__all__ = ["COLOCATED", "DECODE", "PREFILL", "SimWorker", "StepStats"]
