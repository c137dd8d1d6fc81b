"""The rollout cluster: trajectories, the router, KV transfers, aborts and per-step measurements.

A trajectory runs turn after turn: its request is routed, prefilled, decoded, then the environment
takes its seconds and the next turn's request comes. Routing is cache-aware with load balance (as
SGLang's router): a turn goes back to the worker holding the trajectory's KV (colocated or
decode) or its cached prefix (prefill) unless that worker carries more than ``balance``
trajectories over the least loaded one; then it moves and its whole context is computed or
shipped there. (Without the bound on decode, borrowed decode workers sat nearly idle: every
trajectory stayed with the dedicated decode worker that held its KV.) Under disaggregation the
decode worker reserves the request's KV first (SGLang's pre-allocation), the prefill worker
computes the new tokens, and the KV crosses the link (:mod:`pearl.sim.link`) before decode starts.

Aborts (a worker removed, drained or re-roled) keep every generated token: the request is
resubmitted with its context grown by the partial response and prefills it where it lands.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from pearl.core.state import Role
from pearl.sim import clock as ck
from pearl.sim.clock import Clock
from pearl.sim.costs import WorkerCosts
from pearl.sim.link import Link
from pearl.sim.trajectory import DECODING, DONE, ENV, INFLIGHT, PREFILLING, QUEUED, WAIT, XFER, Traj
from pearl.sim.worker import COLOCATED, DECODE, PREFILL, SimWorker, StepStats
from pearl.sim.workload import TrajectorySpec


class Rollout:
    """Workers, routing and trajectory lifecycles; the runner owns time and the controller."""

    def __init__(
        self, clock: Clock, costs: WorkerCosts, balance: int = 2, env_scale: float = 1.0
    ) -> None:
        self.clock = clock
        self.costs = costs
        self.balance = balance
        self.env_scale = env_scale  # the time dilation of the engine applies to tools too
        self.workers: dict[int, SimWorker] = {}
        self.stats = StepStats()
        self.link = Link(
            clock=clock,
            link_Bps=costs.link_Bps,
            nvlink_Bps=costs.nvlink_Bps,
            done=self._transferred,
            latency_s=costs.xfer_latency_s,
        )
        self.router_q: deque[Traj] = deque()
        self.paused_until = float("-inf")
        self.active: list[Traj] = []
        self.on_traj_done: Callable[[Traj], None] = lambda tr: None
        self._tid = 0
        self._c: list[SimWorker] = []
        self._p: list[SimWorker] = []
        self._d: list[SimWorker] = []
        # time integrals for the bubble ratio: unfinished trajectories, those in the environment
        self._t_acc = clock.now
        self.n_unfinished = 0
        self.n_env = 0
        self.int_unfinished = 0.0
        self.int_env = 0.0

    # -- workers ---------------------------------------------------------------------------------

    def add_worker(self, wid: int, role: Role, gpus: tuple[int, ...] = ()) -> SimWorker:
        """A worker on ``gpus`` (its node is the first GPU's, for the KV links)."""
        if wid in self.workers:
            self.remove_worker(wid)
        w = SimWorker(wid=wid, role=role, costs=self.costs, now=self.clock.now, stats=self.stats)
        first = gpus[0] if gpus else wid * self.costs.gpus_per_node
        w.node = first // self.costs.gpus_per_node
        self.workers[wid] = w
        return w

    def remove_worker(self, wid: int) -> None:
        w = self.workers.pop(wid, None)
        if w is not None:
            w.accepting = False
            self._refresh_routable()
            self.abort(w)
            w.alive = False

    def set_role(self, wid: int, role: Role) -> None:
        w = self.workers.get(wid)
        if w is not None:
            w.accepting = False
            self._refresh_routable()
            self.abort(w)
            w.role = role

    def set_routable(self, routable: dict[int, Role]) -> None:
        """The controller's routable set changed: {worker id: role}."""
        changed = []
        for wid, w in self.workers.items():
            role = routable.get(wid)
            w.accepting = role is not None
            if role is not None and role != w.role:
                changed.append((w, role))
        self._refresh_routable()
        for w, role in changed:
            self.abort(w)
            w.role = role
        self._refresh_routable()
        self.flush_router()

    def _refresh_routable(self) -> None:
        c: list[SimWorker] = []
        p: list[SimWorker] = []
        d: list[SimWorker] = []
        for w in self.workers.values():
            if w.accepting:
                (c if w.role == COLOCATED else p if w.role == PREFILL else d).append(w)
        self._c, self._p, self._d = c, p, d

    def stall(self, seconds: float) -> None:
        """A new weight version is published: every worker stops iterating for ``seconds`` while
        it receives and loads the broadcast (requests stay where they are; KV transfers go on)."""
        if seconds <= 0:
            return
        now = self.clock.now
        for w in self.workers.values():
            w.advance(now)
            w.stalled_until = now + seconds
            self.kick(w)
        self.clock.at(now + seconds, ck.UNSTALL)

    def unstall(self) -> None:
        now = self.clock.now
        for w in self.workers.values():
            if w.stalled_until <= now:
                w.advance(now)
                self.kick(w)

    def pause(self, until: float) -> None:
        """Hold new requests at the router until ``until`` (expansion finalization)."""
        if until > self.paused_until:
            self.paused_until = until
            self.clock.at(until, ck.UNPAUSE)

    # -- trajectories ----------------------------------------------------------------------------

    def start(self, specs: list[TrajectorySpec]) -> list[Traj]:
        self._acc()
        trs = []
        for spec in specs:
            self._tid += 1
            trs.append(Traj(self._tid, spec))
        self.n_unfinished += len(trs)
        self.active = trs
        for tr in trs:
            self.route(tr)
        return trs

    def _acc(self) -> None:
        now = self.clock.now
        dt = now - self._t_acc
        if dt > 0:
            self.int_unfinished += dt * self.n_unfinished
            self.int_env += dt * self.n_env
            self._t_acc = now

    def flush_router(self) -> None:
        if self.router_q and self.clock.now >= self.paused_until:
            q, self.router_q = self.router_q, deque()
            for tr in q:
                self.route(tr)

    def route(self, tr: Traj) -> None:
        """Send the trajectory's current request to a worker, or hold it at the router."""
        tr.to(WAIT)
        c, p, d = self._c, self._p, self._d
        if self.clock.now < self.paused_until or not (c or (p and d)):
            self.router_q.append(tr)
            return
        if c and not (p and d and tr.owner in p):
            w = self._pick(tr.owner if tr.owner in c else None, c)
            self._own(tr, w)
            self._admit_colocated(w, tr)
        else:
            # SGLang's PD load balancer picks a (prefill, decode) pair without regard to cached
            # prefixes; with pd_affinity off a turn lands on the least loaded prefill worker.
            sticky = self.costs.pd_affinity and tr.owner in p
            pw = self._pick(tr.owner if sticky else None, p)
            self._own(tr, pw)
            home = tr.home if self.costs.decode_keeps_prefix and tr.home in d else None
            least = min(d, key=_active)
            if home is not None and _active(home)[0] - _active(least)[0] > self.balance:
                home = None  # the KV holder is busy: decode elsewhere, the context moves again
            self._admit_decode(home or least, tr)

    def _pick(self, home: SimWorker | None, ws: list[SimWorker]) -> SimWorker:
        least = min(ws, key=_load)
        if home is not None and home.load - least.load <= self.balance:
            return home
        return least

    def _own(self, tr: Traj, w: SimWorker) -> None:
        if tr.owner is not w:
            if tr.owner is not None:
                tr.owner.load -= 1
            w.load += 1
            tr.owner = w

    @staticmethod
    def _forget(tr: Traj, keep: SimWorker | None) -> None:
        """Drop the trajectory's resident KV anywhere but on ``keep`` (it moved)."""
        h = tr.home
        if h is not None and h is not keep:
            if tr in h.idle:
                h.drop_idle(tr)
            tr.home, tr.home_tokens = None, 0

    # -- admission ---------------------------------------------------------------------------------

    def _admit(self, w: SimWorker, tr: Traj, resident: int, need: int) -> bool:
        """Reserve ``need`` tokens on w (FIFO behind waiting requests) or queue the request."""
        tr.need = need
        if w.admit_q or not w.reserve(need, tr):
            w.admit_q.append(tr)
            return False
        return True

    def _admit_colocated(self, w: SimWorker, tr: Traj) -> None:
        self._forget(tr, w)
        resident = w.pin(tr) if tr.home is w else 0
        tr.to(QUEUED)
        tr.w, tr.d, tr.kv_res = w, None, resident
        if self._admit(
            w=w, tr=tr, resident=resident, need=tr.ctx + tr.req_new + tr.req_gen - resident
        ):
            tr.kv_res += tr.need
            self._prefill(w, tr, resident)

    def _admit_decode(self, d: SimWorker, tr: Traj) -> None:
        self._forget(tr, d)
        resident = d.pin(tr) if tr.home is d else 0
        tr.to(QUEUED)
        tr.w, tr.d, tr.kv_res = None, d, resident
        d.load += 1
        if self._admit(
            w=d, tr=tr, resident=resident, need=tr.ctx + tr.req_new + tr.req_gen - resident
        ):
            tr.kv_res += tr.need
            self._admit_prefill(tr)

    def _admit_prefill(self, tr: Traj) -> None:
        p = tr.owner
        assert p is not None
        if tr.phome is not None and tr.phome is not p:
            if tr in tr.phome.idle:
                tr.phome.drop_idle(tr)
            tr.phome, tr.phome_tokens = None, 0
        resident = p.pin(tr) if tr.phome is p else 0
        tr.w, tr.pkv_res = p, resident
        if self._admit(w=p, tr=tr, resident=resident, need=tr.ctx + tr.req_new - resident):
            tr.pkv_res += tr.need
            self._prefill(p, tr, resident)

    def _retry_admission(self, w: SimWorker) -> None:
        while w.admit_q and w.alive:
            tr = w.admit_q[0]
            if not w.reserve(tr.need, tr):
                return
            w.admit_q.popleft()
            if w.role == DECODE:
                tr.kv_res += tr.need
                self._admit_prefill(tr)
            elif w.role == COLOCATED:
                tr.kv_res += tr.need
                self._prefill(w, tr, tr.kv_res - tr.need)
            else:
                tr.pkv_res += tr.need
                self._prefill(w, tr, tr.pkv_res - tr.need)

    # -- prefill, transfer, decode -----------------------------------------------------------------

    def _prefill(self, w: SimWorker, tr: Traj, prefix: int) -> None:
        w.advance(self.clock.now)
        tokens = tr.ctx + tr.req_new - prefix
        tr.to(PREFILLING)
        if tokens <= 0:
            self._prefilled(w, tr)
        else:
            w.enqueue_prefill(tr, tokens, prefix)
        self.kick(w)

    def _prefilled(self, w: SimWorker, tr: Traj) -> None:
        """Prefill finished on w: decode here (colocated) or ship the KV (prefill worker)."""
        tr.ctx += tr.req_new
        tr.req_new = 0
        if w.role == COLOCATED:
            tr.to(DECODING)
            w.start_decode(tr, tr.req_gen)
            return
        d = tr.d
        assert d is not None
        have = tr.home_tokens if tr.home is d else 0  # a prefix d kept; the rest must move
        tr.to(XFER)
        self.link.start(tr, w, d, (tr.ctx - have) * self.costs.K)

    def _transferred(self, tr: Traj) -> None:
        p, d = tr.w, tr.d
        assert p is not None and d is not None
        p.make_idle(tr, tr.pkv_res)  # the prompt stays cached on the prefill worker
        tr.phome, tr.phome_tokens, tr.pkv_res, tr.w = p, tr.pkv_res, 0, None
        self._retry_admission(p)
        d.advance(self.clock.now)
        tr.to(DECODING)
        d.start_decode(tr, tr.req_gen)
        self.kick(d)

    def kick(self, w: SimWorker) -> None:
        """Recompute w's rates and schedule its next completion."""
        w.recompute()
        w.version += 1
        if (w.n or w.pq) and not w.stalled:
            self.clock.at(w.next_time(self.clock.now), ck.WORKER, w, w.version)

    def dispatch(self, kind: int, obj: object, version: int) -> bool:
        """Handle a worker, environment or transfer event; False for any other kind."""
        if kind == ck.WORKER:
            self.on_worker(obj, version)  # type: ignore[arg-type]
        elif kind == ck.ENV:
            self.on_env(obj)  # type: ignore[arg-type]
        elif kind == ck.XFER:
            obj.on_event(version)  # type: ignore[attr-defined]
        elif kind == ck.UNSTALL:
            self.unstall()
        else:
            return False
        return True

    def on_worker(self, w: SimWorker, version: int) -> None:
        if version != w.version or not w.alive:
            return
        w.advance(self.clock.now)
        while (tr := w.pop_prefilled()) is not None:
            self._prefilled(w, tr)
        freed = False
        while (tr := w.pop_decoded()) is not None:
            self._decoded(w, tr)
            freed = True
        if freed:
            self._retry_admission(w)
        self.kick(w)

    def _decoded(self, w: SimWorker, tr: Traj) -> None:
        tr.ctx += tr.req_gen
        tr.generated += tr.req_gen
        tr.req_gen = 0
        if w.role == DECODE:
            w.load -= 1
        if w.role == DECODE and not self.costs.decode_keeps_prefix:
            w.release(tr.kv_res)
            tr.home, tr.home_tokens = None, 0
        else:
            w.make_idle(tr, tr.kv_res)
            tr.home, tr.home_tokens = w, tr.kv_res
        tr.kv_res = 0
        tr.w = tr.d = None
        spec = tr.spec
        env = spec.env[tr.k]
        tr.k += 1
        if tr.k >= len(spec.gen):
            self._finish(tr)
            return
        tr.req_new, tr.req_gen = spec.new[tr.k], spec.gen[tr.k]
        tr.to(ENV)
        self._acc()
        self.n_env += 1
        self.clock.at(self.clock.now + env * self.env_scale, ck.ENV, tr)

    def on_env(self, tr: Traj) -> None:
        if tr.phase != ENV:
            return
        self._acc()
        self.n_env -= 1
        self.route(tr)

    def _finish(self, tr: Traj) -> None:
        tr.to(DONE)
        tr.t_end = self.clock.now
        if tr.owner is not None:
            tr.owner.load -= 1
            tr.owner = None
        for h in (tr.home, tr.phome):
            if h is not None and tr in h.idle:
                h.drop_idle(tr)
        self._acc()
        self.n_unfinished -= 1
        self.on_traj_done(tr)

    # -- aborts ------------------------------------------------------------------------------------

    def abort(self, gone: SimWorker) -> None:
        """Stop everything on ``gone``, keeping generated tokens; resubmit what was in flight.

        Victims are the requests on ``gone`` and those waiting for a decode slot on behalf of
        ``gone`` as their prefill worker. They are first taken off every surviving worker, then
        admission resumes there, then they are routed again (in that order, so that a freed
        slot never goes to a request that is itself being withdrawn)."""
        gone.advance(self.clock.now)
        generated = {tr: gone.generated(tr) for _, _, tr in gone.dec}
        victims = [
            tr
            for tr in self.active
            if tr.phase in INFLIGHT
            and (tr.w is gone or tr.d is gone or (tr.owner is gone and tr.phase == QUEUED))
        ]
        for tr in victims:
            self.link.cancel(tr)
        gone.clear()
        gone.load = 0
        gone.version += 1
        for tr in self.active:
            if tr.owner is gone:
                tr.owner = None
            if tr.home is gone:
                tr.home, tr.home_tokens = None, 0
            if tr.phome is gone:
                tr.phome, tr.phome_tokens = None, 0
        touched: dict[int, SimWorker] = {}
        for tr in victims:
            for other in (tr.w, tr.d):
                if other is not None and other is not gone and other.alive:
                    self._withdraw(other, tr)
                    touched[other.wid] = other
            g = generated.get(tr, 0)
            if g and tr.phase == DECODING:
                g = min(g, tr.req_gen - 1)
                tr.ctx += g
                tr.generated += g
                tr.req_gen -= g
            tr.w = tr.d = None
            tr.kv_res = tr.pkv_res = 0
            if tr.owner is not None:
                tr.owner.load -= 1
                tr.owner = None
            tr.to(WAIT)
        for x in touched.values():
            self.kick(x)
            self._retry_admission(x)
        for tr in victims:
            self.route(tr)

    def _withdraw(self, x: SimWorker, tr: Traj) -> None:
        """Take an aborted request off a surviving worker and free what it held there."""
        x.advance(self.clock.now)
        held = tr.kv_res if x is tr.d or x.role == COLOCATED else tr.pkv_res
        if tr in x.admit_q:
            x.admit_q.remove(tr)
        elif tr in x.pq:
            x.pq.remove(tr)
        x.release(held)
        if x.role == DECODE:
            x.load -= 1
        if tr.home is x:
            tr.home, tr.home_tokens = None, 0
        if tr.phome is x:
            tr.phome, tr.phome_tokens = None, 0


def _load(w: SimWorker) -> tuple[int, int]:
    return (w.load, w.wid)


def _active(w: SimWorker) -> tuple[int, int]:
    return (w.load + len(w.admit_q), w.wid)


__all__ = ["Rollout", "Traj"]
