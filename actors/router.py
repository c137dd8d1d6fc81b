"""The Router: the Pipeline Scheduler's dispatch (§4.1.1). Routes only to active workers.

Its view of the workers changes only when the Orchestrator publishes a logged change. A request
goes to a colocated worker, or, under disaggregation, to a prefill and a decode worker together
with a fresh transfer id (SGLang's shape); the decode worker's answer is the result.

The colocated (or prefill) worker is chosen cache-aware (:func:`pearl.core.routing.choose_worker`,
a pure function): a turn goes back to the worker that served its trajectory's previous turn —
that worker holds the trajectory's prefix resident (prefix caching across turns, §2), so only the
turn's new tokens are prefilled — unless moving it pays. Once the controller's profile is fitted,
a move pays when the time the turn saves on a less loaded worker (eq. 1's per-sequence iteration
cost and prefill share, per request fewer beside it) exceeds the re-prefill of its resident
context there; before, the cache-aware slack rule of SGLang's and vLLM's routers decides
(:data:`~pearl.core.routing.AFFINITY_SLACK`, :data:`~pearl.core.routing.AFFINITY_RATIO`). A worker
that leaves moves its turns at once, whatever they cost.

Workers on the trainer's GPUs (lent for a training-idle window, zone ``overlap``) serve the
rollout's critical path: the turns of the groups the next batch still needs, the ones the trainer
waits for (``GenerateRequest.critical``, set by the Pipeline Scheduler). Other turns go to them
only when nothing else is routable: the batch after has a training step to finish in, and what
runs on a lent worker when Training Begin takes it back is aborted and prefilled again elsewhere.

Retries have a clock, not a count (:mod:`actors.retries`): a request waits for a worker up to its
``wait_s``, retries included, each retry after a back-off that doubles per attempt; past its time
it fails with ``retry_after_s`` set. A refusal of the request itself is final at once. An aborted
request comes back with its generated prefix to whoever asked, who resubmits it.

A worker host that dies gives no answer and no prefix. The RoleSupervisor tells ``WorkerGone``
and every request that ran there is routed again at once, from the start of its turn (the Router
never sees partial output), to workers other than the gone one until it says hello again or the
table stops routing to it. Each attempt travels under its own engine rid (``rid~k``) so that a
late answer of an attempt given up on (the other half of a PD pair, a message re-delivered to a
restarted host) can never be taken for the current one.

With ``engine.router = "sglang-router"`` the Router keeps its bookkeeping (pending requests,
retries, replies) but hands dispatch to an :class:`~pearl.engines.sglang.router.SGLangRouterLink`:
the link registers the committed workers with the real sglang-router and sends requests through
it; its answers come back here as ``generate-done`` from worker ``LINK``.

Workers under a preemption notice (``gpus.leaving``) are out of the routable set, so no new turn
goes there; the Router lets a turn already running there finish when the tracker's per-turn time
says it ends before the deadline, and migrates the others at once (abort keeping the prefix: the
asker resubmits it elsewhere), and every turn still there shortly before the deadline
(:func:`pearl.core.notice.to_migrate`).
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from actors import names
from actors.base import Directory, PearlActor
from actors.messages import AbortRequest, Generate, GenerateDone, Route, StateChanged
from actors.retries import FIRST_BACKOFF_S, MAX_BACKOFF_S, RETRY_AFTER_S, WAIT_S, Pending
from pearl.core import notice
from pearl.core.errors import RequestRefused
from pearl.core.routing import Choice, choose_worker, hashed_home, move_cost
from pearl.core.state import Zone
from pearl.engines.base import GenerateRequest, check_request

log = logging.getLogger(__name__)

HOMES = 65_536  # trajectories whose last worker is remembered (least recently routed forgotten)
LINK = -1  # the "worker" a request runs on when the real sglang-router dispatches it


@dataclass(frozen=True)
class LinkChanged:
    """The sglang-router link admitted or removed workers: waiting requests may go now."""


@dataclass(frozen=True)
class KvAddress:
    """Where a worker's KV inbox listens (told by the RoleSupervisor on hello)."""

    worker: int
    address: str


@dataclass(frozen=True)
class Flush:
    """Sent every daemon tick."""


@dataclass(frozen=True)
class WorkerGone:
    """A worker host died or was killed (told by the RoleSupervisor): nothing it ran will answer."""

    worker: int
    incarnation: int = 0
    reason: str = ""


@dataclass
class View:
    colocated: list[int] = field(default_factory=list)
    prefill: list[int] = field(default_factory=list)
    decode: list[int] = field(default_factory=list)


class Router(PearlActor):
    name = names.ROUTER

    def __init__(
        self,
        directory: Directory,
        link: Any = None,
        wait_s: float = WAIT_S,
        clock: Callable[[], float] = time.monotonic,
        *,
        reply_to: str = "",
        hashed: bool = False,
    ) -> None:
        """``reply_to``: the rpc address worker hosts answer this Router at (a gateway
        process's; "": pearld's, by name). ``hashed``: a trajectory this Router has not seen
        starts at its rendezvous worker, not the least loaded (gateway processes, so that every
        process sends a session's turns to one worker)."""
        super().__init__()
        self.directory = directory
        self.link = link  # an SGLangRouterLink, or None: PEARL dispatches to workers itself
        self.wait_s, self.clock = wait_s, clock
        self.reply_to, self.hashed = reply_to, hashed
        self.expired = 0  # requests that found no worker in their time
        self.view = View()
        self.kv: dict[int, str] = {}
        self.load: dict[int, int] = {}
        self.pending: dict[str, Pending] = {}
        self.waiting: deque[str] = deque()
        self.wires: dict[str, str] = {}  # engine rid of a retried attempt -> request rid
        self.gone: set[int] = set()  # hosts that died; not routed to until they say hello
        self.seq = 0
        self.leaving: dict[int, float] = {}  # worker under a preemption notice -> its deadline
        self.profile: Any = None  # the tracker's profile, for the per-turn time
        self.migrated = 0  # turns moved off leaving workers before their deadline
        # trajectory -> the worker that prefilled its last turn (holds its prefix), LRU order
        self.homes: OrderedDict[str, int] = OrderedDict()
        self.affine = 0  # turns sent back to their trajectory's worker
        self.groups: OrderedDict[str, int] = OrderedDict()  # n > 1: a request's samples' worker
        self.lent: set[int] = set()  # routable workers on the trainer's GPUs (borrowed)

    def state_changed(self, msg: StateChanged) -> None:
        v = View()
        routable = msg.view.routable
        for w in routable:
            getattr(v, w.role.value).append(w.id)
        self.view, self.seq = v, msg.seq
        self.gone &= {w.id for w in routable}  # the table caught up with them
        self.lent = {w.id for w in routable if w.zone is Zone.OVERLAP}
        self.profile = msg.view.profile
        noticed = dict(msg.view.table.leaving_gpus)
        self.leaving = {}
        for w in msg.view.rollout:
            d = notice.worker_deadline(w.gpus, noticed)
            if d is not None:
                self.leaving[w.id] = d
        if self.link is not None:
            self.link.update(routable)  # registers in the background, then LinkChanged
        self._flush()

    def on_start(self) -> None:
        if self.link is not None:
            self.link.on_change = lambda: self.actor_ref.tell(LinkChanged())

    def on_stop(self) -> None:
        if self.link is not None:
            self.link.close()

    def link_changed(self, _: LinkChanged) -> None:
        self._flush()

    def kv_address(self, msg: KvAddress) -> None:
        self.kv[msg.worker] = msg.address
        self.gone.discard(msg.worker)  # its (new) host said hello

    def route(self, msg: Route) -> None:
        rid = msg.request.rid
        if rid in self.pending:
            self._reply(
                msg.reply_to,
                GenerateDone(
                    worker=-1, rid=rid, result=None, error=f"request {rid} is already in flight"
                ),
            )
            return
        try:  # one that cannot be encoded for a worker host, or that no engine takes, fails here
            check_request(msg.request)
        except RequestRefused as e:
            self._reply(
                msg.reply_to,
                GenerateDone(worker=-1, rid=rid, result=None, error=str(e), refused=True),
            )
            return
        wait = msg.wait_s if msg.wait_s > 0 else self.wait_s
        self.pending[rid] = Pending(msg, original=msg.request, deadline=self.clock() + wait)
        self._dispatch(rid)

    def _pick(
        self,
        pool: list[int],
        trajectory: str = "",
        critical: bool = False,
        group: str = "",
        context: int = 0,
    ) -> int:
        """The worker of ``pool`` that :func:`~pearl.core.routing.choose_worker` picks for a turn
        of ``trajectory`` (none: the least loaded) with ``context`` prompt tokens, remembered as
        the trajectory's home. A move off home is weighed by the profile once telemetry has
        fitted it (``observed``); the prior's roofline guesses never decide a move."""
        home = self.homes.get(trajectory) if trajectory else None
        if home is None and trajectory and self.hashed:
            home = hashed_home(trajectory, pool)
        cost = None
        if home is not None and (p := self.profile) is not None and p.observed:
            cost = move_cost(A=p.A, b=p.b, r=p.r, t_prefill=p.t_prefill,
                             prefill_per_turn=p.prefill_per_turn, context=context)  # fmt: skip
        choice = choose_worker(
            pool, self.load, home=home, lent=self.lent, critical=critical, cost=cost
        )
        if group:  # the samples of one request (n > 1) go together: they share the prefill
            if (together := self.groups.get(group)) in pool:
                choice = Choice(together)
            self.groups[group] = choice.worker
            self.groups.move_to_end(group)
            if len(self.groups) > HOMES:
                self.groups.popitem(last=False)
        if not trajectory:
            return choice.worker
        self.affine += choice.affine  # back home over a less loaded worker
        self.homes[trajectory] = choice.worker
        self.homes.move_to_end(trajectory)
        if len(self.homes) > HOMES:
            self.homes.popitem(last=False)
        return choice.worker

    def _dispatch(self, rid: str) -> None:
        p = self.pending[rid]
        assert p.original is not None
        req = p.original if p.attempt == 0 else msgspec.structs.replace(p.original, rid=p.wire(rid))
        p.prefilled, p.migrating, p.sent_at = False, False, time.time()
        if self.link is not None:
            self._dispatch_link(rid, p, req)
            return
        colocated, prefill, decode = (
            self._usable(pool, p)
            for pool in (self.view.colocated, self.view.prefill, self.view.decode)
        )
        if colocated:
            w = self._pick(colocated, req.trajectory, critical=req.critical, group=req.group,
                           context=len(req.input_ids))  # fmt: skip
            p.workers = (w,)
            self._send(w, req)
        elif prefill and decode and all(d in self.kv for d in decode):
            pw = self._pick(prefill, req.trajectory, critical=req.critical, group=req.group,
                            context=len(req.input_ids))  # fmt: skip
            dw = self._pick(decode, critical=req.critical)
            transfer = f"{rid}#{p.attempt}"
            p.workers = (pw, dw)
            self._send(dw, msgspec.structs.replace(req, transfer_id=transfer, kv_peer=""))
            self._send(pw, msgspec.structs.replace(req, transfer_id=transfer, kv_peer=self.kv[dw]))
        else:
            p.workers = ()
            self.waiting.append(rid)

    def _usable(self, pool: list[int], p: Pending) -> list[int]:
        """The live workers of ``pool``, those that turned ``p`` away only if no other is."""
        live = [w for w in pool if w not in self.gone]
        return [w for w in live if w not in p.avoid] or live

    def _dispatch_link(self, rid: str, p: Pending, req: GenerateRequest) -> None:
        if not self.link.routable():
            p.workers = ()
            self.waiting.append(rid)
            return
        p.workers = (LINK,)
        me, wire = self.actor_ref, req.rid

        def done(result: Any, error: str, retryable: bool) -> None:
            me.tell(
                GenerateDone(worker=LINK, rid=wire, result=result, error=error, retryable=retryable)
            )

        self.link.submit(req, done)

    def _send(self, worker: int, req: GenerateRequest) -> None:
        self.load[worker] = self.load.get(worker, 0) + 1
        if not self.directory.tell(
            names.worker_name(worker), Generate(request=req, reply_to=self.reply_to)
        ):
            self.directory.tell(
                self.name,
                GenerateDone(
                    worker=worker,
                    rid=req.rid,
                    result=None,
                    error="worker unreachable",
                    retryable=True,
                ),
            )

    def flush(self, _: Flush | None = None) -> None:
        """Periodic: route what waits (requests to retry, requests with nowhere to go)."""
        self._flush()

    def _flush(self) -> None:
        now = self.clock()
        for _ in range(len(self.waiting)):
            rid = self.waiting.popleft()
            p = self.pending.get(rid)
            if p is None or p.workers:
                continue
            if now >= p.deadline:
                self._expire(rid, p)
            elif now < p.not_before:
                self.waiting.append(rid)  # still backing off
            else:
                self._dispatch(rid)
        if self.leaving:
            self._migrate()

    def _migrate(self) -> None:
        """Abort, keeping their prefixes, the turns on leaving workers that would not finish
        before the deadline; the asker resubmits them to the workers that stay."""
        now = time.time()
        for wid, deadline in self.leaving.items():
            turns = {
                rid: p.sent_at
                for rid, p in self.pending.items()
                if wid in p.workers
                and not p.migrating
                and not (p.prefilled and wid != p.workers[-1])  # its prefill half is done
            }
            if not turns:
                continue
            k = max(1, self.load.get(wid, 0))
            turn_s = notice.turn_seconds(self.profile, k) if self.profile is not None else 0.0
            for rid in notice.to_migrate(turns=turns, turn_s=turn_s, deadline=deadline, now=now):
                p = self.pending[rid]
                p.migrating = True
                self.migrated += 1
                log.info("migrating %s off worker %d before its reclaim deadline", rid, wid)
                for w in p.workers:
                    self.directory.tell(names.worker_name(w), AbortRequest(rid=p.wire(rid)))

    def done(self, msg: GenerateDone) -> None:
        self.load[msg.worker] = max(0, self.load.get(msg.worker, 0) - 1)
        rid = self.wires.get(msg.rid, msg.rid)
        p = self.pending.get(rid)
        if p is None or msg.rid != p.wire(rid) or not p.workers:
            return  # an attempt given up on, or nothing running
        if msg.worker != p.workers[-1]:
            if msg.worker == p.workers[0] and msg.result is not None:
                p.prefilled = True  # the prefill side: its KV went to the decode worker
            return
        if msg.error and msg.retryable and not msg.refused:
            # Routed again at the next flush (a tick, or a logged change) once its back-off is
            # over, to another worker if one can take it: a worker that just vanished (its
            # server relaunching) gets a moment to come back instead of eating the retries.
            if msg.worker >= 0:
                p.avoid.add(msg.worker)
            self._again(rid, p, msg.error)
            return
        self._finish(rid, p, msg)

    def worker_gone(self, msg: WorkerGone) -> None:
        """Its host is gone: what ran there gets no answer; route it again now, elsewhere."""
        self.gone.add(msg.worker)
        self.load.pop(msg.worker, None)
        why = f"worker {msg.worker} is gone ({msg.reason or 'its host died'})"
        for rid, p in list(self.pending.items()):
            if msg.worker not in p.workers or p.workers == (LINK,):
                continue
            if msg.worker != p.workers[-1] and p.prefilled:
                continue  # only the prefill side went, after its KV had left: decode goes on
            wire = p.wire(rid)
            for w in p.workers:  # the surviving half of a PD pair: its answer is not wanted
                if w != msg.worker:
                    self.directory.tell(names.worker_name(w), AbortRequest(rid=wire))
            self._again(rid, p, why)
        self._flush()

    def _again(self, rid: str, p: Pending, why: str) -> None:
        p.again(why, self.clock())
        self.wires[p.wire(rid)] = rid
        log.info("routing %s again (attempt %d): %s", rid, p.attempt + 1, why)
        self.waiting.append(rid)

    def _expire(self, rid: str, p: Pending) -> None:
        """No worker served it in its time: fail it, transient (try again later)."""
        self.expired += 1
        wait = p.route.wait_s if p.route.wait_s > 0 else self.wait_s
        last = f" (last: {p.why})" if p.why else " (no worker was routable)"
        why = f"no worker served {rid} within {round(wait, 2):g} s{last}"
        log.warning("%s", why)
        self._finish(
            rid,
            p,
            GenerateDone(worker=-1, rid=rid, result=None, error=why, retry_after_s=RETRY_AFTER_S),
        )

    def _finish(self, rid: str, p: Pending, msg: GenerateDone) -> None:
        del self.pending[rid]
        for wire in p.wires(rid):
            self.wires.pop(wire, None)
        if msg.rid != rid:  # whoever asked knows the request by its own rid
            result = msg.result
            if result is not None:
                result = msgspec.structs.replace(result, rid=rid)
            msg = msgspec.structs.replace(msg, rid=rid, result=result)
        self._reply(p.route.reply_to, msg)

    def abort(self, msg: AbortRequest) -> None:
        p = self.pending.get(msg.rid)
        if p is None:
            return
        wire = p.wire(msg.rid)
        for w in p.workers:
            if w == LINK:
                self.link.abort(wire)
            else:
                self.directory.tell(names.worker_name(w), AbortRequest(rid=wire))
        if not p.workers:  # still waiting for a worker: answer now
            self._finish(
                msg.rid,
                p,
                GenerateDone(worker=-1, rid=msg.rid, result=None, error="aborted before it ran"),
            )

    def _reply(self, to: str, msg: GenerateDone) -> None:
        if not self.directory.tell(to, msg):
            log.warning("nobody named %s to hear about %s", to, msg.rid)

    def stats(self, _: Any = None) -> dict[str, Any]:
        return {
            "pending": len(self.pending),
            "waiting": len(self.waiting),
            "load": dict(self.load),
            "migrated": self.migrated,
            "affine": self.affine,
            "expired": self.expired,
        }

    handles = {
        StateChanged: state_changed,
        KvAddress: kv_address,
        Route: route,
        GenerateDone: done,
        AbortRequest: abort,
        LinkChanged: link_changed,
        Flush: flush,
        WorkerGone: worker_gone,
    }


__all__ = [
    "FIRST_BACKOFF_S",
    "LINK",
    "MAX_BACKOFF_S",
    "WAIT_S",
    "KvAddress",
    "LinkChanged",
    "Router",
    "WorkerGone",
]
